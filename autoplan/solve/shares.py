"""Single-stage plans whose replicas run on several device classes with uneven shares.

The shares come from the integer program of ``solvers.share_ilp``, once per (tp, set of
classes, ZeRO level); every tp group of each class in the set is a replica. The levels are
``space.zero_levels``'s, as for every other stage: 1 free, 2 and 3 sharding weights and
gradients for collectives per micro-batch (``autoplan.cost.sharding``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.devices import block_sizes
from autoplan.cost.model import CostModel
from autoplan.cost.offload import group_of
from autoplan.cost.sharding import exposed_ms
from autoplan.cost.totals import ModelTotals
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import (
    MAX_SHARE_MICRO_BATCH,
    divisors,
    recompute_modes,
    tp_choices,
    zero_levels,
)
from solvers.share_ilp import ShareClass, ShareProblem, share_search

__all__ = ["SharedResult", "share_sizes", "shared_candidates", "shared_search"]


@dataclass(frozen=True)
class SharedResult:
    """The family's best plan per (tp, classes, ZeRO level), and whether every one of them
    was solved to optimality (else the family's floor is only the work bound)."""

    configs: list[PlanConfig]
    complete: bool


def shared_candidates(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    time_limit_s: float,
    deadline: float | None = None,
) -> list[PlanConfig]:
    """Single-stage plans with uneven shares over two or more classes (``share_ilp``); none
    more once ``deadline`` (``time.monotonic()``) has passed (the search's own time limit,
    which the uniform search before it has then hit and reported too)."""
    return shared_search(model, batch, options, time_limit_s, deadline).configs


def shared_search(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    time_limit_s: float,
    deadline: float | None = None,
    tensor_parallel_only: bool = False,
) -> SharedResult:
    """``shared_candidates``, saying whether the family was searched to the end;
    ``tensor_parallel_only``: only plans with tp > 1 (as ``uniform_search`` takes it)."""
    if options.strategy not in ("optimal",) or options.micro_batch_size is not None:
        return SharedResult([], True)
    if (options.pp not in (None, 1)) or options.layer_split is not None:
        return SharedResult([], True)
    if options.schedule not in (None, "1f1b"):
        return SharedResult([], True)
    modes = recompute_modes(options)
    found: list[PlanConfig] = []
    complete = True
    for tp in tp_choices(model, options):
        if tensor_parallel_only and tp == 1:
            continue
        usable = [c.index for c in model.classes if tp in block_sizes(c.gpus_per_node)]
        for size in range(2, len(usable) + 1):
            for subset in itertools.combinations(usable, size):
                replicas = [model.classes[k].total_gpus // tp for k in subset]
                dp = sum(replicas)
                if options.dp is not None and dp != options.dp:
                    continue
                if any(n % model.expert_parallel for n in replicas):
                    continue  # expert groups of ep replicas (autoplan.solve.expert_parallel)
                # Every level the runtime runs (the groups executor shards ZeRO-2/3 with
                # FSDP2), one share program each: the levels trade memory for collectives.
                for level in zero_levels(dp, True, options):
                    if deadline is not None and time.monotonic() >= deadline:
                        return SharedResult(found, False)
                    config, proven = _solve_shares_for(
                        model, batch, options, tp, subset, replicas, level, modes, time_limit_s
                    )
                    complete = complete and proven
                    if config is not None:
                        found.append(config)
    return SharedResult(found, complete)


def share_sizes(
    model: CostModel,
    tp: int,
    dp: int,
    zero1: int,
    k: int,
    limit: int,
    modes: tuple[str, ...],
    collective_ms: float = 0.0,
) -> dict[int, tuple[float, float, str]]:
    """For class k in a shared plan: per micro-batch size b that fits, (time, backward,
    recompute) with the fastest recompute that fits, at ZeRO level ``zero1`` (0-3) over the
    ``dp`` replicas; under ZeRO-2/3 the times include what one all-gather (or reduce-scatter)
    of ``collective_ms`` exposes per pass (``autoplan.cost.sharding``)."""
    out = {}
    level = int(zero1)
    per_param = model.static_bytes_per_param(dp, level)
    usable = model.usable_bytes(k) - model.zero_transient_bytes(tp, dp, level)
    overhead = model.pass_overhead_ms(k)
    host = model.host_budget_bytes(k)
    for b in range(1, limit + 1):
        # Whole-model sums only (``CostModel.totals``): the per-layer tables are not built.
        t = model.totals(k, tp, b)
        static = t.params * per_param
        best = None
        # The fastest mode that fits, by its work (with offload the order is the hardware's;
        # ties in the space's order: a stable sort), so the slower modes' memory is never
        # costed; the collectives it exposes are added after, as in hetero.
        for mode in sorted(modes, key=t.work):
            act = t.saved(mode)
            if static + act > usable or t.parked(mode) > host:
                continue  # or offload parks more than the GPU's share of host memory
            if static + act + _largest_transient(model, t, k, tp, b, mode) <= usable:
                best = (t.work(mode) + 2 * overhead, t.backward(mode) + overhead, mode)
                break
        if best is None:
            break  # larger micro-batches need more memory still
        work, backward, mode = best
        if dp > 1:
            forward_extra, backward_extra = exposed_ms(
                level, collective_ms, work - backward, backward
            )
            work, backward = work + forward_extra + backward_extra, backward + backward_extra
        out[b] = (work, backward, mode)
    return out


def _largest_transient(
    model: CostModel, totals: ModelTotals, k: int, tp: int, b: int, mode: str
) -> float:
    """The largest transient of the model's layers under ``mode`` on ``totals`` (class k at
    tp and micro-batch b): the same for every ZeRO level, dp and set of classes that
    ``share_sizes`` is asked for, so kept in the model (with the totals it was computed on,
    compared by identity: totals rebuilt after the model's cache evicted them are
    recomputed)."""
    cache: dict[tuple[object, ...], tuple[ModelTotals, float]] = vars(model).setdefault(
        "_share_transient_cache", {}
    )
    key = (k, tp, b, mode, model.engine)
    hit = cache.get(key)
    if hit is not None and hit[0] is totals:
        return hit[1]
    value = max(model.transient_bytes(c, mode) for c in totals.layers)
    cache[key] = (totals, value)
    return value


def _solve_shares_for(model, batch, options, tp, subset, replicas, zero1, modes, limit_s):
    """(the best plan or None, whether that is proven)."""
    total = sum(replicas)
    counts = [m for m in divisors(batch) if batch // m >= total]
    if options.num_micro_batches is not None:
        counts = [m for m in counts if m == options.num_micro_batches]
    if not counts:
        return None, True
    params = model.totals(subset[0], tp, 1).params
    probe = tuple(group_of(k, tp, n, 1, modes[0]) for k, n in zip(subset, replicas, strict=True))
    # ZeRO-2/3 reduce-scatter in every backward: no all-reduce is left for the tail.
    allreduce = model.allreduce_ms(probe, (params,) * len(probe)) if zero1 <= 1 else 0.0
    collective = model.zero_collective_ms(probe, (params,) * len(probe)) if zero1 >= 2 else 0.0
    tables = {}
    for k, n in zip(subset, replicas, strict=True):
        limit = min(MAX_SHARE_MICRO_BATCH, (batch // min(counts) - (total - n)) // n)
        tables[k] = share_sizes(model, tp, total, zero1, k, limit, modes, collective)
        if not tables[k]:
            return None, True
    optimizer = max(
        model.optimizer_ms(params, k, total, zero1) + model.step_overhead_ms(k) for k in subset
    )
    # One stage of one tp: one mesh holds it, shares and types whatever they are, and its DDP
    # hides the all-reduce behind the last backward (per-stage groups under an ep view).
    executor = model.stage_executor(model.uniform_executor(), probe)
    hides = model.hides_allreduce and executor == "mesh"
    problem = ShareProblem(
        global_batch=batch,
        micro_batch_counts=tuple(counts),
        classes=tuple(
            # The ILP's exposure is the all-reduce less the shortest backward; where nothing
            # hides behind it (an engine that never overlaps, ``CostModel.hides_allreduce``,
            # or the groups executor), it hides behind 0.
            ShareClass(n, {b: (v[0], v[1] if hides else 0.0) for b, v in tables[k].items()})
            for k, n in zip(subset, replicas, strict=True)
        ),
        allreduce_ms=allreduce,
        optimizer_ms=optimizer,
    )
    searched = share_search(problem, time_limit_s=limit_s)
    solution = searched.solution
    if solution is None:
        return None, searched.proven
    groups = tuple(
        sorted(
            group_of(k, tp, n, b, tables[k][b][2])
            for k, n, b in zip(subset, replicas, solution.sizes, strict=True)
        )
    )
    config = PlanConfig(
        solution.num_micro_batches,
        "1f1b",
        1,
        (StageChoice(0, model.num_layers, groups, int(zero1)),),
        executor=model.uniform_executor(),
    )
    return config, searched.proven
