"""Sequence parallelism on some stages only (``Stage.sequence_parallel``), executed: real
processes on gloo, float64, equal to single-process training within 1e-10. Two
pipeline stages of one tp-2 replica each (4 ranks), SP on one stage only, on the mesh executor
and on the groups executor; the plans are emitted from configurations with a per-stage flag,
as solve emits its plans. One launch: both plans have world size 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.plan.validate import plan_problems
from autoplan.profile.profiler import profile_model
from autoplan.solve.emit import emit_plan
from tests.distributed_driver import STEPS
from tests.plan_factory import local_cluster
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

TOLERANCE = 1e-10

pytestmark = pytest.mark.distributed

# (first stage runs SP, executor): the name's '_groups' suffix also makes the driver pick it.
CASES = {"sp_first_stage_mesh": (True, "mesh"), "sp_second_stage_groups": (False, "groups")}


def _plans() -> dict[str, Plan]:
    """gpt-tiny (embedding, 4 blocks, head; sequence 16): layers 0-2 and 3-5 on one tp-2
    replica each, SP on the first stage or on the second only."""
    profile = profile_model("gpt-tiny", 16, 2, "fp64")
    cluster = local_cluster(4)
    model = CostModel(profile, cluster, gpu_specs(cluster))
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256="test",
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=cluster,
        global_batch_size=4,
        strategy="given",
    )
    group = (ReplicaGroup(0, 2, 1, 2, "none"),)
    plans = {}
    for name, (first, executor) in CASES.items():
        stages = (
            StageChoice(0, 3, group, sequence_parallel=first),
            StageChoice(3, 6, group, sequence_parallel=not first),
        )
        config = PlanConfig(2, "1f1b", 1, stages, executor=executor)
        plans[name] = emit_plan(model, config, model.evaluate(config), inputs, [])
    return plans


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_plans(), tmp_path_factory.mktemp("runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(CASES))
def test_sp_on_one_stage_trains_as_one_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    first, executor = CASES[name]
    # The plan says SP per stage (not plan-wide), on the executor asked for.
    assert not plan.parallelism.sequence_parallel
    assert [s.sequence_parallel for s in plan.stages] == [first, not first]
    assert plan.parallelism.executor == executor and plan_problems(plan) == []
    assert_run_equals_reference(plan, runs / name, STEPS, TOLERANCE)


@pytest.mark.parametrize("name", list(CASES))
def test_only_the_flagged_stage_runs_sequence_parallel(runs: Path, name: str) -> None:
    """A block norm is a replicated DTensor (SequenceParallel) on the stage that runs SP, a
    plain tensor on the other (tensor parallelism alone leaves norms whole)."""
    plan = _plans()[name]
    for stage in plan.stages:
        rank = stage.replicas[0].ranks[0]
        layouts = json.loads((runs / name / f"rank{rank}_shards.json").read_text())
        norms = [
            entry["placements"]
            for layout in layouts
            for param, entry in layout.items()
            if "norm" in param and "block" in param
        ]
        assert norms, f"stage {stage.index} has no block norm"
        if stage.sequence_parallel:
            assert all("Replicate" in placement for placement in norms), norms
        else:
            assert all(placement == "plain" for placement in norms), norms
