"""The simulator against closed forms, hand-computed timelines and lower bounds, on uniform
plans (one timeline per rank, as before schema 2) and on plans whose replicas differ."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.errors import InputError
from autoplan.plan.schema import MemoryEstimate, Plan, ReplicaTiming, StageTiming
from autoplan.schedule import Action, InvalidScheduleError, schedule_order
from autoplan.simulate import (
    SimulationResult,
    pipeline_lower_bound_ms,
    regroup_pairs,
    replica_lower_bound_ms,
    simulate_order,
    simulate_plan,
    uniform_pipeline_ms,
)
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan


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
    # In series: every pass, and every transfer twice (a blocking transfer holds its sender,
    # then its receiver spends it before computing: autoplan.cost.schedule's rule).
    every_action_in_series = m * sum(f + b for f, b in times) + 4 * m * send_ms * (pp * v - 1)
    assert result.iteration_time_ms <= every_action_in_series * (1 + 1e-9)


def test_slow_first_stage_hides_the_others() -> None:
    """Worked by hand: stage 0 runs 0F0 0F1 0B0 0B1 back to back (4 × 10 ms) and never waits,
    since stage 1 answers each forward within 2 ms. The common 1F1B estimate
    (m - 1) × max + Σ stages says 42 ms; the lower bound is this very 40 ms."""
    plan = _plan("1f1b", [(10, 10), (1, 1)], 2)
    assert simulate_plan(plan).iteration_time_ms == pytest.approx(40.0)
    assert pipeline_lower_bound_ms(plan.prediction.stage_timings, 2, 2) == pytest.approx(40.0)


def test_sends_all_reduce_and_optimizer_by_hand() -> None:
    """pp=2, m=2, f=b=1, send 0.5, dp all-reduce 2, optimizer 0.5; blocking transfers. By hand:
    rank 0: 0F0 [0,1] send [1,1.5]; 0F1 [1.5,2.5] send [2.5,3].
    rank 1: receive [1.5,2] 1F0 [2,3]; 1B0 [3,4] send [4,4.5]; receive [4.5,5] 1F1 [5,6];
    1B1 [6,7] send [7,7.5].
    rank 0: receive [4.5,5] 0B0 [5,6]; receive [7.5,8] 0B1 [8,9]. DDP all-reduces during the
    last backward: rank 0 [8,10], optimizer [10,10.5]; rank 1 [6,8], optimizer [8,8.5]. The
    closed form agrees: a_s = 2 + 2 × 0.5 = 3, (m - 1) × 3 + 6 = 9, + (2 - 1) + 0.5."""
    plan = _with(
        _plan("1f1b", [(1, 1), (1, 1)], 2, send_ms=0.5, data_parallel=2, dp_allreduce_ms=2.0),
        optimizer_ms=0.5,
    )
    result = simulate_plan(plan)
    spans = {
        event.name: (event.start_ms, event.end_ms)
        for replica in result.replicas
        for event in replica.events
        if event.track == "compute"
    }
    assert spans["F s1 mb0"] == (2.0, 3.0)
    assert spans["F s1 mb1"] == (5.0, 6.0)
    assert spans["B s0 mb0"] == (5.0, 6.0)
    assert spans["B s0 mb1"] == (8.0, 9.0)
    assert result.pipeline_time_ms == pytest.approx(9.0)
    assert result.iteration_time_ms == pytest.approx(10.5)
    reduces = [
        (e.start_ms, e.end_ms)
        for rank in result.ranks
        for e in rank.replicas[0].events
        if e.name == "dp all-reduce"
    ]
    assert reduces == [(8.0, 10.0), (6.0, 8.0)]
    rank0 = result.ranks[0].replicas[0]
    spans_of = [[(e.category, e.start_ms, e.end_ms) for e in r.events] for r in result.replicas]
    assert spans_of[0] == spans_of[1] and spans_of[2] == spans_of[3]  # equal replicas, equal lives
    assert rank0.busy_ms == pytest.approx(4.5)
    assert rank0.idle_ms == pytest.approx(6.0)
    # Two activations sent, two gradients received (each blocking, 0.5 ms), the all-reduce.
    assert rank0.communication_ms == pytest.approx(0.5 + 0.5 + 0.5 + 0.5 + 2.0)


def test_a_megatron_deepspeed_plan_reduces_after_the_last_backward_by_hand() -> None:
    """The case above priced for Megatron-DeepSpeed (``inputs.engine``): its all-reduce starts
    when the last backward ends. Rank 0: 0B1 ends at 9, all-reduce [9, 11], optimizer
    [11, 11.5]; rank 1: 1B1 ends at 7, all-reduce [7, 9]."""
    plan = _with(
        _plan("1f1b", [(1, 1), (1, 1)], 2, send_ms=0.5, data_parallel=2, dp_allreduce_ms=2.0),
        optimizer_ms=0.5,
    )
    inputs = plan.inputs.model_copy(update={"engine": "megatron-deepspeed"})
    result = simulate_plan(plan.model_copy(update={"inputs": inputs}))
    reduces = [
        (e.start_ms, e.end_ms)
        for rank in result.ranks
        for e in rank.replicas[0].events
        if e.name == "dp all-reduce"
    ]
    assert reduces == [(9.0, 11.0), (7.0, 9.0)]
    assert result.iteration_time_ms == pytest.approx(11.5)


def test_every_action_appears_once() -> None:
    result = simulate_plan(_plan("interleaved_1f1b", [(1, 2)] * 8, 8, 2, send_ms=0.1))
    names = [e.name for r in result.replicas for e in r.events if e.track == "compute"]
    expected = [
        Action(s, kind, mb).label for s in range(8) for mb in range(8) for kind in ("F", "B")
    ]
    assert sorted(names) == sorted(expected)
    for replica in result.replicas:
        compute = [e for e in replica.events if e.track == "compute"]
        for before, after in itertools.pairwise(compute):
            assert before.end_ms <= after.start_ms + 1e-12  # one compute action at a time


def _estimate(rank: int, activations_bytes: int, *, share: int = 2) -> MemoryEstimate:
    return MemoryEstimate(
        pipeline_rank=rank,
        gpu_type="cpu",
        micro_batch_size=share,
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
    for replica in result.replicas:
        assert replica.static_bytes == 4000
        assert replica.peak_bytes == plan.prediction.memory[replica.pipeline_rank].total_bytes
        assert min(point.allocated_bytes for point in replica.memory) == 4000
        assert replica.memory[-1].allocated_bytes == 4000  # everything saved was freed


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
        for event in rank.replicas[0].events
        if event.name == "dp all-reduce"
    ]


def test_all_reduce_per_rank_from_the_plan_or_scaled_by_gradient_bytes() -> None:
    """Same pipeline as the hand-worked one (last backwards [8,9] and [6,7])."""
    base = _plan("1f1b", [(1, 1), (1, 1)], 2, send_ms=0.5, data_parallel=2, dp_allreduce_ms=2.0)
    given = base.model_copy(
        update={
            "prediction": base.prediction.model_copy(update={"rank_dp_allreduce_ms": [0.5, 3.0]})
        }
    )
    assert _reduce_spans(given) == [(8.0, 9.0), (6.0, 9.0)]
    small_first = [_estimate(0, 0), _estimate(1, 0).model_copy(update={"gradients_bytes": 4000})]
    scaled = _with(base, memory=small_first)  # rank 0 has 1/4 of rank 1's gradients
    assert _reduce_spans(scaled) == [(8.0, 9.0), (6.0, 8.0)]
    assert any("scaled by each rank's gradient bytes" in n for n in simulate_plan(scaled).notes)


# ---- replicas that differ ---------------------------------------------------------------------


def _spans(result: SimulationResult, rank: int, replica: int) -> dict[str, tuple[float, float]]:
    events = result.ranks[rank].replicas[replica].events
    return {e.name: (e.start_ms, e.end_ms) for e in events}


def test_regroup_pairs_follow_sample_indices() -> None:
    pairs = regroup_pairs([3, 1], [2, 2])
    assert [(p.source, p.target, p.samples, p.fraction) for p in pairs] == [
        (0, 0, 2, 1.0),
        (0, 1, 1, 0.5),
        (1, 1, 1, 0.5),
    ]
    # Equal shares: every replica sends to its namesake alone, each pair the whole send_ms.
    assert [(p.source, p.target, p.fraction) for p in regroup_pairs([2, 2], [2, 2])] == [
        (0, 0, 1.0),
        (1, 1, 1.0),
    ]
    with pytest.raises(ValueError, match="not the same micro-batch"):
        regroup_pairs([2, 2], [3])


def _replica_plan(
    shares: list[list[int]],
    times: list[list[tuple[float, float]]],
    *,
    m: int,
    send_ms: float = 0.0,
    schedule: str = "1f1b",
    v: int = 1,
    optimizer_ms: float = 0.0,
    dp_allreduce_ms: float = 0.0,
) -> Plan:
    """Stage s on rank s % pp, whose replicas take ``shares[s % pp]``; ``times[s][d]`` is
    (forward, backward) of replica d of stage s."""
    timings = [
        StageTiming(
            stage=s,
            forward_ms=max(f for f, _ in stage),
            backward_ms=max(b for _, b in stage),
            send_ms=send_ms,
            replicas=[
                ReplicaTiming(forward_ms=f, backward_ms=b, saved_activation_bytes=0)
                for f, b in stage
            ],
        )
        for s, stage in enumerate(times)
    ]
    plan = make_stages_plan(
        [1] * len(times),
        [[ReplicaSpec(share=share) for share in rank] for rank in shares],
        schedule=schedule,  # type: ignore[arg-type]
        virtual_stages_per_rank=v,
        num_micro_batches=m,
        stage_timings=timings,
        dp_allreduce_ms=dp_allreduce_ms,
    )
    return _with(plan, optimizer_ms=optimizer_ms)


def test_slow_replicas_gate_only_the_receivers_that_need_their_samples() -> None:
    """Worked by hand. Stage 0: replicas of 3 and 1 samples, forward 1 and 5 ms; stage 1: two
    replicas of 2 samples; backward 1 ms everywhere, send_ms 1 for the 2-sample pair; blocking
    transfers (a receiver first spends its longest incoming transfer).
    s0 r0 F [0,1] sends 2 samples to s1 r0 [1,2] and 1 to s1 r1 [1,1.5]; s0 r1 F [0,5] sends
    1 sample to s1 r1 [5,5.5]. s1 r0 receives [2,3], F [3,4] B [4,5], gradient back [5,6].
    s1 r1 waits for the slow replica: receives [5.5,6], F [6,7] B [7,8], gradients to s0 r0
    and r1 [8,8.5] each. Both s0 replicas need s1 r1's gradient: s0 r0 receives for its
    longest transfer (1) [8.5,9.5], B [9.5,10.5]; s0 r1 [8.5,9], B [9,10]. (GPipe: 1F1B needs
    m >= pp.)"""
    plan = _replica_plan(
        [[3, 1], [2, 2]], [[(1, 1), (5, 1)], [(1, 1), (1, 1)]], m=1, send_ms=1, schedule="gpipe"
    )
    result = simulate_plan(plan)
    assert _spans(result, 1, 0)["F s1 mb0"] == (3.0, 4.0)  # not gated by the slow replica
    assert _spans(result, 1, 1)["F s1 mb0"] == (6.0, 7.0)  # gated by it
    assert _spans(result, 0, 0)["send act s0→s1 mb0 r0→r0"] == (1.0, 2.0)
    assert _spans(result, 0, 0)["send act s0→s1 mb0 r0→r1"] == (1.0, 1.5)
    assert _spans(result, 1, 1)["send grad s1→s0 mb0 r1→r0"] == (8.0, 8.5)
    assert _spans(result, 0, 0)["B s0 mb0"] == (9.5, 10.5)
    assert _spans(result, 0, 1)["B s0 mb0"] == (9.0, 10.0)
    assert result.pipeline_time_ms == pytest.approx(10.5)
    sends = [e for e in result.ranks[0].replicas[0].events if e.name.startswith("send")]
    assert [(e.peer_rank, e.peer_replica, e.samples) for e in sends] == [(1, 0, 2), (1, 1, 1)]


def test_the_slowest_replica_of_a_stage_gates_the_next_stage() -> None:
    """Stage 0 has a fast and a slow replica, stage 1 one replica taking every sample: each
    forward of stage 1 waits for the slow replica, so the pipeline is as slow as a stage of
    slow replicas only."""
    fast_and_slow = _replica_plan([[1, 1], [2]], [[(1, 1), (3, 3)], [(1, 1)]], m=4, send_ms=0.5)
    slow_only = _replica_plan([[1, 1], [2]], [[(3, 3), (3, 3)], [(1, 1)]], m=4, send_ms=0.5)
    gated = simulate_plan(fast_and_slow)
    assert gated.pipeline_time_ms == pytest.approx(simulate_plan(slow_only).pipeline_time_ms)
    starts = [_spans(gated, 1, 0)[f"F s1 mb{i}"][0] for i in range(2)]
    slow_ends = [_spans(gated, 0, 1)[f"F s0 mb{i}"][1] for i in range(2)]
    # The slow replica's send (0.5), then stage 1's blocking receive of it (0.5).
    assert starts == [end + 0.5 + 0.5 for end in slow_ends]


def test_uniform_replicas_match_one_replica_per_rank_exactly() -> None:
    """dp 3 of equal shares is the one-replica pipeline three times over."""
    times = [(1.0, 2.0), (1.5, 2.5), (0.5, 1.0)]
    one = simulate_plan(_plan("1f1b", times, 6, send_ms=0.3))
    three = simulate_plan(_plan("1f1b", times, 6, send_ms=0.3, data_parallel=3))
    assert three.iteration_time_ms == one.iteration_time_ms
    for rank_one, rank_three in zip(one.ranks, three.ranks, strict=True):
        spans = [(e.start_ms, e.end_ms) for e in rank_one.replicas[0].events]
        for replica in rank_three.replicas:
            assert [(e.start_ms, e.end_ms) for e in replica.events] == spans


def test_all_reduce_waits_for_every_replica() -> None:
    """pp = 1, two replicas (1 + 1 ms and 2 + 2 ms per micro-batch), m = 2: last backwards
    [3,4] and [6,8]. The all-reduce starts when the slow one starts its last backward (6) and
    ends no earlier than its end (8); then both step their optimizers."""
    for reduce_ms, end in ((3.0, 9.0), (1.0, 8.0)):
        plan = _replica_plan(
            [[1, 1]], [[(1, 1), (2, 2)]], m=2, optimizer_ms=0.5, dp_allreduce_ms=reduce_ms
        )
        result = simulate_plan(plan)
        for replica in (0, 1):
            spans = _spans(result, 0, replica)
            assert spans["dp all-reduce"] == (6.0, end)
            assert spans["optimizer"] == (end, end + 0.5)
        assert result.iteration_time_ms == pytest.approx(end + 0.5)


def _compositions(draw: st.DrawFn, total: int) -> list[int]:
    """A random split of ``total`` samples into 1..3 positive shares."""
    parts = draw(st.integers(1, min(3, total)))
    cuts = (
        sorted(
            draw(
                st.lists(
                    st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1, unique=True
                )
            )
        )
        if parts > 1
        else []
    )
    bounds = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(bounds)]


@st.composite
def _uneven_plans(draw: st.DrawFn) -> tuple[Plan, list[list[int]]]:
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]))
    pp = draw(st.integers(1, 3))
    v = 2 if schedule == "interleaved_1f1b" else 1
    m = pp * draw(st.integers(1, 3))
    micro_batch = draw(st.integers(2, 5))
    shares = [_compositions(draw, micro_batch) for _ in range(pp)]
    times = [[draw(stage_times) for _ in shares[s % pp]] for s in range(pp * v)]
    send_ms = draw(st.floats(0, 2))
    plan = _replica_plan(shares, times, m=m, send_ms=send_ms, schedule=schedule, v=v)
    return plan, shares


@settings(max_examples=80, deadline=None)
@given(case=_uneven_plans())
def test_uneven_replicas_never_beat_the_replica_lower_bound(
    case: tuple[Plan, list[list[int]]],
) -> None:
    plan, shares = case
    par = plan.parallelism
    result = simulate_plan(plan)
    timings = plan.prediction.stage_timings
    bound = replica_lower_bound_ms(timings, shares, par.num_micro_batches)
    assert result.pipeline_time_ms >= bound * (1 - 1e-9)
    # And never above every event in series (the longest chain holds each event once).
    every_event = sum(e.duration_ms for replica in result.replicas for e in replica.events)
    assert result.iteration_time_ms <= every_event * (1 + 1e-9) + 1e-9


def test_replica_bound_is_the_stage_bound_with_one_replica_per_rank() -> None:
    timings = _timings([(3, 1), (1, 2), (2, 2)], send_ms=0.5)
    assert replica_lower_bound_ms(timings, [[1], [1], [1]], 4) == pipeline_lower_bound_ms(
        timings, 3, 4
    )


def test_memory_curves_per_replica_from_replica_timings() -> None:
    """GPipe pp = 1, m = 3: replica 0 saves 100 bytes per micro-batch, replica 1 saves 40;
    each replica's curve peaks at its own static + 3 × its saved bytes + transient."""
    timing = StageTiming(
        stage=0,
        forward_ms=1,
        backward_ms=1,
        send_ms=0,
        replicas=[
            ReplicaTiming(forward_ms=1, backward_ms=1, saved_activation_bytes=100),
            ReplicaTiming(forward_ms=1, backward_ms=1, saved_activation_bytes=40),
        ],
    )
    plan = make_stages_plan(
        [2],
        [[ReplicaSpec(share=3), ReplicaSpec(share=1)]],
        schedule="gpipe",
        num_micro_batches=3,
        stage_timings=[timing],
    )
    plan = _with(plan, memory=[_estimate(0, 0, share=3), _estimate(0, 0, share=1)])
    result = simulate_plan(plan)
    assert result.activation_bytes_source == "plan"
    assert [r.peak_bytes for r in result.replicas] == [4000 + 300 + 50, 4000 + 120 + 50]
    assert [r.label for r in result.replicas] == ["cpu tp1, 3 samples", "cpu tp1, 1 sample"]


def test_replica_timings_must_cover_every_replica() -> None:
    plan = _replica_plan([[1, 1]], [[(1, 1), (2, 2)]], m=1)
    timing = plan.prediction.stage_timings[0]
    short = timing.model_copy(update={"replicas": timing.replicas[:1]})
    broken = plan.model_copy(
        update={"prediction": plan.prediction.model_copy(update={"stage_timings": [short]})}
    )
    with pytest.raises(InputError, match="1 replica figures; the stage has 2 replicas"):
        simulate_plan(broken)
