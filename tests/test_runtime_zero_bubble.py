"""Zero-bubble schedules on real processes (gloo, float64) through PyTorch's own
schedule classes: ZB-H1 (interleaved zero bubble, one stage per rank), ZB1P (two stages per
rank, under full recompute), ZB-V and DualPipeV (stages in a V) each give the loss and
gradients of single-process training within 1e-10; and what a ZB-H1 and a ZB-V step hold
between a micro-batch's F, I and W against the cost model's saved bytes. One launch runs every
plan (all are pp 2, dp 1, so world size 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autoplan.cost.layers import layer_cost
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan, StageTiming
from autoplan.profile.profiler import profile_model
from autoplan.runtime.report import RunReport
from autoplan.schedule import schedule_order
from autoplan.simulate import simulate_plan
from tests.distributed_driver import STEPS
from tests.plan_factory import make_plan
from tests.ranks_of_plans import run_plans
from tests.single_process_reference import reference_training
from tests.synthetic_profiles import gpu

pytestmark = pytest.mark.distributed

TOLERANCE = 1e-10


def zero_bubble_plans(data_parallel: int = 1) -> dict[str, Plan]:
    """Name → plan; gpt-tiny has 6 layers (embed, 4 blocks, head)."""
    common = {"data_parallel": data_parallel}
    return {
        "zbh1_pp2": make_plan(
            [3, 3], schedule="interleaved_zero_bubble", num_micro_batches=4, **common
        ),
        "zb1p_pp2_v2": make_plan(
            [2, 1, 1, 2],
            virtual_stages_per_rank=2,
            schedule="interleaved_zero_bubble",
            num_micro_batches=4,
            recompute="full",
            **common,
        ),
        "zbv_pp2": make_plan(
            [2, 1, 1, 2], virtual_stages_per_rank=2, schedule="zbv", num_micro_batches=3, **common
        ),
        "dualpipev_pp2": make_plan(
            [1, 2, 2, 1],
            virtual_stages_per_rank=2,
            schedule="dualpipev",
            num_micro_batches=6,
            **common,
        ),
    }


def largest_gradient_error(plan: Plan, out_dir: Path) -> tuple[float, float]:
    """(largest loss error, largest gradient error) of a run against single-process training."""
    losses, reference = reference_training(plan, STEPS)
    report = read_json_model(out_dir / "report.json", RunReport)
    assert [record.step for record in report.steps] == list(range(STEPS))
    loss_error = max(abs(r.loss - e) for r, e in zip(report.steps, losses, strict=True))
    grad_error = 0.0
    for step in range(STEPS):
        covered: set[str] = set()
        for rank in range(plan.world_size):
            dumped = torch.load(out_dir / f"rank{rank}_step{step}.pt")
            for name, grad in dumped.items():
                grad_error = max(grad_error, (grad - reference[step][name]).abs().max().item())
                covered.add(name)
        assert covered == set(reference[step]), set(reference[step]) ^ covered
    return loss_error, grad_error


def memory_plans() -> dict[str, Plan]:
    """ZB-H1 and ZB-V again, with what each action holds recorded (distributed_driver)."""
    plans = zero_bubble_plans()
    return {"zbh1_pp2_memory": plans["zbh1_pp2"], "zbv_pp2_memory": plans["zbv_pp2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("runs")
    plans = {**zero_bubble_plans(), **memory_plans()}
    run_plans(plans, out_dir, timeout_s=300)
    return out_dir


@pytest.mark.parametrize("name", list(zero_bubble_plans()))
def test_zero_bubble_training_equals_single_process(runs: Path, name: str) -> None:
    loss_error, grad_error = largest_gradient_error(zero_bubble_plans()[name], runs / name)
    assert loss_error < TOLERANCE
    assert grad_error < TOLERANCE


def predicted_saved_bytes(plan: Plan) -> list[float]:
    """The cost model's saved activations of one micro-batch, per stage (no recompute)."""
    inputs = plan.inputs
    profile = profile_model(
        inputs.model.name, inputs.seq_len, plan.parallelism.micro_batch_size, inputs.dtype
    )
    spec = gpu("A", 100.0, 80.0)
    mbs = plan.parallelism.micro_batch_size
    return [
        sum(
            layer_cost(
                layer, spec, 100.0, tp=1, micro_batch_size=mbs, profile_micro_batch_size=mbs
            ).saved_bytes["none"]
            for layer in profile.layers[stage.layer_start : stage.layer_end]
        )
        for stage in plan.stages
    ]


