"""``autoplan compare``: two plans side by side and the ratio of their predicted throughput."""

from __future__ import annotations

from rich.table import Table

from autoplan.plan.schema import Plan
from autoplan.view.plan_tables import micro_batch_sizes_text

__all__ = ["compare_rows", "compare_table"]


def _layer_split(plan: Plan) -> str:
    return " ".join(str(stage.layer_end - stage.layer_start) for stage in plan.stages)


def _peak_memory(plan: Plan) -> str:
    worst = max(plan.prediction.memory, key=lambda m: m.total_bytes / max(m.capacity_bytes, 1))
    return (
        f"{worst.total_bytes / 2**30:.2f} / {worst.capacity_bytes / 2**30:.0f} GiB "
        f"({worst.gpu_type})"
    )


def compare_rows(plan: Plan) -> dict[str, str]:
    """The facts compared, by row name."""
    par = plan.parallelism
    prediction = plan.prediction
    return {
        "model": plan.inputs.model.name,
        "cluster": plan.inputs.cluster.name,
        "strategy": plan.inputs.strategy,
        "GPUs used": str(par.world_size),
        "pp × dp × tp": f"{par.pipeline_degree} × {par.data_parallel_degree} × "
        f"{par.tensor_parallel_degree}",
        "schedule": f"{par.schedule} (v={par.virtual_stages_per_rank})",
        "micro-batches": str(par.num_micro_batches),
        "micro-batch size": micro_batch_sizes_text(par.replica_micro_batch_sizes),
        "global batch": str(plan.inputs.global_batch_size),
        "layers per stage": _layer_split(plan),
        "GPU per stage": " ".join("/".join(stage.gpu_types) for stage in plan.stages),
        "iteration ms": f"{prediction.iteration_time_ms:,.2f}",
        "samples/s": f"{prediction.samples_per_s:,.1f}",
        "tokens/s": f"{prediction.tokens_per_s:,.0f}",
        "MFU": f"{prediction.mfu:.1%}",
        "peak memory": _peak_memory(plan),
    }


def compare_table(first: Plan, second: Plan, names: tuple[str, str] = ("A", "B")) -> Table:
    """Rows of both plans, differing rows in bold, and the throughput ratio second / first."""
    rows_a, rows_b = compare_rows(first), compare_rows(second)
    table = Table(title="Plans compared", title_justify="left")
    table.add_column("")
    table.add_column(names[0])
    table.add_column(names[1])
    for key, value_a in rows_a.items():
        value_b = rows_b[key]
        table.add_row(key, value_a, value_b, style="bold" if value_a != value_b else "")
    ratio = second.prediction.samples_per_s / first.prediction.samples_per_s
    table.add_row(
        "throughput vs first",
        "1.00×",
        f"{ratio:.2f}×",
        style="bold green" if ratio > 1 else "bold",
    )
    return table
