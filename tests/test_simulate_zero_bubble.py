"""The event simulator on zero-bubble plans (split backward I/W, the V placement), against the
cost model's play of the same action lists, the lower bound and closed forms; and where
1F1B's closed form (autoplan.cost.schedule) is exact against the simulator."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cost.schedule import blocking_stage_times, pipeline_time_ms
from autoplan.cost.zero_bubble import peak_in_flight, play_ms
from autoplan.errors import InputError
from autoplan.files import write_json_model
from autoplan.plan.schema import Plan, StageTiming
from autoplan.schedule import schedule_order
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.simulate import pipeline_lower_bound_ms, simulate_order, simulate_plan
from autoplan.simulate.chrome_trace import chrome_trace
from autoplan.simulate.gantt import write_gantt_png
from autoplan.solve import SolveOptions
from tests.plan_factory import make_plan
from tests.test_solve_zero_bubble import solve
from tests.zero_bubble_reference import zb_h1_time_ms

# (schedule, v) pairs the schema allows: the V schedules hold two stages per rank.
SHAPES = [("interleaved_zero_bubble", 1), ("interleaved_zero_bubble", 2), ("zbv", 2)]
SHAPES += [("interleaved_zero_bubble", 3), ("dualpipev", 2)]


def _zb_plan(
    schedule: str,
    v: int,
    m: int,
    times: list[tuple[float, float, float, float]],
    saved_bytes: list[int] | None = None,
    optimizer_ms: float = 0.0,
) -> Plan:
    """A hand-made plan with stage s taking (F, B, W, send) = ``times[s]``."""
    timings = [
        StageTiming(
            stage=s,
            forward_ms=f,
            backward_ms=b,
            weight_gradient_ms=w,
            send_ms=send,
            saved_activation_bytes=saved_bytes[s] if saved_bytes else None,
        )
        for s, (f, b, w, send) in enumerate(times)
    ]
    plan = make_plan(
        [1] * len(times),
        schedule=schedule,  # type: ignore[arg-type]
        num_micro_batches=m,
        virtual_stages_per_rank=v,
        stage_timings=timings,
    )
    if optimizer_ms:
        breakdown = plan.prediction.breakdown.model_copy(update={"optimizer_ms": optimizer_ms})
        prediction = plan.prediction.model_copy(update={"breakdown": breakdown})
        plan = plan.model_copy(update={"prediction": prediction})
    return plan


def _played(plan: Plan) -> float:
    par = plan.parallelism
    order = schedule_order(
        par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
    )
    timings = plan.prediction.stage_timings
    weight = [t.weight_gradient_ms or 0.0 for t in timings]
    return play_ms(
        order,
        [t.forward_ms for t in timings],
        [t.backward_ms - w for t, w in zip(timings, weight, strict=True)],
        weight,
        [t.send_ms for t in timings],
    )


def _stage_rank(plan: Plan) -> list[int]:
    return [plan.parallelism.rank_of_stage(s) for s in range(plan.parallelism.num_stages)]


@st.composite
def _hand_made(draw: st.DrawFn) -> tuple[Plan, float]:
    schedule, v = draw(st.sampled_from(SHAPES))
    pp = draw(st.integers(1, 4))
    if schedule == "dualpipev":
        m = draw(st.integers(2 * pp, 2 * pp + 5))
    elif schedule == "interleaved_zero_bubble":
        m = pp * draw(st.integers(1, 3)) if draw(st.booleans()) else draw(st.integers(1, pp))
    else:
        m = draw(st.integers(1, 3 * pp))
    times = []
    for _ in range(pp * v):
        f = draw(st.floats(0.1, 10))
        b = draw(st.floats(0.1, 20))
        w = b * draw(st.floats(0, 1))
        # Sends up to twice the compute: links that queue their sends are covered too.
        send = draw(st.floats(0, 20)) if pp > 1 else 0.0
        times.append((f, b, w, send))
    optimizer = draw(st.sampled_from([0.0, 1.5]))
    return _zb_plan(schedule, v, m, times, optimizer_ms=optimizer), optimizer


@settings(max_examples=120, deadline=None, derandomize=True)
@given(case=_hand_made())
def test_hand_made_plans_simulate_to_the_played_time_and_above_the_bound(
    case: tuple[Plan, float],
) -> None:
    """Any stage times, W shares, sends (queued on slow links), pp, m and v: the event
    simulator's pipeline time is cost.zero_bubble.play_ms's, never below the lower bound, and
    the optimizer step follows it."""
    plan, optimizer_ms = case
    par = plan.parallelism
    result = simulate_plan(plan)
    assert result.pipeline_time_ms == pytest.approx(_played(plan), rel=1e-9, abs=1e-9)
    assert result.iteration_time_ms == pytest.approx(
        result.pipeline_time_ms + optimizer_ms, rel=1e-9, abs=1e-9
    )
    bound = pipeline_lower_bound_ms(
        plan.prediction.stage_timings, par.pipeline_degree, par.num_micro_batches, _stage_rank(plan)
    )
    assert result.pipeline_time_ms >= bound * (1 - 1e-9)
    # Every action of the schedule ran once, on the rank the V (or s % pp) puts its stage on.
    order = schedule_order(
        par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
    )
    for rank, actions in enumerate(order):
        ran = [e.name for e in result.ranks[rank].replicas[0].events if e.track == "compute"]
        assert Counter(n for n in ran if n != "optimizer") == Counter(a.label for a in actions)


@pytest.mark.parametrize("schedule", ZERO_BUBBLE_SCHEDULES)
@pytest.mark.parametrize(("pp", "m"), [(None, None), (2, 8), (2, 16), (4, 8), (4, 16)])
def test_solver_emitted_plans_simulate_to_their_prediction(
    schedule: str, pp: int | None, m: int | None
) -> None:
    """What `autoplan solve` writes for a pinned zero-bubble schedule (free, or at pinned pp
    and m; the solver picks v and uneven splits): the simulated iteration is the plan's
    predicted one (its stage times rounded to six digits in the file)."""
    plan = solve(SolveOptions(schedule=schedule, pp=pp, num_micro_batches=m))
    if pp is not None:
        assert (plan.parallelism.pipeline_degree, plan.parallelism.num_micro_batches) == (pp, m)
    assert all(t.weight_gradient_ms is not None for t in plan.prediction.stage_timings)
    result = simulate_plan(plan)
    assert result.iteration_time_ms == pytest.approx(plan.prediction.iteration_time_ms, rel=1e-6)
    assert result.pipeline_time_ms == pytest.approx(_played(plan), rel=1e-12)
    par = plan.parallelism
    bound = pipeline_lower_bound_ms(
        plan.prediction.stage_timings, par.pipeline_degree, par.num_micro_batches, _stage_rank(plan)
    )
    assert bound <= result.pipeline_time_ms
    for rank in result.ranks:
        assert rank.stages == [s.index for s in plan.stages_of_rank(rank.pipeline_rank)]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_the_v_turns_on_one_rank_without_a_send(schedule: str) -> None:
    """Stages pp-1 and pp both sit on the last rank: activations and gradients between them
    hand over on the same GPUs; every other boundary sends both ways."""
    pp, m = 3, 6
    plan = _zb_plan(schedule, 2, m, [(1.0, 2.0, 0.8, 0.5)] * (2 * pp))
    result = simulate_plan(plan)
    sends = Counter(
        (e.stage, e.name.split()[1])
        for r in result.replicas
        for e in r.events
        if e.name.startswith("send")
    )
    turn = pp - 1
    for stage in range(2 * pp):
        acts = sends[(stage, "act")]
        grads = sends[(stage, "grad")]
        assert acts == (0 if stage in (turn, 2 * pp - 1) else m)
        assert grads == (0 if stage in (turn + 1, 0) else m)
    # Each send goes to the rank that holds the next (or previous) stage of the V.
    rank_of = _stage_rank(plan)
    for r in result.replicas:
        for e in r.events:
            if e.name.startswith("send act"):
                assert e.peer_rank == rank_of[e.stage + 1] != r.pipeline_rank
            elif e.name.startswith("send grad"):
                assert e.peer_rank == rank_of[e.stage - 1] != r.pipeline_rank


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    pp=st.integers(1, 6),
    rounds=st.integers(1, 4),
    f=st.floats(0.5, 10),
    i=st.floats(0.5, 10),
    w_share=st.floats(0, 1),
)
def test_zb_h1_equal_stages_match_the_closed_form(
    pp: int, rounds: int, f: float, i: float, w_share: float
) -> None:
    """Qi et al.'s ZB-H1: m·(F + I + W) + (p − 1)·(F + I − W) when W <= min(F, I) (with a
    longer W the drain's Ws no longer fit the gaps; a search found it exact only there)."""
    w = min(f, i) * w_share
    m = pp * rounds
    plan = _zb_plan("interleaved_zero_bubble", 1, m, [(f, i + w, w, 0.0)] * pp)
    expected = zb_h1_time_ms(f, i, w, pp, m)
    assert simulate_plan(plan).pipeline_time_ms == pytest.approx(expected, rel=1e-9)


