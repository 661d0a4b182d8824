"""Activation offload, executed: real processes (gloo, float64) equal single-process
training within 1e-10 on pp × dp × tp plans with offload, without and with (full) recompute,
on the mesh engine and the groups engine; and what the runtime's offload hooks move off the
device per micro-batch equals what the cost model predicts.

One launch (8 processes) runs all the distributed plans.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cost.model import CostModel
from autoplan.cost.offload import mode_key, resident_saved_bytes
from autoplan.plan.schema import Plan
from autoplan.profile import profile_model
from autoplan.runtime.model_stage import pipeline_layers
from autoplan.runtime.offload import OffloadCounter, apply_offload
from autoplan.runtime.recompute import apply_recompute
from autoplan.zoo import get_model_spec
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10


def _plans() -> dict[str, Plan]:
    """pp 2 × dp 2 × tp 2 (8 processes) each; gpt-tiny has 6 layers."""
    return {
        # Mesh engine (torch's pipelining schedule), offload without recompute.
        "offload_pp2_dp2_tp2": make_plan(
            [3, 3], data_parallel=2, tensor_parallel=2, num_micro_batches=2, offload=True
        ),
        # Groups engine, offload with full recompute (the checkpoints' inputs go to host).
        "offload_full_pp2_dp2_tp2_groups": make_plan(
            [2, 4],
            data_parallel=2,
            tensor_parallel=2,
            num_micro_batches=2,
            schedule="gpipe",
            recompute="full",
            offload=True,
        ),
        # Heterogeneous: per replica, offload or not, with and without recompute.
        "offload_mixed_replicas": make_stages_plan(
            [4, 2],
            [
                [ReplicaSpec(2, 1, "none", offload=True), ReplicaSpec(2, 1, "full")],
                [ReplicaSpec(2, 1, "full", offload=True), ReplicaSpec(2, 1, "none")],
            ],
            schedule="1f1b",
            num_micro_batches=2,
        ),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert {plan.world_size for plan in _plans().values()} == {8}
    return run_plans(_plans(), tmp_path_factory.mktemp("runs"))


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(_plans()))
def test_offload_training_equals_single_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    assert_run_equals_reference(plan, runs / name, STEPS, TOLERANCE, tied_head=True)


def _cost_model(batch: int, seq: int) -> CostModel:
    from autoplan.cluster.catalog import gpu_specs

    profile = profile_model("gpt-tiny", seq, batch, "fp64")
    cluster = load_cluster(example_cluster_path("cpu-hetero"))
    return CostModel(profile, cluster, gpu_specs(cluster))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_offload_moves_what_the_cost_model_predicts(recompute: str) -> None:
    """Per micro-batch and block: the bytes the hooks copy to host are within 10% of the cost
    model's saved bytes of that recompute mode; of the device storages copied, what is still
    alive once the forward is done equals the model's device-resident saved bytes (none:
    offload frees them); the gradients are those without offload."""
    batch, seq = 4, 64
    spec = get_model_spec("gpt-tiny")
    ids = spec.example_input(batch, seq)
    target = torch.zeros(batch * seq, dtype=torch.long)
    grads, alive = [], {}
    counters: dict[str, OffloadCounter] = {}
    for offload in (False, True):
        torch.manual_seed(0)
        model = spec.build().double()
        apply_recompute(model, recompute)  # type: ignore[arg-type]
        if offload:
            for name, layer in pipeline_layers(model):
                # One counter per layer, to compare layer by layer.
                counters[name] = OffloadCounter(track_originals=True)
                apply_offload(torch.nn.Sequential(layer), True, counters[name])
        logits = model(ids)
        alive = {name: c.device_bytes_alive() for name, c in counters.items()}
        F.cross_entropy(logits.flatten(0, -2), target).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))

    tables = _cost_model(batch, seq).tables(0, 1, batch)
    names = [name for name, _ in pipeline_layers(model)]
    blocks = [index for index, name in enumerate(names) if "block" in name]
    assert len(blocks) == 4
    mode = mode_key(recompute, True)
    for index in blocks:
        layer, name = tables.layers[index], names[index]
        predicted = layer.saved_bytes[recompute]
        assert predicted > 10_000  # a real figure, not an empty one
        moved = counters[name].packed_bytes
        assert moved == pytest.approx(predicted, rel=0.10), (name, moved, predicted)
        assert alive[name] == resident_saved_bytes(layer, mode) == 0.0, name
    # Weights stay where they are: the hooks kept some (matmuls save their weights).
    assert any(c.kept_bytes > 0 for c in counters.values())
