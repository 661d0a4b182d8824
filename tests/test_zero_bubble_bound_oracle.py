"""The zero-bubble bound (``autoplan.solve.certificate.zero_bubble_bound_ms``) against brute
force: on small random instances it is never above any zero-bubble plan that fits, and it
bites (is above the work bound) on some of them.

The brute force enumerates dp-1 pipelines (the only ones torch runs under these schedules):
every micro-batch count, pp, layer split, per rank every class and tp block size, recompute
none or full (zero bubble refuses selective), with and without activation offload, as ZB-H1
(``interleaved_zero_bubble`` at v = 1) and, with two layer ranges per rank in the V, as ZB-V;
each plan costed by ``CostModel.evaluate`` (the action lists played). The instances' small
memories make the ranks' activations bind on many of them (the bound counts them: see
``autoplan.solve.zero_bubble_bound``), and the in-flight floor it uses is checked against the
schedules' own action lists.
"""

from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.zero_bubble import peak_in_flight
from autoplan.schedule.orders import schedule_order
from autoplan.schedule.zero_bubble import zero_bubble_problem
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.certificate import work_bound_ms, zero_bubble_bound_ms
from autoplan.solve.space import CHUNKS, class_tp_choices, divisors
from autoplan.solve.zero_bubble_bound import in_flight_floor
from solvers.oracle import compositions
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

OPTIONS = SolveOptions(top_k=1, sequence_parallel=False)
BITES: list[bool] = []  # whether the bound was above the work bound, per instance
PACKS: list[bool] = []  # whether the packing of layer types raised it, per instance
MEMORY: list[bool] = []  # whether the ranks' activations raised it, per instance


@st.composite
def zero_bubble_instances(draw):
    num_layers = draw(st.integers(2, 5))
    # Repeated blocks (as a transformer's) half the time: the packing of layer types, and
    # with it the memory each rank must hold, counts them exactly.
    repeated = draw(st.booleans())
    figures = None
    layers = []
    for i in range(num_layers):
        if figures is None or not repeated:
            figures = {
                "flops": draw(st.integers(1, 50)) * 10**10,
                "params": draw(st.integers(1, 40)) * 10**6,
                "saved": draw(st.integers(1, 100)) * 10**7,
                "output": draw(st.integers(1, 20)) * 10**6,
                "tp_divides": draw(st.sampled_from([None, 1, 2])),
            }
        kind = "embedding" if i == 0 and draw(st.booleans()) else "block"
        layers.append(layer(i, kind=kind, **figures))  # type: ignore[arg-type]
    groups = []
    for index in range(draw(st.integers(1, 2))):
        spec = gpu(
            f"G{index}",
            tflops=draw(st.sampled_from([10.0, 25.0, 60.0])),
            memory_gib=draw(st.sampled_from([0.3, 0.6, 1.5, 8.0])),
            bandwidth=draw(st.sampled_from([100.0, 1000.0])),
            # A slow host link makes offload cost time: memory then binds.
            host_link=draw(st.sampled_from([0.5, 25.0])),
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
                    for mode, offload in itertools.product(("none", "full"), (False, True)):
                        groups = [(ReplicaGroup(k, t, 1, b, mode, offload),) for k, t in ranks]
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
        free = zero_bubble_bound_ms(model, batch, OPTIONS, memory=False)
        assert free <= bound
        MEMORY.append(bound > free * (1 + 1e-9))
        counted = zero_bubble_bound_ms(model, batch, OPTIONS, packing=False)
        assert counted <= free
        PACKS.append(free > counted * (1 + 1e-9))
        # A cap (a plan in hand) only ever lowers it, to the cap at most.
        assert zero_bubble_bound_ms(model, batch, OPTIONS, cap_ms=best) == min(bound, best)


def test_the_zero_bubble_bound_bites_on_some_instances() -> None:
    """Runs after the oracle (file order): on some instances the bound is above the work
    bound, so the oracle above tested a bound that does something."""
    assert any(BITES) and len(BITES) >= 10


def test_the_packing_of_layer_types_raises_the_bound_on_some_instances() -> None:
    """Runs after the oracle (file order): the exact packing of layer types with each rank's
    transfers is above the sorted-prefix count on some instances, so the oracle tested it."""
    assert any(PACKS) and len(PACKS) >= 10


def test_the_ranks_activations_raise_the_bound_on_some_instances() -> None:
    """Runs after the oracle (file order): counting what each rank's memory must hold for its
    micro-batches in flight is above the bound without it on some instances, so the oracle
    tested it."""
    assert any(MEMORY) and len(MEMORY) >= 10


def test_the_in_flight_floor_is_below_every_rank_of_every_zero_bubble_schedule() -> None:
    """q(p, m) = min(p, (m + 1) / 2) is at most every rank's chunk-forwards in flight over its
    chunks, for every zero-bubble schedule torch runs (ZB-H1, ZB1P at the space's chunks,
    ZB-V, DualPipeV), and it is reached (by ZB-H1 or ZB-V's first rank)."""
    for p in range(2, 11):
        for m in range(1, 3 * p + 3):
            shapes = [("interleaved_zero_bubble", v) for v in (1, *CHUNKS)]
            shapes += [("zbv", 2), ("dualpipev", 2)]
            least = math.inf
            for name, v in shapes:
                if zero_bubble_problem(name, p, m, 1) is not None:
                    continue
                flight = peak_in_flight(schedule_order(name, p, m, v))
                least = min(least, min(flight) / v)
            assert in_flight_floor(p, m) <= least, (p, m, least)
            assert in_flight_floor(p, m) == least, (p, m, least)


def test_memory_forces_recompute_and_the_bound_counts_it() -> None:
    """Four equal blocks on 4 GPUs of 1 GiB with a slow host link, batch 4: a rank holding a
    block's activations for its micro-batches in flight does not fit without full recompute
    (or a slow offload), so every zero-bubble plan pays for one; the bound counts it (above
    the bound without the activations) and stays below the best plan."""
    layers = [
        layer(
            i, flops=20 * 10**10, params=10**7, saved=6 * 10**8, output=5 * 10**6, tp_divides=None
        )
        for i in range(4)
    ]
    spec = gpu("G0", tflops=25.0, memory_gib=1.0, host_link=0.5)
    cluster = make_cluster([("g0", spec, 2, 2)], intra_gb_per_s=100.0, inter_gb_per_s=10.0)
    model = cost_model(make_profile(layers), cluster, OPTIONS)
    bound = zero_bubble_bound_ms(model, 4, OPTIONS)
    free = zero_bubble_bound_ms(model, 4, OPTIONS, memory=False)
    best = _best_zero_bubble_ms(model, 4)
    assert free < bound <= best, (free, bound, best)
