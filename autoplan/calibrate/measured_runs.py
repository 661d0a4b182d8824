"""Whole iterations of real training runs, costed with their plans pinned.

A measured-runs table (``../shared/calibration/measured_runs.csv`` is one) lists real runs,
one per row: the cluster file, the global batch, the samples per replica of one micro-batch,
and the plan as a stage list ``TYPES:Lfirst-last:tpT:dpD | ...`` where ``TYPES`` is one GPU
type or ``A+B`` (replicas of several types in one stage) and the layer range is inclusive.
``cost_runs`` turns each row into a ``PlanConfig`` on the run's own cluster and costs it with
the cost model, so that predicted and measured iteration times can be set side by side (the
fidelity report: ``autoplan calibrate check``, ``make bench``).

How a row becomes a configuration (``autoplan.price.configuration.config_from_specs``, what
``autoplan cost --stages`` runs):

- replicas of a multi-type stage are split among its types to fit the cluster (the row does
  not say the split; on every row of the shipped table one split fits);
- every replica runs ``micro_batch_per_replica`` samples of each micro-batch, so the
  micro-batch is ``dp × micro_batch_per_replica`` samples and the pipeline runs
  ``global_batch / micro-batch`` micro-batches (a row where that does not divide is an error);
- the schedule is 1F1B (PipeDream-flush, what Megatron-DeepSpeed's pipeline engine runs), no
  recompute, no ZeRO: the runs' own configuration as published.

GPU type names of the table are matched to the catalog by ``MEASURED_GPU_NAMES`` (the
calibration data's spelling) or taken as catalog names.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from autoplan.cluster.schema import Cluster
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel, PlanCost
from autoplan.errors import InputError
from autoplan.plan.stage_spec import parse_stages
from autoplan.price.configuration import PipelineKnobs, config_from_specs

__all__ = [
    "MEASURED_GPU_NAMES",
    "MeasuredRun",
    "cost_run",
    "pinned_config",
    "read_measured_runs",
    "run_cluster",
]

# The calibration data's GPU names → catalog names.
MEASURED_GPU_NAMES = {
    "A100-40": "A100-40GB",
    "A100-80": "A100-80GB",
    "V100-16": "V100-16GB",
    "V100-32": "V100-32GB",
    "H100-80": "H100",
    "GH-96": "GH200",
    "RTX-2080": "RTX-2080",
    "RTX-3090": "RTX-3090",
    "Titan-RTX": "Titan-RTX",
}


@dataclass(frozen=True)
class MeasuredRun:
    """One row of a measured-runs table (module docstring); ``stages`` in the notation of
    ``autoplan.plan.stage_spec``, GPU names as the catalog spells them."""

    name: str
    site: str
    model: str
    cluster_file: Path
    global_batch: int
    micro_batch_per_replica: int
    stages: str
    measured_iteration_s: float
    measured_grad_allreduce_s: float | None
    measured_max_memory_gib: float | None
    reference_simulator_s: float | None


def _catalog_names(stages: str) -> str:
    """The stage list with the table's GPU names replaced by the catalog's."""
    return _GPU_TOKEN.sub(lambda m: MEASURED_GPU_NAMES.get(m.group(0), m.group(0)), stages)


# A table name only where it is a whole GPU name: "A100-40" in "A100-40GB" (already the
# catalog's spelling) stays as it is.
_GPU_TOKEN = re.compile(
    r"(?<![\w-])(?:"
    + "|".join(sorted(map(re.escape, MEASURED_GPU_NAMES), key=len, reverse=True))
    + r")(?![\w-])"
)


def _optional_float(text: str | None) -> float | None:
    """An optional measurement: empty, or a finite number not below 0."""
    if text in (None, ""):
        return None
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"measurements must be finite and not negative, got {text!r}")
    return value


_REQUIRED_COLUMNS = (
    "run",
    "model",
    "cluster_file",
    "global_batch",
    "micro_batch_per_replica",
    "stages",
    "measured_iteration_s",
)


def _positive(row: dict[str, str], column: str, kind: type[int] | type[float]) -> float:
    """A column's value, a positive finite number of ``kind`` (ValueError naming it)."""
    text = row.get(column) or ""
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{column} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{column} must be positive, got {text!r}")
    return value


def read_measured_runs(path: str | Path) -> list[MeasuredRun]:
    """Every row of a measured-runs CSV; cluster files are resolved next to the CSV."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            columns = reader.fieldnames or []
    except OSError as error:
        raise InputError(f"cannot read measured runs {path}: {error.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"{path}: not a UTF-8 CSV table of runs ({error})") from None
    missing = [c for c in _REQUIRED_COLUMNS if c not in columns]
    if rows and missing:
        raise InputError(
            f"{path}: missing column(s) {', '.join(missing)} "
            f"(a measured-runs table has {', '.join(_REQUIRED_COLUMNS)})"
        )
    runs = []
    for row in rows:
        try:
            stages = _catalog_names(row["stages"] or "")
            parse_stages(stages)  # a bad row fails here, naming itself
            runs.append(
                MeasuredRun(
                    name=row["run"],
                    site=row.get("site") or "",
                    model=row["model"],
                    cluster_file=path.parent / row["cluster_file"],
                    global_batch=int(_positive(row, "global_batch", int)),
                    micro_batch_per_replica=int(_positive(row, "micro_batch_per_replica", int)),
                    stages=stages,
                    measured_iteration_s=_positive(row, "measured_iteration_s", float),
                    measured_grad_allreduce_s=_optional_float(row.get("measured_grad_allreduce_s")),
                    measured_max_memory_gib=_optional_float(row.get("measured_max_memory_gib")),
                    reference_simulator_s=_optional_float(row.get("sailor_simulator_s")),
                )
            )
        except (KeyError, ValueError, InputError) as error:
            raise InputError(f"{path}: run {row.get('run') or '?'}: {error}") from None
    return runs


def pinned_config(run: MeasuredRun, model: CostModel) -> PlanConfig:
    """The run's plan as a configuration of ``model``'s cluster (module docstring)."""
    knobs = PipelineKnobs(
        global_batch=run.global_batch, micro_batch_size=run.micro_batch_per_replica
    )
    return config_from_specs(model, parse_stages(run.stages), knobs)


def cost_run(run: MeasuredRun, model: CostModel) -> tuple[PlanConfig, PlanCost]:
    """The run's pinned configuration and what the cost model says of it."""
    config = pinned_config(run, model)
    return config, model.evaluate(config)


def run_cluster(run: MeasuredRun) -> Cluster:
    """The run's cluster file, read and checked."""
    from autoplan.cluster.catalog import load_cluster

    return load_cluster(run.cluster_file)