def test_w_keeps_activations_until_it_ends() -> None:
    """A stage's saved activations stay from its F until its W (not its I): the curve's peak
    is the cost model's peak_in_flight × bytes, and an I's end frees nothing."""
    pp, m, saved = 4, 8, 1000
    for schedule, v in [("interleaved_zero_bubble", 1), ("zbv", 2), ("dualpipev", 2)]:
        plan = _zb_plan(schedule, v, m, [(1.0, 2.0, 1.0, 0.1)] * (pp * v), [saved] * (pp * v))
        result = simulate_plan(plan)
        order = schedule_order(schedule, pp, m, v)
        static = result.replicas[0].static_bytes
        for rank, flight in zip(result.ranks, peak_in_flight(order), strict=True):
            (replica,) = rank.replicas
            assert replica.peak_bytes - static == flight * saved
            level = {p.time_ms: p.allocated_bytes for p in replica.memory}
            passes = [e for e in replica.events if e.track == "compute" and e.stage is not None]
            transient = plan.prediction.memory[0].transient_bytes
            for event in passes:
                if event.category != "input_gradient":
                    continue
                # Right after an I: held = forwards begun - Bs and Ws ended (the I not).
                t = event.end_ms
                held = sum(e.start_ms <= t for e in passes if e.category == "forward") - sum(
                    e.end_ms <= t for e in passes if e.category in ("backward", "weight_gradient")
                )
                running = sum(e.start_ms <= t < e.end_ms for e in passes)
                assert level[t] == static + held * saved + running * transient


