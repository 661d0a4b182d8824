"""``autoplan show``: a plan's shape, stages, time breakdown and runners-up as rich tables."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table

from autoplan.plan.schema import Plan
from autoplan.view.memory_bars import memory_table

__all__ = [
    "alternatives_table",
    "breakdown_table",
    "micro_batch_sizes_text",
    "plan_overview",
    "plan_renderables",
    "stages_table",
]


def _count(number: int) -> str:
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if number >= size:
            return f"{number / size:,.2f} {suffix}"
    return str(number)


def micro_batch_sizes_text(sizes: list[int]) -> str:
    """Per-replica micro-batch sizes, runs collapsed: [1]*16 → '1 × 16', [3, 3, 1] → '3 × 2, 1'."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ", ".join(f"{size} × {count}" if count > 1 else str(size) for size, count in runs)


def plan_overview(plan: Plan, title: str = "Plan") -> Table:
    """Two columns of key facts: model, cluster, parallelism, batch and predicted speed."""
    par = plan.parallelism
    inputs = plan.inputs
    prediction = plan.prediction
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    shares = micro_batch_sizes_text(par.replica_micro_batch_sizes)
    rows = [
        (
            "model",
            f"{inputs.model.name} ({inputs.model.num_layers} layers, "
            f"{inputs.model.parameter_count / 1e6:,.1f} M parameters)",
        ),
        ("cluster", f"{inputs.cluster.name}: {len(plan.nodes)} nodes, {par.world_size} GPUs used"),
        ("strategy", inputs.strategy),
        (
            "parallelism",
            f"pp={par.pipeline_degree} dp={par.data_parallel_degree} "
            f"tp={par.tensor_parallel_degree} virtual stages/rank={par.virtual_stages_per_rank}"
            f"{' ZeRO-1' if par.zero1 else ''}",
        ),
        ("schedule", f"{par.schedule}, {par.num_micro_batches} micro-batches per replica"),
        (
            "batch",
            f"global {inputs.global_batch_size} × seq {inputs.seq_len} ({inputs.dtype}); "
            f"micro-batch per replica: {shares}",
        ),
        ("iteration", f"{prediction.iteration_time_ms:,.2f} ms predicted"),
        (
            "throughput",
            f"{prediction.samples_per_s:,.1f} samples/s, {prediction.tokens_per_s:,.0f} tokens/s",
        ),
        (
            "efficiency",
            f"{prediction.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {prediction.mfu:.1%}",
        ),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table


def stages_table(plan: Plan) -> Table:
    """One row per stage: layers, where it runs, and its times per micro-batch."""
    par = plan.parallelism
    timing_of = {timing.stage: timing for timing in plan.prediction.stage_timings}
    nodes_of: dict[int, list[str]] = {}
    for entry in plan.rank_map:
        names = nodes_of.setdefault(entry.pipeline_rank, [])
        if entry.node not in names:
            names.append(entry.node)
    table = Table(title="Stages", title_justify="left")
    for column in ("stage", "rank", "layers", "#", "GPU", "nodes", "tp", "dp", "recompute"):
        table.add_column(
            column, justify="right" if column in ("stage", "rank", "#", "tp", "dp") else "left"
        )
    for column in ("fwd ms", "bwd ms", "send ms", "fwd+bwd ms / mb"):
        table.add_column(column, justify="right")
    for stage in plan.stages:
        timing = timing_of.get(stage.index)
        times = (
            [
                f"{timing.forward_ms:.3f}",
                f"{timing.backward_ms:.3f}",
                f"{timing.send_ms:.3f}",
                f"{timing.forward_ms + timing.backward_ms:.3f}",
            ]
            if timing
            else ["-"] * 4
        )
        table.add_row(
            str(stage.index),
            str(stage.pipeline_rank),
            f"{stage.layer_start}–{stage.layer_end - 1}",
            str(stage.layer_end - stage.layer_start),
            ", ".join(stage.gpu_types),
            ", ".join(nodes_of.get(stage.pipeline_rank, [])),
            str(par.tensor_parallel_degree),
            str(par.data_parallel_degree),
            stage.recompute,
            *times,
        )
    return table


def breakdown_table(plan: Plan) -> Table:
    """Where the predicted iteration time goes, in ms and share of the iteration."""
    breakdown = plan.prediction.breakdown
    total = plan.prediction.iteration_time_ms
    table = Table(title="Time per iteration (exposed)", title_justify="left")
    table.add_column("part")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    parts = [
        ("compute", breakdown.compute_ms),
        ("pipeline bubble", breakdown.bubble_ms),
        ("tensor-parallel comm", breakdown.tp_comm_ms),
        ("pipeline sends", breakdown.pp_comm_ms),
        ("data-parallel all-reduce", breakdown.dp_comm_ms),
        ("optimizer", breakdown.optimizer_ms),
    ]
    for name, ms in parts:
        table.add_row(name, f"{ms:,.2f}", f"{ms / total:.1%}")
    table.add_row("iteration (predicted)", f"{total:,.2f}", "", style="bold")
    return table


def alternatives_table(plan: Plan) -> Table:
    """The runners-up the solver kept, with their speed relative to the chosen plan."""
    table = Table(title="Alternatives", title_justify="left")
    for column in ("#", "knobs", "layers per stage", "GPU per stage"):
        table.add_column(column)
    for column in ("iteration ms", "samples/s", "vs chosen"):
        table.add_column(column, justify="right")
    chosen = plan.prediction.samples_per_s
    for alternative in plan.alternatives:
        table.add_row(
            str(alternative.rank),
            alternative.summary,
            " ".join(str(count) for count in alternative.layer_split),
            " ".join(alternative.gpu_types),
            f"{alternative.iteration_time_ms:,.2f}",
            f"{alternative.samples_per_s:,.1f}",
            f"{alternative.samples_per_s / chosen:.2f}×",
        )
    return table


def plan_renderables(plan: Plan, title: str = "Plan") -> list[RenderableType]:
    """Everything ``autoplan show`` prints, in order."""
    renderables: list[RenderableType] = [
        plan_overview(plan, title),
        stages_table(plan),
        memory_table(plan),
        breakdown_table(plan),
    ]
    if plan.alternatives:
        renderables.append(alternatives_table(plan))
    return renderables
