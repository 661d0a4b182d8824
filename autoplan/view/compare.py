"""``autoplan compare``: two plans side by side and the ratio of their predicted throughput."""

from __future__ import annotations

from autoplan.plan.schema import Plan
from autoplan.view.document import Document, Figure, Section
from autoplan.view.plan_tables import (
    engine_text,
    gpus_text,
    micro_batch_text,
    replicas_text,
    strategy_text,
)
from autoplan.view.units import bytes_text, duration_text, percent_text, rate_text

__all__ = ["compare_document", "compare_rows"]


def _peak_memory(plan: Plan) -> str:
    if not plan.prediction.memory:
        return "-"
    worst = max(
        plan.prediction.memory,
        key=lambda m: (m.total_bytes + m.reserved_bytes) / max(m.capacity_bytes, 1),
    )
    return (
        f"{bytes_text(worst.total_bytes + worst.reserved_bytes)} of "
        f"{bytes_text(worst.capacity_bytes)} ({worst.gpu_type} tp{worst.tensor_parallel_degree}, "
        f"rank {worst.pipeline_rank})"
    )


def _replicas_per_stage(plan: Plan) -> str:
    """Consecutive stages with the same replicas folded:
    's0-3: cpu tp1 × 2 (micro-batch 2 each)'."""
    runs: list[list] = []
    types = {entry.rank: entry.gpu_type for entry in plan.rank_map}
    for stage in plan.stages:
        text = replicas_text(stage, types)
        if runs and runs[-1][2] == text:
            runs[-1][1] = stage.index
        else:
            runs.append([stage.index, stage.index, text])
    return "; ".join(
        f"s{first}: {text}" if first == last else f"s{first}-{last}: {text}"
        for first, last, text in runs
    )


def compare_rows(plan: Plan) -> dict[str, str]:
    """The facts compared, by row name."""
    par = plan.parallelism
    prediction = plan.prediction
    idle = prediction.idle_gpus
    return {
        "model": plan.inputs.model.name,
        "cluster": plan.inputs.cluster.name,
        "strategy": strategy_text(plan.inputs.strategy),
        "priced for": engine_text(plan.inputs.engine, plan.parallelism.executor),
        "GPUs used": gpus_text(plan),
        "pipeline ranks": str(par.pipeline_degree),
        "schedule": f"{par.schedule} (v={par.virtual_stages_per_rank})",
        "micro-batches": str(par.num_micro_batches),
        "micro-batch": micro_batch_text(plan),
        "global batch": str(plan.inputs.global_batch_size),
        "layers per stage": " ".join(f"{s.layer_start}-{s.layer_end - 1}" for s in plan.stages),
        "replicas per stage": _replicas_per_stage(plan),
        "iteration": Figure(
            duration_text(prediction.iteration_time_ms), prediction.iteration_time_ms, "ms"
        ),
        "samples/s": Figure(
            rate_text(prediction.samples_per_s, "samples"), prediction.samples_per_s, "per_s"
        ),
        "tokens/s": Figure(
            rate_text(prediction.tokens_per_s, "tokens"), prediction.tokens_per_s, "per_s"
        ),
        "MFU": Figure(percent_text(prediction.mfu), prediction.mfu, "fraction"),
        "peak memory": _peak_memory(plan),
        "idle GPUs": ", ".join(f"{g.count} {g.gpu_type}" for g in idle) if idle else "none",
    }


def compare_document(first: Plan, second: Plan, names: tuple[str, str] = ("A", "B")) -> Document:
    """Rows of both plans, differing rows in bold, and the throughput ratio second / first."""
    rows_a, rows_b = compare_rows(first), compare_rows(second)
    section = Section(title="Plans compared", columns=["", names[0], names[1]])
    for key, value_a in rows_a.items():
        value_b = rows_b[key]
        section.add(key, value_a, value_b, style="bold" if value_a != value_b else "")
    ratio = second.prediction.samples_per_s / first.prediction.samples_per_s
    section.add(
        "throughput vs first",
        Figure("1.00×", 1.0, "ratio"),
        Figure(f"{ratio:.2f}×", ratio, "ratio"),
        style="bold green" if ratio > 1 else "bold",
    )
    return Document(title="", sections=[section])