def test_all_reduce_hides_under_the_last_weight_gradient() -> None:
    """With replicas (which torch 2.13 cannot run under ZB, but a plan can state), each rank's
    all-reduce starts with its last W, the weight gradients being what it reduces."""
    timings = [
        StageTiming(stage=s, forward_ms=1.0, backward_ms=2.0, weight_gradient_ms=0.8, send_ms=0.1)
        for s in range(4)
    ]
    plan = make_plan(
        [1] * 4,
        schedule="zbv",
        virtual_stages_per_rank=2,
        num_micro_batches=4,
        data_parallel=2,
        stage_timings=timings,
        dp_allreduce_ms=5.0,
    )
    result = simulate_plan(plan)
    for rank in result.ranks:
        for replica in rank.replicas:
            (reduce,) = [e for e in replica.events if e.name == "dp all-reduce"]
            last_w = max(
                (e for e in replica.events if e.category == "weight_gradient"),
                key=lambda e: e.end_ms,
            )
            assert reduce.start_ms == pytest.approx(last_w.start_ms)
            assert reduce.end_ms == pytest.approx(max(last_w.start_ms + 5.0, last_w.end_ms))
    # The rank whose last W starts last ends the iteration: that start plus the all-reduce.
    assert result.iteration_time_ms == pytest.approx(result.pipeline_time_ms - 0.8 + 5.0)


def test_a_split_action_without_a_weight_time_is_refused_in_one_line() -> None:
    plan = make_plan([1, 1], schedule="interleaved_zero_bubble", num_micro_batches=2)
    with pytest.raises(InputError, match="no weight_gradient_ms"):
        simulate_plan(plan)


