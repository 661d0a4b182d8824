"""Whole iterations of real training runs, costed with their plans pinned.

A measured-runs table (``../shared/calibration/measured_runs.csv`` is one) lists real runs,
one per row: the cluster file, the global batch, the samples per replica of one micro-batch,
and the plan as a stage list ``TYPES:Lfirst-last:tpT:dpD | ...`` where ``TYPES`` is one GPU
type or ``A+B`` (replicas of several types in one stage) and the layer range is inclusive.
``cost_runs`` turns each row into a ``PlanConfig`` on the run's own cluster and costs it with
the cost model, so that predicted and measured iteration times can be set side by side (the
fidelity report: ``autoplan calibrate check``, ``make bench``).

How a row becomes a configuration:

- replicas of a multi-type stage are split among its types so that every type of the stage
  gets at least one replica and the whole plan fits in each type's GPU count (the row does
  not say the split; where several splits fit, the one giving the earlier-listed type more
  replicas is taken: it is unique on every row of the shipped table);
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
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from autoplan.cluster.schema import Cluster
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel, PlanCost
from autoplan.errors import InputError

__all__ = [
    "MEASURED_GPU_NAMES",
    "MeasuredRun",
    "RunStage",
    "pinned_config",
    "read_measured_runs",
]

# The calibration data's GPU names → catalog names.
MEASURED_GPU_NAMES = {
    "A100-40": "A100-40GB",
    "A100-80": "A100-80GB",
    "V100-16": "V100-16GB",
    "GH-96": "GH200",
    "RTX-2080": "RTX-2080",
    "RTX-3090": "RTX-3090",
    "Titan-RTX": "Titan-RTX",
}

_STAGE = re.compile(r"^(?P<types>[^:]+):L(?P<first>\d+)-(?P<last>\d+):tp(?P<tp>\d+):dp(?P<dp>\d+)$")


@dataclass(frozen=True)
class RunStage:
    """One pipeline stage of a measured run: layers first..last (inclusive) on ``dp``
    replicas of ``tp`` GPUs of ``gpu_types`` (catalog names)."""

    gpu_types: tuple[str, ...]
    first_layer: int
    last_layer: int
    tp: int
    dp: int


@dataclass(frozen=True)
class MeasuredRun:
    """One row of a measured-runs table (module docstring)."""

    name: str
    site: str
    model: str
    cluster_file: Path
    global_batch: int
    micro_batch_per_replica: int
    stages: tuple[RunStage, ...]
    measured_iteration_s: float
    measured_grad_allreduce_s: float | None
    measured_max_memory_gib: float | None
    reference_simulator_s: float | None
    gpus_by_type: dict[str, int]

    @property
    def group(self) -> str:
        """The runs' family in reports: the site (one site is one kind of cluster)."""
        return self.site


def _gpu_name(name: str) -> str:
    return MEASURED_GPU_NAMES.get(name, name)


def parse_stages(text: str) -> tuple[RunStage, ...]:
    """``TYPES:Lfirst-last:tpT:dpD | ...`` → stages (InputError naming the bad part)."""
    stages = []
    for part in (p.strip() for p in text.split("|")):
        match = _STAGE.match(part)
        if match is None:
            raise InputError(
                f"stage '{part}' is not TYPES:Lfirst-last:tpT:dpD (e.g. A100-40:L0-11:tp2:dp4)"
            )
        first, last = int(match["first"]), int(match["last"])
        if last < first:
            raise InputError(f"stage '{part}': layer range {first}-{last} is empty")
        stages.append(
            RunStage(
                gpu_types=tuple(_gpu_name(t) for t in match["types"].split("+")),
                first_layer=first,
                last_layer=last,
                tp=int(match["tp"]),
                dp=int(match["dp"]),
            )
        )
    for before, after in itertools.pairwise(stages):
        if after.first_layer != before.last_layer + 1:
            raise InputError(
                f"stages must cover consecutive layers: {before.last_layer} is followed by "
                f"{after.first_layer}"
            )
    return tuple(stages)


