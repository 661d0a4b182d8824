"""What ``autoplan solve`` prints after solving: the plan's stages, prediction, memory and
runners-up, in the same sections ``show`` uses (without the memory bars)."""

from __future__ import annotations

from autoplan.plan.schema import Plan
from autoplan.view.document import Document, Figure, Section
from autoplan.view.memory_bars import memory_section
from autoplan.view.plan_tables import (
    alternatives_section,
    micro_batch_text,
    plan_precision_warnings,
    stages_section,
)
from autoplan.view.units import duration_text, percent_text, rate_text

__all__ = ["prediction_section", "solve_summary"]


def prediction_section(plan: Plan) -> Section:
    """Iteration time with its parts, throughput, efficiency and idle GPUs, as key–value rows."""
    prediction = plan.prediction
    section = Section(
        title="Prediction (one iteration)", columns=["figure", "value"], key_value=True
    )
    ms = prediction.iteration_time_ms
    section.add("iteration", Figure(duration_text(ms), ms, "ms"))
    for name, value in prediction.breakdown.model_dump().items():
        label = f"  {name.removesuffix('_ms').replace('_', ' ')}"
        section.add(label, Figure(duration_text(value), value, "ms"))
    rate = prediction.samples_per_s
    section.add("samples/s", Figure(rate_text(rate, "samples"), rate, "per_s"))
    rate = prediction.tokens_per_s
    section.add("tokens/s", Figure(rate_text(rate, "tokens"), rate, "per_s"))
    tflops = prediction.tflops_per_gpu
    section.add("TFLOP/s per GPU", Figure(f"{tflops:.1f}", tflops, "tflops"))
    section.add("MFU", Figure(percent_text(prediction.mfu), prediction.mfu, "fraction"))
    idle = prediction.idle_gpus
    section.add(
        "idle GPUs",
        "; ".join(f"{g.count} {g.gpu_type}: {g.reason}" for g in idle) if idle else "none",
    )
    for warning in plan_precision_warnings(plan):
        section.add("PRECISION", warning, style="bold red")
    return section


def solve_summary(plan: Plan) -> Document:
    """The solve command's summary of ``plan`` (print it with ``render.print_document``)."""
    par = plan.parallelism
    inputs = plan.inputs
    virtual = f" v={par.virtual_stages_per_rank}" if par.virtual_stages_per_rank > 1 else ""
    title = (
        f"{inputs.model.name} on {inputs.cluster.name} ({inputs.strategy}): "
        f"pp={par.pipeline_degree} {par.schedule}{virtual} m={par.num_micro_batches}, "
        f"{micro_batch_text(plan)}, {plan.world_size} GPUs"
    )
    if plan.search is not None:
        title += f"; {plan.search.words()}"
    sections = [stages_section(plan), prediction_section(plan), memory_section(plan, bars=False)]
    if plan.alternatives:
        sections.append(alternatives_section(plan))
    return Document(title=title, sections=sections)