def test_simulate_cli_trace_and_gantt_draw_w_apart(tmp_path: Path) -> None:
    """`autoplan simulate` on a ZB-V plan file: the Chrome trace has I and W events of their
    own categories (one of each per stage and micro-batch) and the Gantt chart is written."""
    plan = _zb_plan("zbv", 2, 6, [(1.0, 2.0, 0.7, 0.2)] * 4)
    path, trace_path, png_path = tmp_path / "p.json", tmp_path / "t.json", tmp_path / "g.png"
    write_json_model(path, plan)
    invoked = CliRunner().invoke(
        app, ["simulate", str(path), "--trace", str(trace_path), "--png", str(png_path)]
    )
    assert invoked.exit_code == 0, invoked.output
    events = json.loads(trace_path.read_text())["traceEvents"]
    by_category = Counter(e["cat"] for e in events if e["ph"] == "X")
    stages, m = plan.parallelism.num_stages, plan.parallelism.num_micro_batches
    assert by_category["input_gradient"] == by_category["weight_gradient"] == stages * m
    assert by_category["forward"] == stages * m
    assert chrome_trace(simulate_plan(plan)) == chrome_trace(simulate_plan(plan))
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_gantt_png(tmp_path / "again.png", simulate_plan(plan))


# ---- 1F1B's closed form (autoplan.cost.schedule) against the simulator ----------------------


def _one_f_one_b(
    forward: list[float], backward: list[float], send: list[float], m: int
) -> tuple[float, float]:
    """(simulated, closed-form) pipeline time of 1F1B, the cost model's a_r and b_r."""
    pp = len(forward)
    order = schedule_order("1f1b", pp, m, 1)
    timings = [
        StageTiming(stage=s, forward_ms=forward[s], backward_ms=backward[s], send_ms=send[s])
        for s in range(pp)
    ]
    events = simulate_order(order, timings)
    simulated = max(e.end_ms for rank in events for e in rank)
    work = [f + b for f, b in zip(forward, backward, strict=True)]
    received = [0.0, *send[:-1]]
    steady = blocking_stage_times(work, send, received)
    return simulated, pipeline_time_ms(steady, m, 1, steady)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    pp=st.integers(1, 6),
    extra=st.integers(0, 6),
    f=st.floats(0.1, 10),
    b=st.floats(0.1, 20),
    send=st.floats(0, 10),
)
def test_one_f_one_b_closed_form_exact_without_sends_and_optimistic_with(
    pp: int, extra: int, f: float, b: float, send: float
) -> None:
    """Equal stages: the closed form is exact without sends; with equal blocking sends it is
    never below the simulator (a middle stage pays four transfers, the ends two, and the form
    sums every stage's into the fill: 0-9% above on random cases)."""
    m = pp + extra
    exact, closed = _one_f_one_b([f] * pp, [b] * pp, [0.0] * pp, m)
    assert exact == pytest.approx(closed, rel=1e-9)
    sends = [send] * (pp - 1) + [0.0]
    simulated, closed = _one_f_one_b([f] * pp, [b] * pp, sends, m)
    assert simulated <= closed * (1 + 1e-9)


def test_one_f_one_b_closed_form_errs_both_ways_on_uneven_stages() -> None:
    """The smallest cases found by search (cost.schedule's docstring), each way."""
    # A slower second backward hides under the first stage: the form counts it in full.
    simulated, closed = _one_f_one_b([1, 1], [2, 1], [0, 0], 2)
    assert (simulated, closed) == (7, 8)
    # Blocking sends on equal stages: each stage pays both transfers of its boundary
    # (a = 2 + 2 × 1), and the form is exact: (3 - 1) × 4 + 8.
    simulated, closed = _one_f_one_b([1, 1], [1, 1], [1, 0], 3)
    assert (simulated, closed) == (16, 16)
    # Without sends, uneven forward/backward splits can beat the form's fill too.
    simulated, closed = _one_f_one_b([5, 1, 3, 1], [4, 10, 1, 2], [0] * 4, 6)
    assert (simulated, closed) == (83, 82)
