"""``solve``: profile + cluster + global batch → the best executable Plan.

Public API: ``SolveOptions`` and ``solve`` (``solve_outcome`` also says whether the time limit
stopped the search). The search's driver is ``autoplan.solve.portfolio`` (every setting of
the knobs as one portfolio of runs under one deadline and one incumbent), its families are in
``autoplan.solve.search``, the cost model in ``autoplan.cost``, the algorithms in ``solvers``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import Cluster
from autoplan.cost.model import CostModel
from autoplan.errors import InfeasibleError, InputError
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.profile.schema import Profile
from autoplan.solve.async_pb import async_alternative, best_async
from autoplan.solve.async_plan import emit_async_plan
from autoplan.solve.baselines import equal_share_candidates, megatron_search
from autoplan.solve.certificate import search_record, work_bound_ms
from autoplan.solve.context_span_family import span_choice_plan, with_span_family
from autoplan.solve.deadline import Deadline
from autoplan.solve.diagnose import (
    diagnose_before_search,
    diagnose_infeasible,
    diagnose_megatron_infeasible,
)
from autoplan.solve.emit import emit_plan
from autoplan.solve.granularity import block_seed_profile
from autoplan.solve.host_memory import host_memory_diagnosis
from autoplan.solve.options import SolveOptions
from autoplan.solve.portfolio import portfolio_search
from autoplan.solve.progress import report_bound
from autoplan.solve.ranking import Candidate, SearchResult

__all__ = [
    "SolveOptions",
    "SolveOutcome",
    "cost_model",
    "solve",
    "solve_candidates",
    "solve_outcome",
]

logger = logging.getLogger(__name__)


def cost_model(profile: Profile, cluster: Cluster, options: SolveOptions) -> CostModel:
    """The cost model of ``profile`` on ``cluster`` with the options' efficiency overrides
    and memory reserve, costing plans as the options' engine runs them."""
    specs = gpu_specs(cluster)
    if options.reserve_gb is not None:
        reserve_gib = options.reserve_gb * 1e9 / 1024**3
        specs = {
            name: spec.model_copy(update={"memory_reserve_gib": reserve_gib})
            for name, spec in specs.items()
        }
    for name in sorted({group.gpu for group in cluster.node_groups} & set(specs)):
        spec = specs[name]
        if spec.memory_reserve_gib >= spec.memory_gib:
            # Said here: the search would only report that nothing fits in memory.
            raise InputError(
                f"the memory reserve ({spec.memory_reserve_gib:g} GiB) leaves nothing of "
                f"{name}'s {spec.memory_gib:g} GiB (--reserve-gb or the cluster's "
                "memory_reserve_gib)"
            )
    unknown = sorted(set(options.efficiency) - set(specs))
    if unknown:
        raise InputError(f"efficiency given for unknown GPU types {unknown}")
    for name, value in options.efficiency.items():
        if not 0 < value <= 1:
            raise InputError(f"efficiency of {name} must be in (0, 1]; got {value}")
    return CostModel(profile, cluster, specs, efficiency=options.efficiency).with_engine(
        options.engine
    )


def _check_options(profile: Profile, global_batch_size: int, options: SolveOptions) -> None:
    layers = len(profile.layers)
    if options.schedule == "async_pb":
        raise InputError(
            "--schedule async_pb is not searched as a plan (it changes the optimisation): "
            "--allow-async reports its predicted throughput beside the synchronous plan"
        )
    if global_batch_size < 1:
        raise InputError(f"global batch size must be >= 1; got {global_batch_size}")
    if options.layer_split is not None:
        if sum(options.layer_split) != layers or min(options.layer_split) < 1:
            raise InputError(
                f"--layer-split {options.layer_split} must be positive and add up to the "
                f"model's {layers} layers"
            )
        if options.pp is not None and options.pp != len(options.layer_split):
            raise InputError(
                f"--pp {options.pp} disagrees with --layer-split of {len(options.layer_split)} "
                "stages"
            )


def solve_candidates(
    model: CostModel,
    global_batch_size: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    deadline: Deadline | None = None,
) -> SearchResult:
    """The ranked candidates of the options' strategy (best first); no plan is built.
    ``deadline``: when every run of the search stops (default: the options' time limit from
    now), shared out among them (``autoplan.solve.deadline``)."""
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    if options.strategy == "megatron":
        return megatron_search(model, global_batch_size, options)
    # At sub-block grain the block-grain plan seeds the search (autoplan.solve.granularity).
    seed = block_seed_profile(model.profile, options)
    block_model = None if seed is None else cost_model(seed, model.cluster, options)
    # Every cp, ep and SP setting as one portfolio of runs (autoplan.solve.portfolio).
    result = portfolio_search(model, block_model, global_batch_size, options, progress, deadline)
    if options.strategy == "data-parallel":
        extra = equal_share_candidates(model, global_batch_size, options)
        merged = sorted(result.candidates + extra, key=lambda c: c.iteration_ms)
        result = SearchResult(
            merged[: options.top_k + 1],
            result.configs_considered,
            result.partitions_solved,
            result.timed_out,
            0.0,  # a baseline: no bound over its rule's space is claimed
        )
    return result


