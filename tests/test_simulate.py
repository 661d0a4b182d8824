"""The simulator against closed forms, hand-computed timelines and lower bounds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.plan.schema import MemoryEstimate, Plan, StageTiming
from autoplan.schedule import Action, InvalidScheduleError, schedule_order
from autoplan.simulate import (
    pipeline_lower_bound_ms,
    simulate_order,
    simulate_plan,
    uniform_pipeline_ms,
)
from tests.plan_factory import make_plan


def _timings(times: list[tuple[float, float]], send_ms: float = 0.0) -> list[StageTiming]:
    return [
        StageTiming(stage=i, forward_ms=f, backward_ms=b, send_ms=send_ms)
        for i, (f, b) in enumerate(times)
    ]


def _plan(schedule: str, times: list[tuple[float, float]], m: int, v: int = 1, **kw) -> Plan:
    return make_plan(
        [1] * len(times),
        schedule=schedule,  # type: ignore[arg-type]
        num_micro_batches=m,
        virtual_stages_per_rank=v,
        stage_timings=_timings(times, kw.pop("send_ms", 0.0)),
        **kw,
    )


def _with(plan: Plan, *, optimizer_ms: float = 0.0, memory: list[MemoryEstimate] | None = None):
    prediction = plan.prediction.model_copy(
        update={
            "breakdown": plan.prediction.breakdown.model_copy(
                update={"optimizer_ms": optimizer_ms}
            ),
            "memory": memory if memory is not None else plan.prediction.memory,
        }
    )
    return plan.model_copy(update={"prediction": prediction})


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@settings(max_examples=25, deadline=None)
@given(
    pp=st.integers(1, 6),
    extra_micro_batches=st.integers(0, 8),
    forward_ms=st.floats(0.1, 10),
    backward_ms=st.floats(0.1, 20),
)
def test_equal_stages_match_the_closed_form(
    schedule: str, pp: int, extra_micro_batches: int, forward_ms: float, backward_ms: float
) -> None:
    m = pp + extra_micro_batches
    result = simulate_plan(_plan(schedule, [(forward_ms, backward_ms)] * pp, m))
    expected = uniform_pipeline_ms(pp, m, forward_ms, backward_ms)
    assert result.iteration_time_ms == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 2, 9)])
def test_interleaving_divides_the_bubble(pp: int, v: int, m: int) -> None:
    """Same work per rank: v chunks of f/v, b/v. Narayanan et al. (SC'21): the bubble shrinks
    from (p - 1)(f + b) to (p - 1)(f + b) / v when m is a multiple of p."""
    f, b = 3.0, 6.0
    plain = simulate_plan(_plan("1f1b", [(f, b)] * pp, m))
    chunks = [(f / v, b / v)] * (pp * v)
    interleaved = simulate_plan(_plan("interleaved_1f1b", chunks, m, v))
    assert interleaved.iteration_time_ms < plain.iteration_time_ms
    assert interleaved.bubble_fraction < plain.bubble_fraction
    assert interleaved.iteration_time_ms == pytest.approx(m * (f + b) + (pp - 1) * (f + b) / v)


stage_times = st.tuples(st.floats(0.01, 10), st.floats(0.01, 20))


@settings(max_examples=60, deadline=None)
@given(
    schedule=st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]),
    pp=st.integers(1, 4),
    extra_micro_batches=st.integers(0, 5),
    data=st.data(),
    send_ms=st.floats(0, 2),
)
def test_uneven_stages_never_beat_the_lower_bound(
    schedule: str, pp: int, extra_micro_batches: int, data: st.DataObject, send_ms: float
) -> None:
    v = 2 if schedule == "interleaved_1f1b" else 1
    m = pp * (1 + extra_micro_batches)  # a multiple of pp suits every schedule
    times = data.draw(st.lists(stage_times, min_size=pp * v, max_size=pp * v))
    plan = _plan(schedule, times, m, v, send_ms=send_ms)
    result = simulate_plan(plan)
    timings = plan.prediction.stage_timings
    assert result.iteration_time_ms >= pipeline_lower_bound_ms(timings, pp, m) * (1 - 1e-9)
    every_action_in_series = m * sum(f + b for f, b in times) + 2 * m * send_ms * (pp * v - 1)
    assert result.iteration_time_ms <= every_action_in_series * (1 + 1e-9)


def test_slow_first_stage_hides_the_others() -> None:
    """Worked by hand: stage 0 runs 0F0 0F1 0B0 0B1 back to back (4 × 10 ms) and never waits,
    since stage 1 answers each forward within 2 ms. The common 1F1B estimate
    (m - 1) × max + Σ stages says 42 ms; the lower bound is this very 40 ms."""
    plan = _plan("1f1b", [(10, 10), (1, 1)], 2)
    assert simulate_plan(plan).iteration_time_ms == pytest.approx(40.0)
    assert pipeline_lower_bound_ms(plan.prediction.stage_timings, 2, 2) == pytest.approx(40.0)


def test_sends_all_reduce_and_optimizer_by_hand() -> None:
    """pp=2, m=2, f=b=1, send 0.5, dp all-reduce 2, optimizer 0.5. By hand:
    rank 0: 0F0 [0,1] 0F1 [1,2]; sends arrive at 1.5 and 2.5 (one link, in turn).
    rank 1: 1F0 [1.5,2.5] 1B0 [2.5,3.5] 1F1 [3.5,4.5] 1B1 [4.5,5.5]; grads arrive 4 and 6.
    rank 0: 0B0 [4,5] 0B1 [6,7]; DDP all-reduces during the last backward: [6,8];
    optimizer [8,8.5]. Rank 1: 1B1 [4.5,5.5], all-reduce [4.5,6.5], optimizer [6.5,7]."""
    plan = _with(
        _plan("1f1b", [(1, 1), (1, 1)], 2, send_ms=0.5, data_parallel=2, dp_allreduce_ms=2.0),
        optimizer_ms=0.5,
    )
    result = simulate_plan(plan)
    spans = {
        event.name: (event.start_ms, event.end_ms)
        for rank in result.ranks
        for event in rank.events
        if event.track == "compute"
    }
    assert spans["F s1 mb0"] == (1.5, 2.5)
    assert spans["F s1 mb1"] == (3.5, 4.5)
    assert spans["B s0 mb0"] == (4.0, 5.0)
    assert spans["B s0 mb1"] == (6.0, 7.0)
    assert result.pipeline_time_ms == pytest.approx(7.0)
    assert result.iteration_time_ms == pytest.approx(8.5)
    reduces = [
        (e.start_ms, e.end_ms)
        for rank in result.ranks
        for e in rank.events
        if e.name == "dp all-reduce"
    ]
    assert reduces == [(6.0, 8.0), (4.5, 6.5)]
    rank0 = result.ranks[0]
    assert rank0.busy_ms == pytest.approx(4.5)
    assert rank0.idle_ms == pytest.approx(4.0)
    assert rank0.communication_ms == pytest.approx(0.5 + 0.5 + 2.0)


def test_every_action_appears_once() -> None:
    result = simulate_plan(_plan("interleaved_1f1b", [(1, 2)] * 8, 8, 2, send_ms=0.1))
    names = [e.name for rank in result.ranks for e in rank.events if e.track == "compute"]
    expected = [
        Action(s, kind, mb).label for s in range(8) for mb in range(8) for kind in ("F", "B")
    ]
    assert sorted(names) == sorted(expected)
    for rank in result.ranks:
        compute = [e for e in rank.events if e.track == "compute"]
        for before, after in itertools.pairwise(compute):
            assert before.end_ms <= after.start_ms + 1e-12  # one compute action at a time


def _estimate(rank: int, activations_bytes: int) -> MemoryEstimate:
    return MemoryEstimate(
        pipeline_rank=rank,
        gpu_type="cpu",
        weights_bytes=1000,
        gradients_bytes=1000,
        optimizer_bytes=2000,
        activations_bytes=activations_bytes,
        transient_bytes=50,
        total_bytes=4000 + activations_bytes + 50,
        capacity_bytes=10**6,
    )


def test_memory_curve_derived_from_the_plans_activation_total() -> None:
    """1F1B pp=2: rank 0 holds 2 micro-batches at its peak, rank 1 one. The derived
    per-micro-batch size is activations_bytes / peak; the curve peaks at the plan's total."""
    plan = _with(_plan("1f1b", [(1, 2), (1, 2)], 4), memory=[_estimate(0, 600), _estimate(1, 300)])
    result = simulate_plan(plan)
    assert result.activation_bytes_source == "derived"
    for rank in result.ranks:
        assert rank.static_bytes == 4000
        assert rank.peak_bytes == plan.prediction.memory[rank.pipeline_rank].total_bytes
        assert min(point.allocated_bytes for point in rank.memory) == 4000
        assert rank.memory[-1].allocated_bytes == 4000  # everything saved was freed


def test_memory_curve_uses_per_stage_bytes_when_the_plan_has_them() -> None:
    timings = [
        StageTiming(stage=s, forward_ms=1, backward_ms=2, send_ms=0, saved_activation_bytes=100)
        for s in range(2)
    ]
    plan = make_plan([1, 1], schedule="gpipe", num_micro_batches=4, stage_timings=timings)
    plan = _with(plan, memory=[_estimate(0, 0), _estimate(1, 0)])
    result = simulate_plan(plan)
    assert result.activation_bytes_source == "plan"
    # GPipe keeps all 4 micro-batches' activations before the first backward.
    assert [rank.peak_bytes for rank in result.ranks] == [4000 + 400 + 50] * 2


def test_simulating_a_deadlocked_order_fails_clearly() -> None:
    order = [
        [Action.parse(t) for t in ("0F0", "0B0", "0F1", "0B1")],
        [Action.parse(t) for t in ("1F0", "1F1", "1B0", "1B1")],
    ]
    with pytest.raises(InvalidScheduleError, match="deadlocks"):
        simulate_order(order, _timings([(1, 1), (1, 1)]))


def test_simulate_order_needs_a_timing_per_stage() -> None:
    with pytest.raises(InvalidScheduleError, match=r"expected 0\.\.1"):
        simulate_order(schedule_order("1f1b", 2, 2), _timings([(1, 1)]))


def _reduce_spans(plan: Plan) -> list[tuple[float, float]]:
    result = simulate_plan(plan)
    return [
        (event.start_ms, event.end_ms)
        for rank in result.ranks
        for event in rank.events
        if event.name == "dp all-reduce"
    ]


def test_all_reduce_per_rank_from_the_plan_or_scaled_by_gradient_bytes() -> None:
    """Same pipeline as the hand-worked one (last backwards [6,7] and [4.5,5.5])."""
    base = _plan("1f1b", [(1, 1), (1, 1)], 2, send_ms=0.5, data_parallel=2, dp_allreduce_ms=2.0)
    given = base.model_copy(
        update={
            "prediction": base.prediction.model_copy(update={"rank_dp_allreduce_ms": [0.5, 3.0]})
        }
    )
    assert _reduce_spans(given) == [(6.0, 7.0), (4.5, 7.5)]
    small_first = [_estimate(0, 0), _estimate(1, 0).model_copy(update={"gradients_bytes": 4000})]
    scaled = _with(base, memory=small_first)  # rank 0 has 1/4 of rank 1's gradients
    assert _reduce_spans(scaled) == [(6.0, 7.0), (4.5, 6.5)]
    assert any("scaled by each rank's gradient bytes" in n for n in simulate_plan(scaled).notes)
