"""How far the cost model is from real runs: every measured run costed with its plan pinned.

For each run of a measured-runs table (``autoplan.calibrate.measured_runs``) the cost model
prices the run's own configuration on the run's own cluster, twice where a per-layer table is
given: from the GPU catalog alone (what a user without measurements gets) and with the
table's measured layer times attached (``autoplan.profile.measured_table.attach``: what
``autoplan profile import`` does). The error of a prediction is predicted / measured − 1
(negative: the model is optimistic). A report groups the runs by site and gives the median
and worst absolute error of each group and of all runs.

Memory: where the table records a run's measured peak (``measured_max_memory_gib``), the
report sets beside it the model's peak per GPU, the largest over the plan's GPUs of what the
model counts (weights, gradients, optimizer states, activations in flight, transients and
buffers: ``autoplan.cost.model.RankMemory``), without and with the GPU type's reserve (CUDA
context, NCCL's buffers, allocator fragmentation), and the error of the latter:
predicted / measured − 1 (negative: the model says the plan needs less than it took; a plan
predicted to fit would not).

``autoplan fidelity`` prints it; ``make bench`` prints it for ``../shared/calibration``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autoplan.calibrate.measured_runs import (
    MEASURED_GPU_NAMES,
    MeasuredRun,
    cost_run,
    run_cluster,
)
from autoplan.cluster.catalog import gpu_specs, profiles_dir
from autoplan.cost.config import PlanConfig
from autoplan.cost.engines import Engine
from autoplan.cost.model import CostModel, PlanCost
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.limits import GIB
from autoplan.profile.measured_table import TableRow, attach, read_table
from autoplan.profile.schema import Profile

__all__ = [
    "FIDELITY_SCHEMA_VERSION",
    "FidelityReport",
    "FidelityRun",
    "FidelitySummary",
    "fidelity_report",
    "predicted_peak_bytes",
    "shipped_profile",
]

FIDELITY_SCHEMA_VERSION = 5  # 2: the engine; 3: memory columns; 4: the gradient all-reduce;
# 5: the reference simulator's error


class FidelityRun(BaseModel):
    """One measured run beside what the cost model predicts for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(description="The run's name in the table.")
    site: str = Field(description="Where it ran (the report's groups).")
    model: str = Field(description="The model trained.")
    stages: str = Field(description="Its plan, TYPES:Lfirst-last:tpT:dpD per stage.")
    num_micro_batches: int = Field(ge=1, description="Micro-batches per iteration.")
    measured_s: float = Field(gt=0, description="Measured iteration time.")
    catalog_s: float = Field(gt=0, description="Predicted from the GPU catalog alone.")
    catalog_error: float = Field(description="catalog_s / measured_s − 1.")
    measured_layers_s: float | None = Field(
        default=None, description="Predicted with the measured layer times attached."
    )
    measured_layers_error: float | None = Field(
        default=None, description="measured_layers_s / measured_s − 1."
    )
    reference_simulator_error: float | None = Field(
        default=None,
        description="reference_simulator_s / measured_s − 1: how close a simulator validated "
        "against these runs gets from the same per-layer table (compare measured_layers_error).",
    )
    reference_simulator_s: float | None = Field(
        default=None, description="What the table's own simulator predicted, for reference."
    )
    fits: bool = Field(description="Whether the cost model says the plan fits memory.")
    measured_memory_gib: float | None = Field(
        default=None, description="The run's measured peak device memory per GPU, GiB."
    )
    predicted_memory_gib: float = Field(
        ge=0,
        description="The model's peak per GPU, GiB: the largest over the plan's GPUs of what "
        "it counts, without the reserve.",
    )
    predicted_memory_with_reserve_gib: float = Field(
        ge=0,
        description="The same with each GPU type's reserve (CUDA context, NCCL, fragmentation).",
    )
    memory_error: float | None = Field(
        default=None,
        description="predicted_memory_with_reserve_gib / measured_memory_gib − 1.",
    )
    measured_grad_allreduce_s: float | None = Field(
        default=None, ge=0, description="The run's measured gradient all-reduce, where recorded."
    )
    predicted_grad_allreduce_s: float = Field(
        ge=0,
        description="The catalog model's gradient all-reduce of the stage whose is longest (the "
        "term alone, whatever of it the engine hides).",
    )


