"""Zero-bubble cost: the action-list player against the closed forms where they are exact,
never below the lower bounds, and the activations in flight that W deferral holds."""

from __future__ import annotations

import itertools
import random

import pytest

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.schedule import in_flight_chunks, pipeline_time_ms
from autoplan.cost.zero_bubble import (
    group_weight_gradient_ms,
    peak_in_flight,
    play_ms,
    weight_gradient_share,
)
from autoplan.schedule import schedule_order
from autoplan.solve import SolveOptions, cost_model
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile
from tests.zero_bubble_reference import zb_h1_time_ms

TIMES = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0), (1.0, 2.0, 0.25)]
CASES = list(itertools.product([1, 2, 4, 5], [6, 12], TIMES))


@pytest.mark.parametrize(("pp", "m", "times"), CASES)
def test_player_equals_closed_forms(pp: int, m: int, times: tuple[float, float, float]) -> None:
    forward, input_grad, weight = times
    stages = ([forward] * pp, [input_grad] * pp, [weight] * pp)
    one_f_one_b = play_ms(schedule_order("1f1b", pp, m), *stages)
    assert one_f_one_b == pytest.approx(pipeline_time_ms([sum(times)] * pp, m))
    zb_h1 = play_ms(schedule_order("interleaved_zero_bubble", pp, m, 1), *stages)
    assert zb_h1 == pytest.approx(zb_h1_time_ms(forward, input_grad, weight, pp, m))
    if pp > 1:
        assert zb_h1 < one_f_one_b  # the deferred Ws fill (p - 1) × W of the bubble


@pytest.mark.parametrize("schedule", ["interleaved_zero_bubble", "zbv", "dualpipev"])
def test_player_never_below_lower_bounds(schedule: str) -> None:
    rng = random.Random(7)
    for pp, m in [(2, 4), (3, 6), (4, 8), (4, 12)]:
        v = 1 if schedule == "interleaved_zero_bubble" else 2
        order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
        n = pp * v
        forward = [rng.uniform(0.5, 2) for _ in range(n)]
        input_grad = [rng.uniform(0.5, 2) for _ in range(n)]
        weight = [rng.uniform(0.2, 2) for _ in range(n)]
        played = play_ms(order, forward, input_grad, weight)
        # Every rank does all of its work; one micro-batch crosses every stage's F and I.
        rank_work = [
            sum(
                {"F": forward, "I": input_grad, "W": weight}[a.kind][a.stage]
                if a.kind != "B"
                else input_grad[a.stage] + weight[a.stage]
                for a in acts
            )
            for acts in order
        ]
        critical = sum(forward) + sum(input_grad) + min(weight)
        assert played >= max(rank_work) - 1e-9
        assert played >= critical - 1e-9


def test_weight_deferral_holds_more_activations() -> None:
    """ZB-H1 keeps every rank at p in flight (1F1B: p - r); W after I keeps them to W."""
    assert peak_in_flight(schedule_order("1f1b", 4, 8)) == [
        in_flight_chunks("1f1b", 4, r, 8) for r in range(4)
    ]
    assert peak_in_flight(schedule_order("interleaved_zero_bubble", 4, 8, 1)) == [4, 4, 4, 4]
    assert peak_in_flight(schedule_order("zbv", 4, 8, 2)) == [8, 8, 8, 8]
    assert peak_in_flight(schedule_order("dualpipev", 4, 8, 2)) == [9, 9, 9, 9]


def test_backward_split_from_the_profile() -> None:
    # A linear layer: backward FLOPs = 2 × forward = 4·P·tokens, half of it weight gradient.
    params, tokens = 1000, 64
    share = weight_gradient_share(params, tokens, 4.0 * params * tokens)
    assert share == pytest.approx(0.5)
    # An embedding (no matmul): the count exceeds the backward, all of it is W.
    assert weight_gradient_share(10**6, tokens, 1e3) == 1.0
    assert weight_gradient_share(0, tokens, 0.0) == 0.0


def _transformer_model():
    profile = transformer_profile(8, 1024, 512, vocab=1024, heads=16)
    cluster = make_cluster([("g", gpu("G", 100.0, 80.0), 4, 1)])
    return profile, cost_model(profile, cluster, SolveOptions())


def _config(schedule: str, bounds: list[int], v: int, m: int = 8) -> PlanConfig:
    group = (ReplicaGroup(0, 1, 1, 1, "none"),)
    stages = tuple(
        StageChoice(bounds[i], bounds[i + 1], group, False) for i in range(len(bounds) - 1)
    )
    return PlanConfig(m, schedule, v, stages)


def test_cost_model_plays_zero_bubble_schedules() -> None:
    """Same layers on 4 ranks: ZB-H1 beats 1F1B by the Ws it hides and holds more
    activations; ZB-V puts stages r and 7 - r on rank r (the V), which the memory follows."""
    profile, model = _transformer_model()
    layers = len(profile.layers)  # embedding, 8 blocks, head
    even = [0, 3, 5, 7, layers]
    one_f_one_b = model.evaluate(_config("1f1b", even, 1))
    zb_h1 = model.evaluate(_config("interleaved_zero_bubble", even, 1))
    assert zb_h1.pipeline_ms < one_f_one_b.pipeline_ms
    assert zb_h1.iteration_ms < one_f_one_b.iteration_ms
    # The same per-stage times: work is equal, only the bubble changes.
    assert [s.work_ms for s in zb_h1.stages] == [s.work_ms for s in one_f_one_b.stages]
    held_1f1b = [r.activations_bytes for r in one_f_one_b.memory]
    held_zb = [r.activations_bytes for r in zb_h1.memory]
    assert held_zb[0] == held_1f1b[0] and held_zb[3] > held_1f1b[3]
    v_bounds = [0, 2, 3, 4, 5, 6, 7, 8, layers]
    zbv = model.evaluate(_config("zbv", v_bounds, 2))
    # Rank 0 holds stages 0 and 7 (embedding + block, and block 8 + head).
    expected = sum(zbv.stages[s].work_ms for s in (0, 7))
    ranks = [r.pipeline_rank for r in zbv.memory]
    assert ranks == [0, 1, 2, 3]
    assert zbv.pipeline_ms >= 8 * expected - 1e-9
    interleaved = model.evaluate(_config("interleaved_1f1b", v_bounds, 2))
    assert zbv.pipeline_ms < interleaved.pipeline_ms


def test_a_cp_groups_weight_gradient_is_a_part_of_its_own_backward() -> None:
    """W comes from the tables the group is costed with: a cp 2 rank's W is its part of its
    own backward (half the tokens), below the whole sequence's, and the W split leaves a
    nonnegative input-gradient part under every cp."""
    profile, model = _transformer_model()
    layers = len(profile.layers)
    weights = {}
    for cp in (1, 2):
        stage = StageChoice(0, layers, (ReplicaGroup(0, 1, 1, 1, "none", cp=cp),))
        weights[cp] = group_weight_gradient_ms(model, stage, 0)
        backward = model.evaluate(PlanConfig(4, "1f1b", 1, (stage,))).stages[0].groups[0]
        assert 0.0 < weights[cp] <= backward.backward_ms
    assert weights[2] < 0.75 * weights[1]
