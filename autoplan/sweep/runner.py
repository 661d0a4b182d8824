"""Solve one cluster file at several sizes (and global batches) and price each run.

For each node count (``scale.py`` says how the cluster is scaled) and each global batch, one
``solve`` under the same options, with its own time limit. What a run costs: its cluster's
GPUs of each type (idle ones too: nodes are rented whole) × that type's price per GPU-hour ×
the time to train ``train_tokens`` at the predicted tokens/s. A configuration without a plan is
a row that says why (``InfeasibleError.short``), never an exception.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

from autoplan import limits
from autoplan.cluster.schema import Cluster
from autoplan.errors import InfeasibleError, InputError
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, solve_outcome
from autoplan.sweep.scale import check_gpu_mix, scale_cluster
from autoplan.sweep.schema import SweepRow

__all__ = ["DEFAULT_TRAIN_TOKENS", "Configuration", "configurations", "run_sweep"]

DEFAULT_TRAIN_TOKENS = 1e12

# (nodes, global batch); a batch of None is one sample per GPU of that configuration.
Configuration = tuple[int, int | None]


def configurations(
    nodes: Sequence[int], global_batches: Sequence[int] | None = None
) -> list[Configuration]:
    """Every (nodes, global batch) pair, nodes in increasing order and each batch in the order
    given; repeats dropped. InputError if a list is empty, a value is out of range or there
    are more than ``limits.MAX_SWEEP_CONFIGURATIONS`` pairs."""
    if not nodes:
        raise InputError("--nodes needs at least one node count")
    for count in nodes:
        if not 1 <= count <= limits.MAX_CLUSTER_NODES:
            raise InputError(f"--nodes takes 1 to {limits.MAX_CLUSTER_NODES:,} nodes; got {count}")
    batches: list[int | None] = [None]
    if global_batches is not None:
        if not global_batches:
            raise InputError("--global-batch needs at least one batch size")
        for batch in global_batches:
            if not 1 <= batch <= limits.MAX_GLOBAL_BATCH_SIZE:
                raise InputError(
                    f"--global-batch takes 1 to {limits.MAX_GLOBAL_BATCH_SIZE:,} samples; "
                    f"got {batch}"
                )
        batches = list(dict.fromkeys(global_batches))
    pairs = [(count, batch) for count in sorted(set(nodes)) for batch in batches]
    if len(pairs) > limits.MAX_SWEEP_CONFIGURATIONS:
        raise InputError(
            f"{len(pairs)} configurations (node counts × global batches); a sweep takes at most "
            f"{limits.MAX_SWEEP_CONFIGURATIONS}"
        )
    return pairs


def _check_prices(prices: dict[str, float], gpu_types: set[str]) -> None:
    for name, price in prices.items():
        if name not in gpu_types:
            raise InputError(
                f"--price names GPU type {name!r}, which no configuration has "
                f"(types: {', '.join(sorted(gpu_types))})"
            )
        if not 0 <= price <= limits.MAX_PRICE_USD_PER_HOUR:  # NaN fails too
            raise InputError(
                f"--price of {name} must be 0 to {limits.MAX_PRICE_USD_PER_HOUR:g} USD per "
                f"GPU-hour; got {price}"
            )
    missing = sorted(gpu_types - set(prices))
    if prices and missing:
        # A cost that leaves out some GPUs would look cheaper than it is.
        raise InputError(f"--price gives no price for {', '.join(missing)}: price every type")


def _gpus_by_type(cluster: Cluster) -> dict[str, int]:
    out: dict[str, int] = {}
    for group in cluster.node_groups:
        out[group.gpu] = out.get(group.gpu, 0) + group.count * group.gpus_per_node
    return out


def _solve_row(
    profile: Profile,
    cluster: Cluster,
    nodes: int,
    batch: int,
    per_gpu: bool,
    train_tokens: float,
    prices: dict[str, float],
    options: SolveOptions,
    profile_sha256: str,
) -> SweepRow:
    gpus = _gpus_by_type(cluster)
    # The fields every row of this configuration has, feasible or not.
    row = functools.partial(
        SweepRow,
        nodes=nodes,
        global_batch_size=batch,
        batch_per_gpu=per_gpu,
        cluster_name=cluster.name,
        node_counts={group.name: group.count for group in cluster.node_groups},
        gpus=gpus,
        train_tokens=train_tokens,
    )
    start = time.perf_counter()
    try:
        outcome = solve_outcome(profile, cluster, batch, options, profile_sha256=profile_sha256)
    except InfeasibleError as error:
        return row(
            feasible=False,
            note=error.short,
            reason=str(error),
            solve_time_s=time.perf_counter() - start,
        )
    elapsed = time.perf_counter() - start
    if outcome.violation is not None:
        # A baseline's best that does not fit would run out of memory: no figures to show.
        return row(
            feasible=False,
            note=f"{options.strategy} plan does not fit in memory",
            reason=outcome.violation,
            solve_time_s=elapsed,
        )
    plan = outcome.plan
    used: dict[str, int] = {}
    for entry in plan.rank_map:
        used[entry.gpu_type] = used.get(entry.gpu_type, 0) + 1
    notes = []
    if plan.search is not None:
        notes.append(plan.search.words())
    elif outcome.timed_out:
        notes.append("time limit: best found")
    idle = [f"{g.count} {g.gpu_type}" for g in plan.prediction.idle_gpus]
    if idle:
        notes.append(f"idle {', '.join(idle)}")
    tokens_per_s = plan.prediction.tokens_per_s
    train_time_s = train_tokens / tokens_per_s
    usd_per_hour = sum(count * prices[gpu] for gpu, count in gpus.items()) if prices else None
    return row(
        gpus_used=used,
        feasible=True,
        note="; ".join(notes),
        timed_out=outcome.timed_out,
        search_status=None if plan.search is None else plan.search.status,
        gap=None if plan.search is None else plan.search.gap,
        tokens_per_s=tokens_per_s,
        samples_per_s=plan.prediction.samples_per_s,
        mfu=plan.prediction.mfu,
        iteration_time_ms=plan.prediction.iteration_time_ms,
        pipeline_degree=plan.parallelism.pipeline_degree,
        train_time_s=train_time_s,
        usd_per_hour=usd_per_hour,
        cost_usd=None if usd_per_hour is None else usd_per_hour * train_time_s / 3600,
        solve_time_s=elapsed,
    )


def run_sweep(
    profile: Profile,
    cluster: Cluster,
    nodes: Sequence[int],
    global_batches: Sequence[int] | None = None,
    *,
    gpu_mix: dict[str, float] | None = None,
    train_tokens: float = DEFAULT_TRAIN_TOKENS,
    prices: dict[str, float] | None = None,
    options: SolveOptions | None = None,
    profile_sha256: str = "",
    progress: Callable[[int, int, str], None] | None = None,
) -> list[SweepRow]:
    """One row per configuration (``configurations``), in that order.

    ``gpu_mix`` (GPU type → fraction of the nodes) replaces proportional scaling; ``prices``
    (GPU type → USD per GPU-hour) must price every type of every configuration, or be empty;
    ``options`` apply to every solve (its ``time_limit_s`` to each). ``progress(done, total,
    label)`` is called before each configuration and once at the end. Every input is checked
    before the first solve: InputError names the first problem."""
    options = options or SolveOptions()
    pairs = configurations(nodes, global_batches)
    if not (1 <= train_tokens <= limits.MAX_TRAIN_TOKENS and math.isfinite(train_tokens)):
        raise InputError(f"--tokens must be 1 to {limits.MAX_TRAIN_TOKENS:g}; got {train_tokens}")
    if gpu_mix is not None:
        check_gpu_mix(cluster, gpu_mix)
    scaled = {count: scale_cluster(cluster, count, gpu_mix) for count, _ in pairs}
    types = {gpu for c in scaled.values() for gpu in _gpus_by_type(c)}
    _check_prices(prices or {}, types)
    rows = []
    for index, (count, batch) in enumerate(pairs):
        sized = scaled[count]
        samples = batch if batch is not None else sized.total_gpus()
        if progress is not None:
            progress(index, len(pairs), f"{count} nodes, batch {samples}")
        rows.append(
            _solve_row(
                profile,
                sized,
                count,
                samples,
                batch is None,
                train_tokens,
                prices or {},
                options,
                profile_sha256,
            )
        )
    if progress is not None:
        progress(len(pairs), len(pairs), "done")
    return rows