class FidelitySummary(BaseModel):
    """Median and worst absolute error of a group of runs, per prediction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str = Field(description="A site, or 'all'.")
    runs: int = Field(ge=1)
    catalog_median_abs_error: float = Field(ge=0)
    catalog_worst_error: float
    measured_layers_median_abs_error: float | None = None
    measured_layers_worst_error: float | None = None
    reference_median_abs_error: float | None = Field(
        default=None, ge=0, description="Median |reference_simulator_error| of the group."
    )
    reference_worst_error: float | None = None
    memory_runs: int = Field(default=0, ge=0, description="Runs with a measured memory peak.")
    memory_median_abs_error: float | None = Field(
        default=None, ge=0, description="Median |memory_error| of those runs."
    )
    memory_worst_error: float | None = Field(
        default=None, description="The memory_error of the largest magnitude."
    )


class FidelityReport(BaseModel):
    """Every run and the summaries (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=FIDELITY_SCHEMA_VERSION)
    engine: Engine = Field(
        default="megatron-deepspeed", description="The engine the runs were costed as."
    )
    runs: list[FidelityRun]
    summaries: list[FidelitySummary]


def _worst(errors: list[float]) -> float:
    return max(errors, key=abs)


def _summary(group: str, runs: list[FidelityRun]) -> FidelitySummary:
    catalog = [r.catalog_error for r in runs]
    layers = [r.measured_layers_error for r in runs if r.measured_layers_error is not None]
    memory = [r.memory_error for r in runs if r.memory_error is not None]
    reference = [
        r.reference_simulator_error for r in runs if r.reference_simulator_error is not None
    ]
    return FidelitySummary(
        group=group,
        runs=len(runs),
        catalog_median_abs_error=statistics.median(abs(e) for e in catalog),
        catalog_worst_error=_worst(catalog),
        measured_layers_median_abs_error=(
            statistics.median(abs(e) for e in layers) if layers else None
        ),
        measured_layers_worst_error=_worst(layers) if layers else None,
        reference_median_abs_error=(
            statistics.median(abs(e) for e in reference) if reference else None
        ),
        reference_worst_error=_worst(reference) if reference else None,
        memory_runs=len(memory),
        memory_median_abs_error=statistics.median(abs(e) for e in memory) if memory else None,
        memory_worst_error=_worst(memory) if memory else None,
    )


def predicted_peak_bytes(cost: PlanCost) -> tuple[float, float]:
    """(without, with the reserve): the largest over a plan's GPUs of the bytes the model
    counts on one GPU, and of those plus its type's reserve."""
    return (
        max(m.total_bytes for m in cost.memory),
        max(m.total_bytes + m.reserved_bytes for m in cost.memory),
    )


# The models of the published measured runs as Megatron-DeepSpeed builds them (unfused
# attention, Megatron's embedding and cross-entropy; ``bench/calibration_data.py``), profiled
# in TF32 and shipped in profiles/calibration/: a run whose model has no profile given uses
# its shipped one, matched by name without case, punctuation or a size suffix.
SHIPPED_PROFILES = {
    "opt350": "opt-350.megatron.tf32.profile.json",
    "opt30": "opt-30.megatron.tf32.profile.json",
    "gptneo27": "gpt-neo-2.7b.megatron.tf32.profile.json",
}


def _model_key(name: str) -> str:
    """'OPT-350M', 'opt_350' → 'opt350'; 'GPT-Neo-2.7B' → 'gptneo27'."""
    return re.sub(r"[^a-z0-9]", "", name.lower()).removesuffix("b").removesuffix("m")


def shipped_profile(model: str) -> Path | None:
    """The shipped calibration profile of a measured-runs model name, or None."""
    file = SHIPPED_PROFILES.get(_model_key(model))
    return None if file is None else profiles_dir() / "calibration" / file