def _optional_float(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def read_measured_runs(path: str | Path) -> list[MeasuredRun]:
    """Every row of a measured-runs CSV; cluster files are resolved next to the CSV."""
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise InputError(f"cannot read measured runs {path}: {error.strerror}") from None
    runs = []
    for row in rows:
        try:
            runs.append(
                MeasuredRun(
                    name=row["run"],
                    site=row.get("site", ""),
                    model=row["model"],
                    cluster_file=path.parent / row["cluster_file"],
                    global_batch=int(row["global_batch"]),
                    micro_batch_per_replica=int(row["micro_batch_per_replica"]),
                    stages=parse_stages(row["stages"]),
                    measured_iteration_s=float(row["measured_iteration_s"]),
                    measured_grad_allreduce_s=_optional_float(row.get("measured_grad_allreduce_s")),
                    measured_max_memory_gib=_optional_float(row.get("measured_max_memory_gib")),
                    reference_simulator_s=_optional_float(row.get("sailor_simulator_s")),
                    gpus_by_type={
                        _gpu_name(k): int(v)
                        for k, v in json.loads(row.get("gpus_by_type") or "{}").items()
                    },
                )
            )
        except (KeyError, ValueError) as error:
            raise InputError(f"{path}: row {row.get('run', '?')}: {error}") from None
    return runs


def _replica_splits(stage: RunStage) -> list[tuple[int, ...]]:
    """Ways to split the stage's dp replicas among its types, each type at least one,
    earlier-listed types first given more."""
    k = len(stage.gpu_types)
    splits = [
        split
        for split in itertools.product(range(1, stage.dp + 1), repeat=k)
        if sum(split) == stage.dp
    ]
    return sorted(splits, reverse=True)


def pinned_config(run: MeasuredRun, model: CostModel) -> PlanConfig:
    """The run's plan as a configuration of ``model``'s cluster (module docstring)."""
    class_of: dict[str, int] = {}
    available: dict[int, int] = {}
    for dc in model.classes:
        class_of.setdefault(dc.gpu.name, dc.index)
        available[dc.index] = available.get(dc.index, 0) + dc.total_gpus
    for stage in run.stages:
        missing = [t for t in stage.gpu_types if t not in class_of]
        if missing:
            raise InputError(f"run {run.name}: the cluster has no {', '.join(missing)} GPUs")
    choices = [_replica_splits(stage) for stage in run.stages]
    for combination in itertools.product(*choices):
        used: dict[int, int] = {}
        for stage, split in zip(run.stages, combination, strict=True):
            for gpu_type, replicas in zip(stage.gpu_types, split, strict=True):
                k = class_of[gpu_type]
                used[k] = used.get(k, 0) + replicas * stage.tp
        if all(used[k] <= available[k] for k in used):
            break
    else:
        raise InputError(f"run {run.name}: its stages need more GPUs than its cluster has")
    stages = []
    for stage, split in zip(run.stages, combination, strict=True):
        groups = tuple(
            ReplicaGroup(class_of[t], stage.tp, replicas, run.micro_batch_per_replica, "none")
            for t, replicas in zip(stage.gpu_types, split, strict=True)
        )
        stages.append(StageChoice(stage.first_layer, stage.last_layer + 1, groups))
    micro_batch = stages[0].samples
    if any(s.samples != micro_batch for s in stages) or run.global_batch % micro_batch:
        raise InputError(
            f"run {run.name}: global batch {run.global_batch} is not a whole number of "
            f"micro-batches of {micro_batch} samples in every stage"
        )
    if stages[-1].layer_end != len(model.profile.layers) or stages[0].layer_start != 0:
        raise InputError(
            f"run {run.name}: its stages cover layers 0-{stages[-1].layer_end - 1}; the profile "
            f"has {len(model.profile.layers)} layers"
        )
    return PlanConfig(
        num_micro_batches=run.global_batch // micro_batch,
        schedule="1f1b",
        chunks=1,
        stages=tuple(stages),
    )


def cost_run(run: MeasuredRun, model: CostModel) -> tuple[PlanConfig, PlanCost]:
    """The run's pinned configuration and what the cost model says of it."""
    config = pinned_config(run, model)
    return config, model.evaluate(config)


def run_cluster(run: MeasuredRun) -> Cluster:
    """The run's cluster file, read and checked."""
    from autoplan.cluster.catalog import load_cluster

    return load_cluster(run.cluster_file)
