"""Single-stage plans whose replicas run on several device classes with uneven shares.

The shares come from the integer program of ``solvers.share_ilp``, once per (tp, set of
classes); every tp group of each class in the set is a replica.
"""

from __future__ import annotations

import itertools

from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.devices import block_sizes
from autoplan.cost.model import CostModel
from autoplan.cost.offload import group_of
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import MAX_SHARE_MICRO_BATCH, divisors, recompute_modes, tp_choices
from solvers.share_ilp import ShareClass, ShareProblem, solve_shares

__all__ = ["share_sizes", "shared_candidates"]


def shared_candidates(
    model: CostModel, batch: int, options: SolveOptions, time_limit_s: float
) -> list[PlanConfig]:
    """Single-stage plans with uneven shares over two or more classes (``share_ilp``)."""
    if options.strategy not in ("optimal",) or options.micro_batch_size is not None:
        return []
    if (options.pp not in (None, 1)) or options.layer_split is not None:
        return []
    if options.schedule not in (None, "1f1b"):
        return []
    modes = recompute_modes(options)
    found = []
    for tp in tp_choices(model, options):
        usable = [c.index for c in model.classes if tp in block_sizes(c.gpus_per_node)]
        for size in range(2, len(usable) + 1):
            for subset in itertools.combinations(usable, size):
                replicas = [model.classes[k].total_gpus // tp for k in subset]
                dp = sum(replicas)
                if options.dp is not None and dp != options.dp:
                    continue
                zero1 = dp > 1 and options.zero1 is not False
                if options.zero1 and dp == 1:
                    continue
                config = _solve_shares_for(
                    model, batch, options, tp, subset, replicas, zero1, modes, time_limit_s
                )
                if config is not None:
                    found.append(config)
    return found


def share_sizes(
    model: CostModel, tp: int, dp: int, zero1: bool, k: int, limit: int, modes: tuple[str, ...]
) -> dict[int, tuple[float, float, str]]:
    """For class k in a shared plan: per micro-batch size b that fits, (time, backward,
    recompute) with the fastest recompute that fits."""
    out = {}
    n = model.num_layers
    per_param = model.static_bytes_per_param(dp, zero1)
    overhead = model.pass_overhead_ms(k)
    for b in range(1, limit + 1):
        t = model.tables(k, tp, b)
        static = t.params[n] * per_param
        for mode in modes:
            act = t.saved[mode][n]
            if t.parked[mode][n] > model.host_budget_bytes(k):
                continue  # offload parks more than the GPU's share of host memory
            transient = max(model.transient_bytes(c, mode) for c in t.layers)
            # The fastest mode that fits (with offload the order is the hardware's).
            if static + act + transient <= model.usable_bytes(k) and (
                b not in out or t.work[mode][n] + 2 * overhead < out[b][0]
            ):
                out[b] = (t.work[mode][n] + 2 * overhead, t.backward[mode][n] + overhead, mode)
        if b not in out:
            break  # larger micro-batches need more memory still
    return out


def _solve_shares_for(model, batch, options, tp, subset, replicas, zero1, modes, limit_s):
    total = sum(replicas)
    counts = [m for m in divisors(batch) if batch // m >= total]
    if options.num_micro_batches is not None:
        counts = [m for m in counts if m == options.num_micro_batches]
    if not counts:
        return None
    tables = {}
    for k, n in zip(subset, replicas, strict=True):
        limit = min(MAX_SHARE_MICRO_BATCH, (batch // min(counts) - (total - n)) // n)
        tables[k] = share_sizes(model, tp, total, zero1, k, limit, modes)
        if not tables[k]:
            return None
    params = model.tables(subset[0], tp, 1).params[-1]
    probe = tuple(group_of(k, tp, n, 1, modes[0]) for k, n in zip(subset, replicas, strict=True))
    allreduce = model.allreduce_ms(probe, (params,) * len(probe))
    optimizer = max(
        model.optimizer_ms(params, k, total, zero1) + model.step_overhead_ms(k) for k in subset
    )
    problem = ShareProblem(
        global_batch=batch,
        micro_batch_counts=tuple(counts),
        classes=tuple(
            ShareClass(n, {b: (v[0], v[1]) for b, v in tables[k].items()})
            for k, n in zip(subset, replicas, strict=True)
        ),
        allreduce_ms=allreduce,
        optimizer_ms=optimizer,
    )
    solution = solve_shares(problem, time_limit_s=limit_s)
    if solution is None:
        return None
    groups = tuple(
        sorted(
            group_of(k, tp, n, b, tables[k][b][2])
            for k, n, b in zip(subset, replicas, solution.sizes, strict=True)
        )
    )
    return PlanConfig(
        solution.num_micro_batches,
        "1f1b",
        1,
        (StageChoice(0, model.num_layers, groups, int(zero1)),),
    )
