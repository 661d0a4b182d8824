"""ZeRO-2 and ZeRO-3 (FSDP2 per stage, gradients reduce-scattered every micro-batch) on real
processes (gloo, float64): loss and gradients equal single-process training's within
1e-10 over two AdamW steps (step 1's gradients follow step 0's sharded update), and what each
rank holds of parameters, gradients and optimizer states after a step is what the cost model
predicts (within 10%).

Both executors: the mesh executor (uniform plans) and the groups executor (heterogeneous
plans: stages of different replica counts, tp degrees and unequal shares; names ending in
``_groups`` run uniform plans there too, e.g. FSDP2 with tp inside on its own 2-D mesh).

One launch of 4 processes runs every plan (tests/distributed_driver.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan
from autoplan.profile import profile_model
from autoplan.runtime.report import RunReport, predicted_memory_of_rank
from autoplan.solve import SolveOptions, solve
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, local_cluster, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10
WORLD_SIZE = 4


def _solved(zero_stage: int) -> Plan:
    """The solver's plan for gpt-tiny with ZeRO pinned: its memory prediction is the model's."""
    profile = profile_model("gpt-tiny", seq_len=16, micro_batch_size=1, dtype="fp64")
    options = SolveOptions(pp=2, dp=2, tp=1, zero_stage=zero_stage, space="uniform")
    plan = solve(profile, local_cluster(WORLD_SIZE), 8, options)
    assert {stage.zero_stage for stage in plan.stages} == {zero_stage}
    return plan


def _solved_shares(zero_stage: int) -> Plan:
    """The solver's shares plan on cpu-hetero (2 fast and 2 slow processes, shares 3, 3, 1,
    1) with ZeRO pinned, run by the groups executor: its memory prediction is the model's."""
    profile = profile_model("gpt-tiny", seq_len=16, micro_batch_size=1, dtype="fp64")
    cluster = load_cluster(example_cluster_path("cpu-hetero"))
    plan = solve(profile, cluster, 8, SolveOptions(pp=1, zero_stage=zero_stage))
    assert [stage.zero_stage for stage in plan.stages] == [zero_stage]
    assert len({replica.micro_batch_size for replica in plan.stages[0].replicas}) > 1
    return plan


def _plans() -> dict[str, Plan]:
    return {
        # The groups executor: stage 0 two replicas of 3 and 1 samples (ZeRO-2), stage 1 one
        # replica of tp 2 (nothing to shard).
        "hetero_zero2_shares_3_1": make_stages_plan(
            [3, 3],
            [[ReplicaSpec(1, 3), ReplicaSpec(1, 1)], [ReplicaSpec(2, 4)]],
            schedule="1f1b",
            num_micro_batches=2,
            zero_stage=2,
        ),
        # Stage 0 one replica of tp 2, stage 1 two replicas of 3 and 1 samples (ZeRO-3, the
        # last stage: the head's gradients come from weighted losses), selective recompute.
        "hetero_zero3_shares_3_1": make_stages_plan(
            [2, 4],
            [
                [ReplicaSpec(2, 4)],
                [ReplicaSpec(1, 3, "selective"), ReplicaSpec(1, 1, "selective")],
            ],
            schedule="gpipe",
            num_micro_batches=2,
            zero_stage=3,
        ),
        # A head tied to the embedding across stages: FSDP2 leaves the tied weight whole
        # (stages 0 and 1 shard over 2 replicas each, shares 3+1 and 2+2) and grad_sync
        # sums it over all four holders.
        "hetero_zero3_tied": make_stages_plan(
            [2, 2],
            [[ReplicaSpec(1, 3), ReplicaSpec(1, 1)], [ReplicaSpec(1, 2), ReplicaSpec(1, 2)]],
            model="tests.runtime_models:tied_gpt",
            schedule="1f1b",
            num_micro_batches=2,
            zero_stage=3,
        ),
        # The same tie with the head on one replica of tp 2 (vocabulary 33 split 17 + 16).
        "hetero_zero2_tied_tp2_head": make_stages_plan(
            [2, 2],
            [[ReplicaSpec(1, 3), ReplicaSpec(1, 1)], [ReplicaSpec(2, 4)]],
            model="tests.runtime_models:tied_gpt",
            schedule="1f1b",
            num_micro_batches=2,
            zero_stage=2,
        ),
        # FSDP2 over the stage's dp group with DTensor tp inside, on the groups executor.
        "dp2_tp2_zero3_gpipe_groups": make_plan(
            [6],
            data_parallel=2,
            tensor_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
            replica_micro_batch_sizes=[3, 1],
            zero_stage=3,
        ),
        "solved_shares_zero2_groups": _solved_shares(2),
        "solved_shares_zero3_groups": _solved_shares(3),
        "pp2_dp2_zero2_1f1b": make_plan(
            [3, 3], data_parallel=2, schedule="1f1b", num_micro_batches=4, zero_stage=2
        ),
        # Uneven shares: each replica's loss weight must survive FSDP2's averaging.
        "pp2_dp2_zero3_uneven_shares": make_plan(
            [2, 4],
            data_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
            replica_micro_batch_sizes=[3, 1],
            zero_stage=3,
        ),
        "pp2_dp2_zero3_interleaved_selective": make_plan(
            [1, 2, 2, 1],
            data_parallel=2,
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
            num_micro_batches=2,
            recompute="selective",
            zero_stage=3,
        ),
        # FSDP2 over the dp sub-mesh with DTensor tensor parallelism inside each replica.
        "dp2_tp2_zero3_gpipe": make_plan(
            [6],
            data_parallel=2,
            tensor_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
            zero_stage=3,
        ),
        "solved_zero2": _solved(2),
        "solved_zero3": _solved(3),
    }


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return _plans()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, plans: dict[str, Plan]) -> Path:
    assert {plan.world_size for plan in plans.values()} == {WORLD_SIZE}
    return run_plans(plans, tmp_path_factory.mktemp("runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(_plans()))
def test_zero_training_equals_single_process(runs: Path, plans: dict[str, Plan], name: str) -> None:
    plan = plans[name]
    report = assert_run_equals_reference(plan, runs / name, STEPS, TOLERANCE)
    groups = name.endswith("_groups") or plan.uniform_shape() is None
    assert report.executor == ("groups" if groups else "mesh")


@pytest.mark.parametrize(
    "name",
    ["solved_zero2", "solved_zero3", "solved_shares_zero2_groups", "solved_shares_zero3_groups"],
)
def test_zero_model_states_match_the_prediction(
    runs: Path, plans: dict[str, Plan], name: str
) -> None:
    """Each rank's local shards of parameters, gradients and AdamW states after a step are
    the plan's weights + gradients + optimizer bytes for that rank, within 10%."""
    plan = plans[name]
    report = read_json_model(runs / name / "report.json", RunReport)
    for rank, measured in enumerate(report.model_state_per_rank_bytes):
        estimate = predicted_memory_of_rank(plan, rank)
        assert estimate is not None
        predicted = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
        assert abs(measured - predicted) <= 0.10 * predicted, (rank, measured, predicted)
