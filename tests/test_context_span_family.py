"""The search's spanning-context family (autoplan.solve.context_span_family): ``autoplan solve``
chooses a cp group across two GPU types where no node holds the sequence (tests/data/cpu-span.yaml),
its split and recompute mode those of a brute force over every split, the plan valid, simulated as
predicted and accepted by the runtime (it trains equal to one process in
tests/test_context_parallel_runtime.py, ``solved_family_plan``); the family's pruned search
agrees with pricing every unit unpruned (oracle), whatever plan it is pruned against; and it is
not searched outside its space."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cluster.schema import Cluster
from autoplan.cost.context_span import ContextMember, ContextSpan
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Plan
from autoplan.plan.validate import plan_problems
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable
from autoplan.runtime.trainer import select_executor
from autoplan.simulate import simulate_plan
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.context_span import MODES, best_split, price_split, split_prices, token_splits
from autoplan.solve.context_span_family import (
    in_space,
    span_family,
    split_bound_ms,
    unit_bound_ms,
)
from autoplan.solve.context_span_plan import span_times

SPAN_CLUSTER = Path(__file__).resolve().parent / "data" / "cpu-span.yaml"
HF = SPAN_CLUSTER.parent / "hf"
SEQ = 64
# cp is searched from 8,192 tokens by default; the tiny model's 64 are long enough here.
OPTIONS = SolveOptions(cp_min_seq_len=SEQ)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return profile_model("gpt-tiny", SEQ, 1, "fp64")


def _doubled(cluster: Cluster) -> Cluster:
    """``cluster`` with two nodes of every group."""
    groups = [g.model_copy(update={"count": 2}) for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups, "name": f"{cluster.name}-2x"})


@functools.cache
def solved_family_dp_plan() -> Plan:
    """Two samples on two cpu-span node pairs: two spanning groups as data-parallel replicas
    (world 4), for the runtime test."""
    cluster = _doubled(load_cluster(SPAN_CLUSTER))
    return solve(profile_model("gpt-tiny", SEQ, 1, "fp64"), cluster, 2, OPTIONS)


@functools.cache
def solved_family_plan() -> Plan:
    """The plan ``autoplan solve`` writes on cpu-span (one sample), for the runtime test."""
    return solve(profile_model("gpt-tiny", SEQ, 1, "fp64"), load_cluster(SPAN_CLUSTER), 1, OPTIONS)


def test_solve_chooses_a_spanning_group_where_no_node_holds_the_sequence(
    profile: Profile,
) -> None:
    model = cost_model(profile, load_cluster(SPAN_CLUSTER), OPTIONS)
    layers = (0, len(profile.layers))
    for k in (0, 1):  # a rank holding the whole sequence fits neither type at any mode
        whole = ContextSpan((ContextMember(k, 1, SEQ),), 1)
        assert price_split(model, whole, 1, layers, 1) is None
    plan = solved_family_plan()
    (stage,) = plan.stages
    (replica,) = stage.replicas
    assert [plan.rank_map[r].gpu_type for r in replica.ranks] == ["cpu-fast", "cpu-slow"]
    tokens = replica.context_tokens
    assert tokens is not None and sum(tokens) == SEQ and tokens[0] > tokens[1]
    # Brute force: every pair of positive even counts summing to the sequence, every mode,
    # priced as the plan's iteration (one micro-batch of one sample).
    priced = []
    for t1 in range(2, SEQ, 2):
        span = ContextSpan((ContextMember(0, 1, t1), ContextMember(1, 1, SEQ - t1)), 1)
        for mode in MODES:
            found = price_split(model, span, 1, layers, 1, (mode,))
            if found is not None:
                priced.append((span_times(model, found, 1).iteration_ms, t1, mode))
    fastest = min(priced)
    assert len({t1 for _, t1, _ in priced}) > 1  # several splits fit: the choice is real
    assert plan.prediction.iteration_time_ms == pytest.approx(fastest[0], rel=1e-12)
    assert (tokens[0], replica.recompute) == (fastest[1], fastest[2])
    even = [p for p in priced if p[1] == SEQ // 2]
    assert not even or min(even)[0] > fastest[0]  # uneven chunks beat even ones
    assert plan_problems(plan, profile) == []
    assert simulate_plan(plan).iteration_time_ms == pytest.approx(
        plan.prediction.iteration_time_ms, rel=1e-9
    )
    check_runnable(plan)
    assert select_executor(plan) == "mesh"
    assert plan.search is not None and plan.search.lower_bound_ms <= fastest[0] * (1 + 1e-12)
    # The other families' best are its alternatives: a pipeline over the two nodes, slower.
    assert plan.alternatives and plan.alternatives[0].layer_split != [len(profile.layers)]
    assert plan.alternatives[0].iteration_time_ms > plan.prediction.iteration_time_ms


def test_two_spanning_groups_as_data_parallel_replicas() -> None:
    plan = solved_family_dp_plan()
    (stage,) = plan.stages
    assert len(stage.replicas) == 2
    first, second = stage.replicas
    assert first.context_tokens == second.context_tokens
    assert first.context_tokens is not None and first.context_tokens[0] > first.context_tokens[1]
    nodes = [{plan.rank_map[r].node for r in replica.ranks} for replica in stage.replicas]
    assert nodes[0].isdisjoint(nodes[1]) and all(len(n) == 2 for n in nodes)
    assert plan.parallelism.micro_batch_size == 2 and plan.parallelism.num_micro_batches == 1
    assert plan.mesh_shape() == (2, 2, 1)
    assert plan_problems(plan) == []
    assert simulate_plan(plan).iteration_time_ms == pytest.approx(
        plan.prediction.iteration_time_ms, rel=1e-9
    )
    check_runnable(plan)
    # Two groups a sample each beat one group taking both samples in turn.
    model = cost_model(plan_profile(), _doubled(load_cluster(SPAN_CLUSTER)), OPTIONS)
    one = span_family(model, 2, OPTIONS.model_copy(update={"dp": 1})).best
    assert one is not None and one.iteration_ms > plan.prediction.iteration_time_ms


def plan_profile() -> Profile:
    return profile_model("gpt-tiny", SEQ, 1, "fp64")


def _unpruned(model: CostModel, batch: int, pairs: int) -> tuple[float, tuple]:
    """The family's best by pricing every unit's every split and mode (``best_split`` at the
    plan's iteration), nothing pruned, on ``pairs`` node pairs of cpu-hetero's two classes:
    (iteration, (kinds, tp, SP, k, m, tokens, mode))."""
    best: tuple[float, tuple] = (math.inf, ())
    layers = (0, len(model.profile.layers))
    for tp in (1, 2):
        for n1 in range(1, 2 // tp + 1):
            for n2 in range(1, 2 // tp + 1):
                for sp, k in [(sp, k) for sp in ([False] if tp == 1 else [False, True])
                              for k in range(1, pairs + 1) if batch % k == 0]:  # fmt: skip
                    for micro in [b for b in (1, 2, 4) if (batch // k) % b == 0]:
                        m = batch // (k * micro)
                        kinds = ((0, n1), (1, n2))
                        found = best_split(
                            model,
                            kinds,
                            tp,
                            micro,
                            layers,
                            1,
                            MODES,
                            sp,
                            objective=lambda s, m=m, k=k: span_times(model, s, m, k).iteration_ms,
                        )
                        if found is None:
                            continue
                        time_ms = span_times(model, found, m, k).iteration_ms
                        key = (kinds, tp, sp, k, m, found.span.rank_tokens(), found.recompute)
                        if time_ms < best[0]:
                            best = (time_ms, key)
    return best


def _slow(cluster: Cluster) -> Cluster:
    """``cluster`` with its nodes joined at 0.5 MB/s: the ring's transfers set its steps."""
    return cluster.model_copy(update={"inter_node_bandwidth_gb_per_s": 0.0005})


@pytest.mark.parametrize(("pairs", "slow"), [(1, False), (2, False), (1, True), (2, True)])
def test_the_pruned_family_is_the_unpruned_enumeration(
    profile: Profile, pairs: int, slow: bool
) -> None:
    # cpu-hetero: two GPUs a node, so tp 1 and 2, one or two cp ranks a node, SP both ways,
    # micro-batches of 1, 2 and 4 samples of a batch of 4; with two nodes of each class, one
    # or two groups as data-parallel replicas; its link as shipped, or so slow that the
    # ring's transfers (which the bound counts) decide.
    cluster = load_cluster(example_cluster_path("cpu-hetero"))
    cluster = _slow(cluster) if slow else cluster
    model = cost_model(profile, cluster if pairs == 1 else _doubled(cluster), OPTIONS)
    expected_ms, (kinds, tp, sp, k, m, tokens, mode) = _unpruned(model, 4, pairs)
    assert math.isfinite(expected_ms)
    family = span_family(model, 4, OPTIONS)
    best = family.best
    assert best is not None and not family.timed_out
    assert best.iteration_ms == pytest.approx(expected_ms, rel=1e-12)
    found = (best.kinds, best.tp, best.sequence_parallel, best.replicas, best.num_micro_batches)
    assert found == (kinds, tp, sp, k, m)
    assert (best.split.span.rank_tokens(), best.split.recompute) == (tokens, mode)
    assert family.floor_ms == best.iteration_ms
    # Pruned against a plan held: the same best where it is faster than that plan ...
    held = span_family(model, 4, OPTIONS, incumbent_ms=expected_ms * 1.01)
    assert held.best == best and held.splits_priced <= family.splits_priced
    # (on the slow link the ring bound is so close that the family alone prices a few splits)
    assert slow or held.splits_priced < family.splits_priced
    # ... none where nothing of the family is, and a floor above the plan held (a bound).
    beaten = span_family(model, 4, OPTIONS, incumbent_ms=expected_ms * 0.99)
    assert beaten.best is None and expected_ms * 0.99 < beaten.floor_ms <= expected_ms


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_the_bound_is_below_every_split_at_every_mode(name: str) -> None:
    # The pruning's premise: no split of a unit, at any recompute mode, is faster than its
    # bound (a rank computes at least its share of the whole sequence, and the ring's steps
    # at the two ranks that send between the nodes take at least their attend or their
    # send), nor than its unit's bound. Every unit of cpu-hetero (tp 1 and 2, SP both ways,
    # 1-2 ranks a node, micro-batches 1, 2, 4 of 4), its link as shipped and so slow that
    # the ring's transfers decide.
    profile = profile_model(name, SEQ, 1, "fp64")
    shipped = load_cluster(example_cluster_path("cpu-hetero"))
    models = [cost_model(profile, cluster, OPTIONS) for cluster in (shipped, _slow(shipped))]
    layers = (0, len(profile.layers))
    checked = 0
    raised = False  # some split's bound on the slow link above twice its price as shipped
    for tp in (1, 2):
        for n1, n2 in [(a, b) for a in range(1, 2 // tp + 1) for b in range(1, 2 // tp + 1)]:
            for sp in [False] if tp == 1 else [False, True]:
                for micro in (1, 2, 4):
                    for model in models:
                        unit = unit_bound_ms(model, ((0, n1), (1, n2)), tp, micro, 4 // micro, sp)
                        for t1, t2 in token_splits((n1, n2), SEQ, tp, sp):
                            members = (ContextMember(0, n1, t1), ContextMember(1, n2, t2))
                            span = ContextSpan(members, tp)
                            bound = split_bound_ms(model, span, micro, 4 // micro, sp)
                            assert unit <= bound, (tp, n1, n2, sp, micro, t1)
                            for found in split_prices(model, span, micro, layers, 1, MODES, sp):
                                priced = span_times(model, found, 4 // micro).iteration_ms
                                assert bound <= priced, (tp, n1, n2, sp, micro, t1, found.recompute)
                                checked += 1
                                if model is models[0]:
                                    slow_bound = split_bound_ms(
                                        models[1], span, micro, 4 // micro, sp
                                    )
                                    raised |= slow_bound > 2 * priced
    assert checked > 1000 and raised


def test_the_bound_leaves_out_the_modes_that_cannot_fit(profile: Profile) -> None:
    # cpu-span: neither node holds the sequence, so memory decides which recompute modes a
    # split can take. The bound takes the least over the modes searched that may fit (their
    # saved activations, the share's exactly, within the GPU): every split at every mode that
    # fits prices at or above it and at or above its bound with that mode pinned, and some
    # splits fit no mode or only some.
    model = cost_model(profile, load_cluster(SPAN_CLUSTER), OPTIONS)
    layers = (0, len(profile.layers))
    fitting: set[int] = set()
    for micro in (1, 2):
        unit = unit_bound_ms(model, ((0, 1), (1, 1)), 1, micro, 2 // micro)
        for t1, t2 in token_splits((1, 1), SEQ):
            span = ContextSpan((ContextMember(0, 1, t1), ContextMember(1, 1, t2)), 1)
            bound = split_bound_ms(model, span, micro, 2 // micro)
            assert unit <= bound
            found = split_prices(model, span, micro, layers, 1, MODES)
            fitting.add(len(found))
            for split in found:
                assert bound <= span_times(model, split, 2 // micro).iteration_ms
            for mode in MODES:
                pinned = split_bound_ms(model, span, micro, 2 // micro, modes=(mode,))
                priced = [s for s in found if s.recompute == mode]
                if priced:
                    assert pinned <= span_times(model, priced[0], 2 // micro).iteration_ms
                    assert bound <= pinned
    assert 0 in fitting and fitting & {1, 2}


def test_llama_131k_the_ring_bound_prunes_every_split() -> None:
    # Llama-3.1-8B at 131,072 tokens, 8 samples on h100-a100-l4: without the ring in the
    # bound, two spanning groups as replicas were bounded at 23.9 s, below the plan the other
    # families find (30.8 s), and 134,536 splits were priced (53 CPU-s), every one slower.
    # With it every unit is bounded above that plan: none is priced.
    llama = profile_model(f"hf:{HF / 'llama-3.1-8b' / 'config.json'}", 131_072, 1, "bf16")
    options = SolveOptions()
    model = cost_model(llama, load_cluster(example_cluster_path("h100-a100-l4")), options)
    others = solve_candidates(model, 8, options).candidates
    held = min(c.iteration_ms for c in others if c.cost.feasible)
    family = span_family(model, 8, options, held)
    assert family.best is None and family.splits_priced == 0 and not family.timed_out
    assert held < family.floor_ms
    # The bound at this scale: a few splits of the units the compute bound ranked first
    # (H100 + A100, two groups of one or two nodes' ranks) price at or above it.
    layers = (0, len(llama.layers))
    ruled_out = 0
    for tp, n in ((8, 1), (4, 2)):
        unit = unit_bound_ms(model, ((0, n), (1, n)), tp, 1, 4, True)
        assert held < unit
        for t1, t2 in token_splits((n, n), 131_072, tp, True)[::4001]:
            span = ContextSpan((ContextMember(0, n, t1), ContextMember(1, n, t2)), tp)
            bound = split_bound_ms(model, span, 1, 4, True)
            assert unit <= bound
            for found in split_prices(model, span, 1, layers, 1, MODES, True):
                assert bound <= span_times(model, found, 4, 2).iteration_ms
            # Without recompute a rank's saved activations are its share of 125 GiB at tp 8
            # + SP (246 GiB at tp 4): memory alone rules mode none out of some splits, and
            # only where it does not fit.
            if split_bound_ms(model, span, 1, 4, True, ("none",)) == math.inf:
                assert not split_prices(model, span, 1, layers, 1, ("none",), True)
                ruled_out += 1
    assert ruled_out > 0


def test_outside_its_space_the_family_is_not_searched(profile: Profile) -> None:
    cluster = load_cluster(SPAN_CLUSTER)
    model = cost_model(profile, cluster, OPTIONS)
    assert in_space(model, OPTIONS)
    for options in (
        SolveOptions(),  # 64 tokens: below the default 8,192 where cp is searched
        OPTIONS.model_copy(update={"pp": 2}),
        OPTIONS.model_copy(update={"zero_stage": 1}),
        OPTIONS.model_copy(update={"space": "uniform"}),
        OPTIONS.model_copy(update={"strategy": "megatron"}),
        OPTIONS.model_copy(update={"cp": 1}),
    ):
        assert not in_space(model, options)
        assert span_family(model, 1, options).best is None
    # One GPU type: no group spans two.
    one_type = cost_model(profile, load_cluster(example_cluster_path("cpu-local")), OPTIONS)
    assert not in_space(one_type, OPTIONS)
    # With --pp 2 the solve writes a pipeline instead, as before the family.
    plan = solve(profile, cluster, 1, OPTIONS.model_copy(update={"pp": 2}))
    assert len(plan.stages) == 2 and all(r.context_tokens is None for r in plan.stages[0].replicas)


def test_a_pinned_cp_no_node_holds_spans_two_nodes(profile: Profile) -> None:
    # --cp 4 on cpu-hetero (two GPUs a node): no cp group of one node; the other families'
    # search at that degree is skipped (it divided by zero), the spanning family places two
    # ranks on each node, the faster type's holding more tokens.
    plan = solve(
        profile,
        load_cluster(example_cluster_path("cpu-hetero")),
        1,
        OPTIONS.model_copy(update={"cp": 4}),
    )
    ((replica,),) = [stage.replicas for stage in plan.stages]
    assert replica.context_parallel_degree == 4 and replica.context_tokens is not None
    types = [plan.rank_map[r].gpu_type for r in replica.ranks]
    assert types == ["cpu-fast", "cpu-fast", "cpu-slow", "cpu-slow"]
    tokens = replica.context_tokens
    assert sum(tokens) == SEQ and tokens[0] == tokens[1] > tokens[2] == tokens[3]
    assert plan_problems(plan, profile) == []
    assert plan.search is not None and plan.search.explored > 0
