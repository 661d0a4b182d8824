"""Stages that start or end mid-block (sub-block units) train exactly as one process does.

Real processes on gloo, float64, one launch of 4 processes for all the plans: the
residual stream crosses the stage boundary between a block's attention part and its MLP part;
losses and every gradient equal single-process training (block grain, the whole model) within
1e-10 over two AdamW steps, under the names the whole model gives its parameters.
Plans: pp 2 × tp 2 on the mesh executor; pp 2 × dp 2 with selective recompute of the parts;
interleaved pp 2 × dp 2 with a chunk ending mid-block; pp 3 heterogeneous tp 1 → tp 2 → tp 1
(groups executor, two GPU types); llama-tiny pp 2 with a stage of a tp-1 and a tp-2 replica
(full recompute on the latter) ending after block 0's attention.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.plan.schema import Plan
from autoplan.runtime.model_stage import build_stage_models
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10
R = ReplicaSpec


def sub_block(plan: Plan) -> Plan:
    """The plan with its layer ranges read as sub-block units."""
    model = plan.inputs.model.model_copy(update={"granularity": "sub-block"})
    return plan.model_copy(update={"inputs": plan.inputs.model_copy(update={"model": model})})


def _plans() -> dict[str, Plan]:
    # gpt-tiny / llama-tiny at sub-block grain: embed, block_0:attn, block_0:mlp, ...,
    # block_3:mlp, head (10 units).
    hetero = load_cluster(example_cluster_path("cpu-hetero"))
    return {
        # Stage 0 ends after block 0's attention part.
        "sub_pp2_tp2_mesh": sub_block(make_plan([2, 8], tensor_parallel=2)),
        "sub_pp2_dp2_selective": sub_block(
            make_plan([4, 6], data_parallel=2, recompute="selective", zero1=True)
        ),
        # Chunks [0,3) [3,5) [5,8) [8,10): the third ends after block 3's attention.
        "sub_interleaved_dp2": sub_block(
            make_plan(
                [3, 2, 3, 2],
                data_parallel=2,
                virtual_stages_per_rank=2,
                schedule="interleaved_1f1b",
                num_micro_batches=4,
            )
        ),
        # embed..block_1:attn | block_1:mlp..block_2:mlp | block_3:attn..head; tp 1, 2, 1.
        "sub_pp3_hetero_tp_groups": sub_block(
            make_stages_plan(
                [4, 3, 3],
                [[R(1, 1, node=0)], [R(2, 1, node=1)], [R(1, 1, node=0)]],
                num_micro_batches=4,
                cluster=hetero,
            )
        ),
        "sub_llama_mixed_tp_groups": sub_block(
            make_stages_plan(
                [2, 8],
                [[R(1, 1), R(2, 3, "full")], [R(1, 4)]],
                model="llama-tiny",
                num_micro_batches=2,
            )
        ),
    }


def test_a_cut_block_keeps_only_its_parts_under_the_whole_models_names() -> None:
    plan = _plans()["sub_pp3_hetero_tp_groups"]
    models, _ = build_stage_models(plan, list(plan.stages), seed=0)
    names = [{name for name, _ in model.named_parameters()} for model in models]
    assert "layers.block_1.attn.q.weight" in names[0]
    assert not any(name.startswith("layers.block_1.mlp") for name in names[0])
    assert "layers.block_1.mlp.up.weight" in names[1] and "layers.block_1.mlp_norm.bias" in names[1]
    assert not any(name.startswith(("layers.block_1.attn", "layers.block_3")) for name in names[1])
    assert "layers.block_3.attn.q.weight" in names[2] and "layers.head.norm.weight" in names[2]
    assert not set.intersection(*names)
    from autoplan.runtime.model_stage import build_full_model

    whole = {name for name, _ in build_full_model("gpt-tiny", "fp64", 0).named_parameters()}
    assert set.union(*names) == whole


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plans = _plans()
    assert {plan.world_size for plan in plans.values()} == {4}
    return run_plans(plans, tmp_path_factory.mktemp("runs"), timeout_s=300)


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(_plans()))
def test_mid_block_stages_train_as_one_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    assert_run_equals_reference(plan, runs / name, STEPS, TOLERANCE)
