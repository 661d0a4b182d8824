"""Experts placed by speed, executed: moe-tiny (float64, 4 experts, top 2, a deterministic
seeded router) trained in real processes on gloo with expert groups whose places hold 3 and 1
experts and take 2 and 1 samples of every micro-batch (so their slot buffers differ too: the
exchanges' split sizes are uneven both ways) equals single-process training within 1e-10: ep 2
alone, ep 2 over dp 4 (two expert groups, expert gradients summed across them, ZeRO-1 over the
replicas of one place), and as the search lays out a mixed stage on cpu-hetero's two GPU types
(replicas fast, slow, fast, slow: expert groups of ranks {0, 2} and {1, 3}, one of each type).

Each rank's dump holds its experts (place 0: experts 0-2, place 1: expert 3), compared with
those rows of the single process's gradient; every expert is held and checked somewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.plan.schema import Plan
from autoplan.plan.validate import plan_problems
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

pytestmark = pytest.mark.distributed

TOLERANCE = 1e-10
HELD = (3, 1)


def _placed(plan: Plan) -> Plan:
    """``plan`` with its one stage at ep 2, places holding ``HELD`` experts."""
    (stage,) = plan.stages
    replicas = [
        r.model_copy(update={"routed_experts": HELD[i % 2]}) for i, r in enumerate(stage.replicas)
    ]
    placed = stage.model_copy(update={"expert_parallel_degree": 2, "replicas": replicas})
    return plan.model_copy(update={"stages": [placed]})


def _plans() -> dict[str, Plan]:
    return {
        "ep2_3plus1": _placed(
            make_plan(
                [6],
                model="moe-tiny",
                data_parallel=2,
                replica_micro_batch_sizes=[2, 1],
                num_micro_batches=2,
            )
        ),
        "ep2_types_fast_slow": _placed(
            make_stages_plan(
                [6],
                [[ReplicaSpec(1, 2, node=0), ReplicaSpec(1, 1, node=1)] * 2],
                model="moe-tiny",
                num_micro_batches=2,
                cluster=load_cluster(example_cluster_path("cpu-hetero")),
            )
        ),
        "ep2_dp4_3plus1_zero1": _placed(
            make_plan(
                [6],
                model="moe-tiny",
                data_parallel=4,
                replica_micro_batch_sizes=[2, 1, 2, 1],
                num_micro_batches=2,
                zero1=True,
            )
        ),
    }


def test_the_plans_are_valid() -> None:
    for plan in _plans().values():
        assert [r.routed_experts for r in plan.stages[0].replicas][:2] == list(HELD)
        problems = [p for p in plan_problems(plan, fit=False) if "prediction" not in p]
        assert not [p for p in problems if "expert" in p], problems


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_plans(), tmp_path_factory.mktemp("uneven-ep-runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(_plans()))
def test_experts_by_speed_train_as_one_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    experts_seen: dict[str, set[int]] = {}

    def held_part(rank: int, param_name: str, whole: torch.Tensor) -> torch.Tensor:
        """A rank's expert parameters hold its place's HELD[place] experts, in order."""
        if ".mlp.experts." not in param_name:
            return whole
        place = plan.rank_map[rank].dp_index % 2
        first = sum(HELD[:place])
        experts_seen.setdefault(param_name, set()).update(range(first, first + HELD[place]))
        return whole[first : first + HELD[place]]

    assert_run_equals_reference(
        plan, runs / name, STEPS, TOLERANCE, held_part=held_part, tied_head=True
    )
    assert experts_seen
    assert all(seen == set(range(sum(HELD))) for seen in experts_seen.values())
