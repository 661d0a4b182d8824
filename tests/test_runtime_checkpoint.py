"""Checkpoints reshard across plans: real processes (gloo, float64, one launch of 4)
train gpt-tiny on a token file for 2 steps under one plan, save, and go on under three
others, each resuming from the checkpoint the one before saved (DCP): pipeline × tensor
parallel (mesh executor) → uneven dp between stages with tp 2 on the last (groups executor)
→ dp 4 with ZeRO-1 → pp 4 → dp 2 × tp 2 (FSDP2 with DTensor tp). The 10 losses equal 10
uninterrupted single-process steps on the same data within 1e-10, which they could not if any
weight, Adam moment or step count, or the data position, were lost or misplaced on the way.

A second chain in the same launch does the same for moe-tiny's routed experts, held in blocks of
rows by expert parallelism and saved one key per expert: ep 2 with two expert groups (dp 4) →
ep 1 (every rank all experts) → ep 2 × pp 2 (groups executor throughout)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.checkpoint import INFO_NAME, CheckpointInfo
from autoplan.runtime.report import RunReport
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_ranks
from tests.single_process_reference import reference_training
from tests.test_runtime_data_checkpoint import full_batches

pytestmark = pytest.mark.distributed

TOLERANCE = 1e-10

# name -> (plan, steps done at its end, save every): global batch 4 everywhere.
RUNS = {
    "pp2_tp2": (make_plan([3, 3], tensor_parallel=2, num_micro_batches=2), 2, 2),
    "uneven_groups": (
        make_stages_plan(
            [2, 4],
            [[ReplicaSpec(share=1), ReplicaSpec(share=1)], [ReplicaSpec(tp=2, share=2)]],
            num_micro_batches=2,
        ),
        4,
        None,
    ),
    "dp4_zero1": (
        make_plan([6], data_parallel=4, micro_batch_size=1, num_micro_batches=1, zero1=True),
        6,
        None,
    ),
    "pp4": (make_plan([1, 2, 2, 1], micro_batch_size=1, num_micro_batches=4), 8, None),
    # dp 2 × tp 2: FSDP2 over dp with DTensor tp inside (2-D sharded weights and states).
    "dp2_tp2_fsdp": (
        make_plan([6], data_parallel=2, tensor_parallel=2, micro_batch_size=1, num_micro_batches=2),
        10,
        None,
    ),
}


def _with_ep(plan: Plan, ep: int) -> Plan:
    stages = [stage.model_copy(update={"expert_parallel_degree": ep}) for stage in plan.stages]
    return plan.model_copy(update={"stages": stages})


# moe-tiny (4 experts a layer) under expert parallelism; global batch 4.
MOE_RUNS = {
    "ep2_dp4": (
        _with_ep(
            make_plan(
                [6], model="moe-tiny", data_parallel=4, micro_batch_size=1, num_micro_batches=1
            ),
            2,
        ),
        2,
        2,
    ),
    "ep1_dp4": (
        make_plan([6], model="moe-tiny", data_parallel=4, micro_batch_size=1, num_micro_batches=1),
        4,
        None,
    ),
    "ep2_pp2": (
        _with_ep(
            make_plan(
                [3, 3], model="moe-tiny", data_parallel=2, micro_batch_size=1, num_micro_batches=2
            ),
            2,
        ),
        6,
        None,
    ),
}


def _write_chain(out: Path, chain: str, runs: dict[str, tuple[Plan, int, int | None]]) -> Path:
    listed = []
    for name, (plan, steps, save_every) in runs.items():
        write_json_model(out / f"{name}.plan.json", plan)
        listed.append(
            {
                "name": name,
                "plan": str(out / f"{name}.plan.json"),
                "steps": steps,
                "save_every": save_every,
            }
        )
    path = out / f"{chain}.json"
    path.write_text(json.dumps({"data": str(out / "tokens.npy"), "runs": listed}))
    return path


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("checkpoint_chains")
    tokens = np.random.default_rng(11).integers(0, 128, 4000).astype(np.uint16)
    np.save(out / "tokens.npy", tokens)
    chains = [_write_chain(out, "dense", RUNS), _write_chain(out, "moe", MOE_RUNS)]
    run_ranks("checkpoint_driver.py", [str(out), *map(str, chains)], 4, timeout_s=500)
    return out


@pytest.fixture(scope="module")
def chain(launch: Path) -> Path:
    return launch / "dense"


def test_the_plans_differ_as_intended() -> None:
    plans = [plan for plan, _, _ in RUNS.values()]
    assert all(plan.world_size == 4 for plan in plans)
    assert len({plan.inputs.global_batch_size for plan in plans}) == 1
    assert [plan.uniform_shape() is None for plan in plans] == [False, True, False, False, False]
    assert [plan.parallelism.pipeline_degree for plan in plans] == [2, 2, 1, 4, 1]


def test_resumed_runs_under_other_plans_equal_an_uninterrupted_run(chain: Path) -> None:
    reports = [read_json_model(chain / f"{name}.json", RunReport) for name in RUNS]
    steps = [record for report in reports for record in report.steps]
    assert [record.step for record in steps] == list(range(10))
    assert [report.executor for report in reports] == ["mesh", "groups", "mesh", "mesh", "mesh"]
    plan = RUNS["pp2_tp2"][0]
    batches = full_batches(plan, chain.parent / "tokens.npy")
    expected, _ = reference_training(plan, 10, batches=batches)
    errors = [abs(record.loss - loss) for record, loss in zip(steps, expected, strict=True)]
    assert max(errors) < TOLERANCE, errors


def test_each_run_left_complete_checkpoints_of_its_plan(chain: Path) -> None:
    folder = chain / "checkpoints"
    assert sorted(path.name for path in folder.iterdir()) == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
        "step-00000008",
        "step-00000010",
    ]
    infos = [read_json_model(path / INFO_NAME, CheckpointInfo) for path in sorted(folder.iterdir())]
    assert [info.step for info in infos] == [2, 4, 6, 8, 10]
    summaries = [info.plan_summary for info in infos]
    assert len(set(summaries)) == 5 and "tp=2" in summaries[0] and "pp=4" in summaries[3]


def test_expert_parallel_runs_resume_across_expert_layouts(launch: Path) -> None:
    reports = [read_json_model(launch / "moe" / f"{name}.json", RunReport) for name in MOE_RUNS]
    steps = [record for report in reports for record in report.steps]
    assert [record.step for record in steps] == list(range(6))
    plan = MOE_RUNS["ep1_dp4"][0]
    batches = full_batches(plan, launch / "tokens.npy")
    expected, _ = reference_training(plan, 6, batches=batches)
    errors = [abs(record.loss - loss) for record, loss in zip(steps, expected, strict=True)]
    assert max(errors) < TOLERANCE, errors
    assert [p.stages[0].expert_parallel_degree for p, _, _ in MOE_RUNS.values()] == [2, 1, 2]