@pytest.mark.parametrize("name", list(memory_plans()))
def test_split_backward_holds_a_micro_batch_from_its_forward_to_its_w(
    runs: Path, name: str
) -> None:
    """On the real run (tests/split_backward_memory.py, last step): every rank runs its
    schedule's action list; a micro-batch's forward allocates the cost model's saved bytes of
    its stage (within 10%); its I frees none of them and its W frees them (within 10%) —
    what autoplan's memory model and the simulator's curve assume. Not compared: a stage's
    first forward of a step (it also allocates per-step buffers that outlive the step) and the
    last stage's W (the schedule keeps each micro-batch's logits to the step's end)."""
    plan = memory_plans()[name]
    par = plan.parallelism
    predicted = predicted_saved_bytes(plan)
    order = schedule_order(
        par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
    )
    last = par.num_stages - 1
    for rank in range(plan.world_size):
        steps = json.loads((runs / name / f"rank{rank}_memory.json").read_text())
        assert len(steps) == STEPS
        actions = steps[-1]
        assert [f"{s}{kind}{mb}" for kind, s, mb, _, _ in actions] == [
            str(action) for action in order[rank]
        ]
        for kind, stage, micro_batch, before, after in actions:
            if kind == "F" and micro_batch > 0:
                assert after - before == pytest.approx(predicted[stage], rel=0.10)
            elif kind == "I":
                assert after == before
            elif kind == "W" and stage != last:
                assert before - after == pytest.approx(predicted[stage], rel=0.10)


@pytest.mark.parametrize("name", list(memory_plans()))
def test_simulated_peak_of_saved_activations_matches_the_run(runs: Path, name: str) -> None:
    """Per rank, the most saved activations held at once: measured, each micro-batch of a
    stage holding from its F to its W what that W freed on the run; predicted, the
    simulator's memory curve of the plan with the cost model's saved bytes per stage. Within
    10% (the measured side leaves out what the schedule keeps past W: stage outputs, logits)."""
    plan = memory_plans()[name]
    timings = [
        StageTiming(
            stage=s,
            forward_ms=1.0,
            backward_ms=2.0,
            weight_gradient_ms=1.0,
            send_ms=0.0,
            saved_activation_bytes=round(saved),
        )
        for s, saved in enumerate(predicted_saved_bytes(plan))
    ]
    prediction = plan.prediction.model_copy(update={"stage_timings": timings})
    simulated = simulate_plan(plan.model_copy(update={"prediction": prediction}))
    for rank in range(plan.world_size):
        steps = json.loads((runs / name / f"rank{rank}_memory.json").read_text())
        actions = steps[-1]
        freed = {(s, mb): before - after for kind, s, mb, before, after in actions if kind == "W"}
        held = peak = 0
        for kind, stage, micro_batch, _, _ in actions:
            if kind == "F":
                held += freed[(stage, micro_batch)]
                peak = max(peak, held)
            elif kind == "W":
                held -= freed[(stage, micro_batch)]
        (replica,) = simulated.ranks[rank].replicas
        transient = plan.prediction.memory[rank].transient_bytes
        predicted_peak = replica.peak_bytes - replica.static_bytes - transient
        assert peak == pytest.approx(predicted_peak, rel=0.10), (rank, peak, predicted_peak)
