"""Sequence parallelism executed (autoplan.runtime.sequence_parallel): real processes
on gloo, float64, equal to single-process training within 1e-10, on uniform plans (the mesh
executor) and heterogeneous ones (the groups executor, a tp-2 stage next to tp-1 ones)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cost.layers import layer_cost
from autoplan.plan.schema import Plan
from autoplan.profile.profiler import profile_model
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans, run_ranks
from tests.single_process_reference import assert_run_equals_reference
from tests.synthetic_profiles import gpu

TOLERANCE = 1e-10

# Every test here reads a launch (the module fixture, or sp_memory_driver's).
pytestmark = pytest.mark.distributed


def _plans() -> dict[str, Plan]:
    """gpt-tiny: 6 layers (embedding, 4 blocks, head), sequence 16."""
    return {
        # world size 2: one stage, the embedding, all blocks and the head under tp 2.
        "sp_tp2": make_plan([6], tensor_parallel=2, num_micro_batches=2, sequence_parallel=True),
        # world size 4
        "sp_pp2_tp2": make_plan(
            [2, 4], tensor_parallel=2, num_micro_batches=2, sequence_parallel=True
        ),
        "sp_pp2_tp2_selective": make_plan(
            [3, 3],
            tensor_parallel=2,
            num_micro_batches=2,
            recompute="selective",
            sequence_parallel=True,
        ),
        "sp_dp2_tp2_full": make_plan(
            [6],
            data_parallel=2,
            tensor_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
            recompute="full",
            sequence_parallel=True,
        ),
        # Heterogeneous: stage 0 on one tp-2 replica, stage 1 on two tp-1 replicas.
        "sp_groups_tp2_to_tp1": make_stages_plan(
            [3, 3],
            [[ReplicaSpec(2, 2)], [ReplicaSpec(1, 1), ReplicaSpec(1, 1)]],
            num_micro_batches=2,
            sequence_parallel=True,
        ),
        # One stage of a tp-1 and a tp-2 replica: the tp-2 replica's norm gradients are
        # partial sums per rank (each saw its tokens), completed before the replicas' sum.
        "sp_groups_mixed_tp_stage": make_stages_plan(
            [3, 3],
            [[ReplicaSpec(1, 1), ReplicaSpec(2, 1)], [ReplicaSpec(1, 2)]],
            num_micro_batches=2,
            sequence_parallel=True,
        ),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_plans(), tmp_path_factory.mktemp("runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(_plans()))
def test_sequence_parallel_training_equals_single_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    assert plan.parallelism.sequence_parallel
    assert_run_equals_reference(plan, runs / name, STEPS, TOLERANCE)


def test_norms_run_sequence_parallel(runs: Path) -> None:
    """The blocks' norm weights are replicated DTensors (SequenceParallel), not plain."""
    stages = json.loads((runs / "sp_pp2_tp2" / "rank0_shards.json").read_text())
    norms = {name: entry for stage in stages for name, entry in stage.items() if "norm" in name}
    assert norms
    block_norms = [entry for name, entry in norms.items() if "block" in name]
    assert block_norms and all("Replicate" in entry["placements"] for entry in block_norms)


def test_saved_activations_under_sp_match_the_cost_model(tmp_path: Path) -> None:
    """gpt-tiny's four blocks on one rank of tp 2, fp32: what a real forward holds (MemTracker)
    is within 10% of the cost model's saved bytes, with and without SP (the re-gather keeps
    the column-split inputs as their sequence shards)."""
    batch, seq = 4, 64
    run_ranks("sp_memory_driver.py", [str(tmp_path), str(batch), str(seq)], 2)
    profile = profile_model("gpt-tiny", seq, batch, "fp32")
    spec = gpu("A", 100.0, 80.0)
    for rank in range(2):
        held = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for key, sp in (("sp", True), ("tp", False)):
            predicted = sum(
                layer_cost(
                    block,
                    spec,
                    100.0,
                    tp=2,
                    micro_batch_size=batch,
                    profile_micro_batch_size=batch,
                    sequence_parallel=sp,
                ).saved_bytes["none"]
                for block in profile.layers[1:-1]
            )
            assert predicted == pytest.approx(held[key], rel=0.10), (key, held[key], predicted)
        assert held["sp"] < held["tp"]
