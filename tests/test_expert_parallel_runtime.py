"""Expert parallelism executed: moe-tiny (float64, a dense first block, then MoE blocks of
4 experts, top 2, a shared expert) trained in real processes on gloo with its experts split over
ep ranks equals single-process training within 1e-10, for ep 2 alone, ep 2 with two expert
groups (dp 4: expert gradients summed across groups; and with ZeRO-1 over the replicas of one
expert index), ep 2 × tp 2, ep 2 × pp 2 with full recompute (the recomputed forward exchanges
its tokens again inside the backward), ep 2 × pp 2 interleaved, and two stages of different ep
(2, then 1).

moe-tiny's capacity factor leaves every expert a slot for every token, so no pick drops
however the batch is split; its router is the model's own, seeded: deterministic. Each rank's
dump holds its expert block (experts [i·E/ep, (i+1)·E/ep) at expert index i), compared with
those rows of the single process's gradient.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoplan.plan.schema import Plan
from tests.distributed_driver import STEPS
from tests.plan_factory import make_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import assert_run_equals_reference

pytestmark = pytest.mark.distributed

TOLERANCE = 1e-10
EXPERTS = 4


def _with_ep(plan: Plan, ep: int, *later: int) -> Plan:
    """``plan`` with its stages at ep ``ep``, or at ``ep, *later`` stage by stage."""
    degrees = [ep, *later] if later else [ep] * len(plan.stages)
    return plan.model_copy(
        update={
            "stages": [
                stage.model_copy(update={"expert_parallel_degree": degree})
                for stage, degree in zip(plan.stages, degrees, strict=True)
            ]
        }
    )


def _plans() -> dict[str, Plan]:
    return {
        "ep2": _with_ep(make_plan([6], model="moe-tiny", data_parallel=2, num_micro_batches=2), 2),
        "ep2_dp4": _with_ep(
            make_plan([6], model="moe-tiny", data_parallel=4, num_micro_batches=2), 2
        ),
        # ZeRO-1 over the replicas of one expert index (MasterWeightAdamW's sharded states).
        "ep2_dp4_zero1": _with_ep(
            make_plan([6], model="moe-tiny", data_parallel=4, num_micro_batches=2, zero1=True), 2
        ),
        # Experts whole on each tp rank (router and shared-expert gate replicated too).
        "ep2_tp2": _with_ep(
            make_plan(
                [6], model="moe-tiny", data_parallel=2, tensor_parallel=2, num_micro_batches=2
            ),
            2,
        ),
        # Interleaved 1F1B: two stages per pipeline rank, each exchanging on the rank's groups.
        "ep2_pp2_interleaved": _with_ep(
            make_plan(
                [1, 2, 2, 1],
                model="moe-tiny",
                data_parallel=2,
                virtual_stages_per_rank=2,
                schedule="interleaved_1f1b",
                num_micro_batches=4,
            ),
            2,
        ),
        # Each stage its own ep (autoplan.solve.stage_degrees): ep 2 on the first, none on
        # the second, whose replicas each hold all 4 experts.
        "ep2_then_ep1_pp2": _with_ep(
            make_plan([3, 3], model="moe-tiny", data_parallel=2, num_micro_batches=4), 2, 1
        ),
        "ep2_pp2_full": _with_ep(
            make_plan(
                [3, 3], model="moe-tiny", data_parallel=2, num_micro_batches=4, recompute="full"
            ),
            2,
        ),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_plans(), tmp_path_factory.mktemp("ep-runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(_plans()))
def test_expert_parallel_training_equals_single_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    experts_seen: dict[str, set[int]] = {}
    degree_of: dict[str, int] = {}  # the ep of the stage holding each expert parameter

    def held_part(rank: int, param_name: str, whole: torch.Tensor) -> torch.Tensor:
        """A rank's expert parameters hold the rows of its dp index's experts."""
        if ".mlp.experts." not in param_name:
            return whole
        entry = plan.rank_map[rank]
        ep = plan.stages_of_rank(entry.pipeline_rank)[0].expert_parallel_degree
        index, block = entry.dp_index % ep, EXPERTS // ep
        experts_seen.setdefault(param_name, set()).add(index)
        degree_of[param_name] = ep
        return whole[index * block : (index + 1) * block]

    assert_run_equals_reference(
        plan, runs / name, STEPS, TOLERANCE, held_part=held_part, tied_head=True
    )
    # Every expert block of every MoE layer is held (and checked) somewhere.
    assert experts_seen
    assert all(seen == set(range(degree_of[n])) for n, seen in experts_seen.items())
