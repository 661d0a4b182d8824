"""The zero-bubble bound (``autoplan.solve.certificate.zero_bubble_bound_ms``) against brute
force: on small random instances it is never above any zero-bubble plan that fits, and it
bites (is above the work bound) on some of them.

The brute force enumerates dp-1 pipelines (the only ones torch runs under these schedules):
every micro-batch count, pp, layer split, per rank every class and tp block size, recompute
none or full (zero bubble refuses selective), as ZB-H1 (``interleaved_zero_bubble`` at v = 1)
and, with two layer ranges per rank in the V, as ZB-V; each plan costed by
``CostModel.evaluate`` (the action lists played).
"""

from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.schedule.zero_bubble import zero_bubble_problem
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.certificate import work_bound_ms, zero_bubble_bound_ms
from autoplan.solve.space import class_tp_choices, divisors
from solvers.oracle import compositions
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

OPTIONS = SolveOptions(top_k=1, sequence_parallel=False)
BITES: list[bool] = []  # whether the bound was above the work bound, per instance
PACKS: list[bool] = []  # whether the packing of layer types raised it, per instance


@st.composite
def zero_bubble_instances(draw):
    num_layers = draw(st.integers(2, 5))
    layers = [
        layer(
            i,
            flops=draw(st.integers(1, 50)) * 10**10,
            params=draw(st.integers(1, 40)) * 10**6,
            saved=draw(st.integers(1, 40)) * 10**7,
            output=draw(st.integers(1, 20)) * 10**6,
            tp_divides=draw(st.sampled_from([None, 1, 2])),
            kind="embedding" if i == 0 and draw(st.booleans()) else "block",
        )
        for i in range(num_layers)
    ]
    groups = []
    for index in range(draw(st.integers(1, 2))):
        spec = gpu(
            f"G{index}",
            tflops=draw(st.sampled_from([10.0, 25.0, 60.0])),
            memory_gib=draw(st.sampled_from([0.3, 0.6, 1.5, 8.0])),
            bandwidth=draw(st.sampled_from([100.0, 1000.0])),
        )
        groups.append((f"g{index}", spec, draw(st.sampled_from([1, 2])), draw(st.integers(1, 2))))
    cluster = make_cluster(groups, intra_gb_per_s=100.0, inter_gb_per_s=10.0)
    return make_profile(layers), cluster, draw(st.sampled_from([2, 4, 8]))


def _best_zero_bubble_ms(model, batch: int) -> float:
    """The fastest zero-bubble plan of the module docstring that fits, inf when none does."""
    kinds = [(c.index, t) for c in model.classes for t in class_tp_choices(model, c.index, OPTIONS)]
    total = [c.total_gpus for c in model.classes]
    best = math.inf
    for m in divisors(batch):
        b = batch // m
        every = (
            sizes
            for parts in range(2, model.num_layers + 1)
            for sizes in compositions(model.num_layers, parts)
        )
        for sizes in every:
            stages = len(sizes)
            cuts = [0, *itertools.accumulate(sizes)]
            shapes = [("interleaved_zero_bubble", 1, stages)]
            if stages % 2 == 0:
                shapes.append(("zbv", 2, stages // 2))
            for schedule, v, pp in shapes:
                if pp < 2 or zero_bubble_problem(schedule, pp, m, 1) is not None:
                    continue
                for ranks in itertools.product(kinds, repeat=pp):
                    used = [0] * len(total)
                    for k, t in ranks:
                        used[k] += t
                    if any(u > n for u, n in zip(used, total, strict=True)):
                        continue
                    for mode in ("none", "full"):
                        groups = [(ReplicaGroup(k, t, 1, b, mode),) for k, t in ranks]
                        # Stage s on rank s (v = 1), or s and 2pp - 1 - s (the V).
                        on = [s if s < pp else 2 * pp - 1 - s for s in range(stages)]
                        config = PlanConfig(
                            m,
                            schedule,
                            v,
                            tuple(
                                StageChoice(cuts[s], cuts[s + 1], groups[on[s]])
                                for s in range(stages)
                            ),
                        )
                        cost = model.evaluate(config)
                        if cost.feasible:
                            best = min(best, cost.iteration_ms)
    return best


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(zero_bubble_instances())
def test_the_zero_bubble_bound_is_below_every_zero_bubble_plan(instance) -> None:
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    bound = zero_bubble_bound_ms(model, batch, OPTIONS)
    best = _best_zero_bubble_ms(model, batch)
    assert bound <= best * (1 + 1e-9), (bound, best)
    if math.isfinite(best):
        BITES.append(bound > work_bound_ms(model, batch, OPTIONS) * (1 + 1e-9))
        counted = zero_bubble_bound_ms(model, batch, OPTIONS, packing=False)
        assert counted <= bound
        PACKS.append(bound > counted * (1 + 1e-9))


def test_the_zero_bubble_bound_bites_on_some_instances() -> None:
    """Runs after the oracle (file order): on some instances the bound is above the work
    bound, so the oracle above tested a bound that does something."""
    assert any(BITES) and len(BITES) >= 10


def test_the_packing_of_layer_types_raises_the_bound_on_some_instances() -> None:
    """Runs after the oracle (file order): the exact packing of layer types with each rank's
    transfers is above the sorted-prefix count on some instances, so the oracle tested it."""
    assert any(PACKS) and len(PACKS) >= 10
