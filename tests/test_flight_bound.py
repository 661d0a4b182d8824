"""The ordered-pipeline bound of ``autoplan.solve.flight_bound`` never exceeds what the
candidate's exact DP finds (random instances where memory binds: small GPUs, deep stacks),
and it is tighter than the order-free bound where a slow class sits at an end."""

from __future__ import annotations

import importlib
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.offload import group_of
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.bounds import Pending
from autoplan.solve.flight_bound import order_bound
from autoplan.solve.space import zero_levels
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

uniform = importlib.import_module("autoplan.solve.uniform")


@st.composite
def tight_instances(draw):
    """6-10 blocks of a wide model on 2-3 GPU types of little memory, so that in-flight
    micro-batches, ZeRO levels and recompute decide what fits."""
    profile = transformer_profile(
        draw(st.integers(4, 8)), hidden=draw(st.sampled_from([2048, 4096])), seq_len=1024, heads=16
    )
    specs = [
        gpu("FAST", 300.0, draw(st.sampled_from([6.0, 12.0]))),
        gpu("MID", 120.0, draw(st.sampled_from([4.0, 8.0]))),
        gpu("SLOW", 20.0, draw(st.sampled_from([4.0, 16.0]))),
    ]
    count = draw(st.integers(2, 3))
    cluster = make_cluster(
        [(f"g{i}", spec, 2, draw(st.integers(1, 2))) for i, spec in enumerate(specs[:count])],
        inter_gb_per_s=draw(st.sampled_from([5.0, 50.0])),
    )
    return profile, cluster, draw(st.sampled_from([8, 16]))


@settings(max_examples=6, deadline=None, derandomize=True)
@given(tight_instances())
def test_order_bound_never_above_the_candidates_optimum(instance) -> None:
    """Every candidate of the uniform space: its queued bound (its composition's,
    ``solve.compositions``) and its own order bound <= its exact DP (no pruning); interleaved
    candidates (a fixed split) keep their queued bound, checked the same way."""
    profile, cluster, batch = instance
    options = SolveOptions(space="uniform")
    model = cost_model(profile, cluster, options)
    checked = 0
    for group in uniform._groups(model, batch, options):
        levels = zero_levels(group.dp, True, options)
        for pending in uniform._expand(model, group, math.inf, levels):
            bound = order_bound(model, pending, levels)
            found = uniform._solve_pipeline(model, pending, options, math.inf)
            if found is None:
                continue
            assert pending.bound <= bound <= found[1] * (1 + 1e-9), (pending, bound, found[1])
            checked += 1
    assert checked > 0


def test_a_slow_class_at_the_end_lifts_the_bound() -> None:
    """Two slow ranks last must hold the last block and the head: the order-free bound puts
    every layer at its fastest class, the ordered one does not, and both stay below the DP."""
    profile = transformer_profile(6, hidden=2048, seq_len=1024, heads=16)
    cluster = make_cluster(
        [("fast", gpu("FAST", 300.0, 40.0), 2, 1), ("slow", gpu("SLOW", 20.0, 40.0), 2, 1)]
    )
    options = SolveOptions(space="uniform")
    model = cost_model(profile, cluster, options)
    group = next(
        g for g in uniform._groups(model, 16, options) if g.tp == 1 and g.dp == 1 and g.pp == 4
    )
    pending = next(
        p
        for p in uniform._expand(model, group, math.inf)
        if p.classes == (0, 0, 1, 1) and p.schedule == "1f1b" and p.chunks == 1
    )
    bound = order_bound(model, pending, zero_levels(pending.dp, True, options))
    found = uniform._solve_pipeline(model, pending, options, math.inf)
    assert found is not None
    assert pending.bound * 1.2 < bound <= found[1] * (1 + 1e-9)
    assert isinstance(pending, Pending)


def test_the_all_reduce_reads_no_micro_batch_size() -> None:
    """``flight_bound._collectives`` costs the ZeRO-2/3 bound's all-reduces once for the
    groups of every micro-batch size: it holds only while ``CostModel.allreduce_ms`` does
    not read the group's samples or recompute (in one node and across nodes)."""
    profile = transformer_profile(4, hidden=2048, seq_len=1024, heads=16)
    cluster = make_cluster(
        [("fast", gpu("FAST", 300.0, 40.0), 4, 2), ("slow", gpu("SLOW", 20.0, 40.0), 4, 2)]
    )
    model = cost_model(profile, cluster, SolveOptions())
    for k, tp, dp in [(0, 1, 2), (0, 2, 2), (1, 1, 8), (1, 2, 4)]:
        reference = model.allreduce_ms((group_of(k, tp, dp, 1, "none"),), (3.0e8,))
        assert reference > 0
        for samples, mode in [(2, "none"), (8, "full"), (3, "selective")]:
            group = group_of(k, tp, dp, samples, mode)
            assert model.allreduce_ms((group,), (3.0e8,)) == reference, (k, tp, dp, samples)


def test_a_rank_that_holds_no_layer_gives_no_split() -> None:
    """A class whose ranks at some positions hold no layer at any budget (an empty staircase:
    little memory, many micro-batches in flight) beside one that holds them: the bound of
    such a pipeline is inf (no split fits), not an error, and stays below the DP's wherever
    the DP finds one."""
    profile = transformer_profile(6, hidden=4096, seq_len=1024, heads=16)
    cluster = make_cluster(
        [("big", gpu("BIG", 300.0, 80.0), 2, 1), ("tiny", gpu("TINY", 20.0, 2.0), 2, 1)]
    )
    options = SolveOptions(space="uniform")
    model = cost_model(profile, cluster, options)
    unbounded = 0
    for group in uniform._groups(model, 16, options):
        levels = zero_levels(group.dp, True, options)
        for pending in uniform._expand(model, group, math.inf, levels):
            if pending.chunks != 1 or set(pending.classes) != {0, 1}:
                continue
            bound = order_bound(model, pending, levels)
            found = uniform._solve_pipeline(model, pending, options, math.inf)
            if found is not None:
                assert bound <= found[1] * (1 + 1e-9), (pending, bound, found[1])
            unbounded += bound == math.inf
    assert unbounded > 0