def _profile_for(run: MeasuredRun, profiles: dict[str, Profile]) -> Profile:
    if run.model in profiles:
        return profiles[run.model]
    if "" in profiles:
        return profiles[""]
    shipped = shipped_profile(run.model)
    if shipped is not None and shipped.is_file():
        profiles[run.model] = read_json_model(shipped, Profile)
        return profiles[run.model]
    known = ", ".join(sorted(p for p in profiles if p)) or "none"
    raise InputError(
        f"it trains {run.model}: give its profile as --profile {run.model}=PATH "
        f"(profiles given for: {known}; shipped for: OPT-350, OPT-30, GPT-Neo-2.7B)"
    )


def _cost_both(
    run: MeasuredRun,
    profiles: dict[str, Profile],
    rows: dict[str, list[TableRow]],
    layer_times: str | Path | None,
    engine: Engine,
) -> tuple[PlanConfig, PlanCost, PlanCost | None]:
    """One run costed from the catalog and, with ``layer_times``, with its measured rows."""
    profile = _profile_for(run, profiles)
    cluster = run_cluster(run)
    specs = gpu_specs(cluster)
    config, catalog = cost_run(run, CostModel(profile, cluster, specs).with_engine(engine))
    with_layers = None
    if layer_times is not None:
        if run.model not in rows:
            rows[run.model] = read_table(layer_times, model=run.model, gpu_names=MEASURED_GPU_NAMES)
        measured = attach(profile, rows[run.model], str(layer_times))
        _, with_layers = cost_run(run, CostModel(measured, cluster, specs).with_engine(engine))
    return config, catalog, with_layers


def fidelity_report(
    runs: Sequence[MeasuredRun],
    profiles: dict[str, Profile],
    layer_times: str | Path | None = None,
    engine: Engine = "megatron-deepspeed",
) -> FidelityReport:
    """Cost every run (module docstring). ``profiles`` maps a model name of the table to its
    profile ('' for one profile that serves every run); ``layer_times`` is a per-layer table
    (CSV or JSON, ``autoplan.profile.measured_table``) whose rows of each run's model are
    attached for the second prediction; ``engine`` is the engine that ran the runs
    (``autoplan.cost.engines``: the published runs are Megatron-DeepSpeed's)."""
    profiles = dict(profiles)  # the shipped ones read are added to this copy
    rows: dict[str, list[TableRow]] = {}
    out = []
    for run in runs:
        try:
            costed = _cost_both(run, profiles, rows, layer_times, engine)
        except InputError as error:
            raise InputError(f"run {run.name}: {error}") from None
        config, catalog, with_layers = costed
        measured_s = run.measured_iteration_s
        peak, with_reserve = predicted_peak_bytes(catalog)
        measured_gib = run.measured_max_memory_gib
        out.append(
            FidelityRun(
                run=run.name,
                site=run.site,
                model=run.model,
                stages=run.stages,
                num_micro_batches=config.num_micro_batches,
                measured_s=measured_s,
                catalog_s=catalog.iteration_ms / 1e3,
                catalog_error=catalog.iteration_ms / 1e3 / measured_s - 1,
                measured_layers_s=None if with_layers is None else with_layers.iteration_ms / 1e3,
                measured_layers_error=(
                    None if with_layers is None else with_layers.iteration_ms / 1e3 / measured_s - 1
                ),
                reference_simulator_s=run.reference_simulator_s,
                reference_simulator_error=(
                    None
                    if run.reference_simulator_s is None
                    else run.reference_simulator_s / measured_s - 1
                ),
                fits=catalog.feasible,
                measured_memory_gib=measured_gib,
                predicted_memory_gib=peak / GIB,
                predicted_memory_with_reserve_gib=with_reserve / GIB,
                memory_error=(None if not measured_gib else with_reserve / GIB / measured_gib - 1),
                measured_grad_allreduce_s=run.measured_grad_allreduce_s,
                predicted_grad_allreduce_s=max(catalog.rank_allreduce_ms, default=0.0) / 1e3,
            )
        )
    if not out:
        raise InputError("the measured-runs table has no runs")
    sites = sorted({r.site for r in out})
    summaries = [_summary(site, [r for r in out if r.site == site]) for site in sites]
    summaries.append(_summary("all", out))
    return FidelityReport(engine=engine, runs=out, summaries=summaries)