@dataclass(frozen=True)
class SolveOutcome:
    """A solve's plan and what the search says about it beyond the plan itself."""

    plan: Plan
    timed_out: bool  # the time limit stopped the search: the best found, not proven optimal
    violation: str | None  # why the plan does not fit (a baseline's best may not), else None
    async_plan: Plan | None = None  # with allow_async: the async alternative as a plan
    elapsed_s: float = 0.0  # wall-clock time of the solve (not in the plan: it is deterministic)


def solve_outcome(
    profile: Profile,
    cluster: Cluster,
    global_batch_size: int,
    options: SolveOptions,
    *,
    profile_sha256: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> SolveOutcome:
    """``solve``, also saying whether the time limit stopped the search and whether the plan
    fits (a baseline's best may not: it is returned all the same, with its first violation).

    Raises InfeasibleError naming the binding constraint when no plan exists.
    """
    _check_options(profile, global_batch_size, options)
    started = time.monotonic()
    deadline = Deadline.after(options.time_limit_s)  # the whole solve's, every family's
    model = cost_model(profile, cluster, options)
    # Said before a search that cannot succeed runs to its time limit.
    if options.strategy != "megatron" and (early := diagnose_before_search(model, options)):
        raise InfeasibleError(early.message, short=early.short)
    if options.strategy == "optimal":
        report_bound(work_bound_ms(model, global_batch_size, options))  # for a progress line
    result = solve_candidates(model, global_batch_size, options, progress, deadline)
    # A cp group across two GPU types (autoplan.solve.context_span_family), where it wins.
    result, spanning = with_span_family(model, global_batch_size, options, result, deadline.at)
    feasible: list[Candidate] = [c for c in result.candidates if c.cost.feasible]
    if not result.candidates and spanning is None:
        diagnose = (
            diagnose_megatron_infeasible if options.strategy == "megatron" else diagnose_infeasible
        )
        found = diagnose(model, global_batch_size, options)
        # Nothing fits in memory: host memory may be what binds. Not after a time-out: the
        # diagnosis reruns the search, which would take as long again.
        if not found.proven and not result.timed_out:
            found = (
                host_memory_diagnosis(model, global_batch_size, options, solve_candidates) or found
            )
        if result.timed_out and not found.proven:
            # Not proof that nothing fits: the search stopped before it found anything.
            raise InfeasibleError(
                f"the time limit ({options.time_limit_s:g} s) stopped the search before it "
                "found a plan; give it more with --time-limit",
                short="time limit: no plan found",
            )
        raise InfeasibleError(found.message, short=found.short)
    violation = None
    if not feasible and spanning is None:
        violation = result.candidates[0].cost.violations[0]
        logger.warning("the %s plan does not fit: %s", options.strategy, violation)
        feasible = result.candidates
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256=profile_sha256,
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=cluster,
        global_batch_size=global_batch_size,
        strategy=options.strategy,
        pinned=options.pinned(),
        engine=options.engine,
    )
    try:
        if spanning is not None:
            plan = span_choice_plan(model, inputs, spanning, feasible[: options.top_k])
        else:
            best, runners = feasible[0], feasible[1 : options.top_k + 1]
            plan = emit_plan(
                model, best.config, best.cost, inputs, [(c.config, c.cost) for c in runners]
            )
    except ValueError as error:  # a bug: the search only proposes what fits the nodes
        raise InfeasibleError(
            f"the {options.strategy} plan cannot be placed: {error}", short="cannot be placed"
        ) from None
    if options.strategy == "optimal":
        # The certificate: the search's proven bound beside the plan it chose.
        record = search_record(
            plan.prediction.iteration_time_ms,  # the figure the plan states
            result.lower_bound_ms,
            result.timed_out,
            result.configs_considered + result.partitions_solved,
        )
        plan = plan.model_copy(update={"search": record})
    async_plan = None
    if options.allow_async and spanning is None:
        choice = best_async(model, feasible)
        if choice is not None:
            plan = async_alternative(model, plan, choice)
            async_plan = emit_async_plan(model, choice, inputs)
    elapsed = time.monotonic() - started
    return SolveOutcome(plan, result.timed_out, violation, async_plan, elapsed)


def solve(
    profile: Profile,
    cluster: Cluster,
    global_batch_size: int,
    options: SolveOptions,
    *,
    profile_sha256: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """The best plan under ``options`` (pinned knobs restrict the search).

    Raises InfeasibleError naming the binding constraint when no plan exists.
    """
    return solve_outcome(
        profile,
        cluster,
        global_batch_size,
        options,
        profile_sha256=profile_sha256,
        progress=progress,
    ).plan
