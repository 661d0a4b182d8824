"""A concrete configuration to cost: every knob of a plan, as plain numbers."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlanConfig", "ReplicaGroup", "StageChoice"]


@dataclass(frozen=True, order=True)
class StageChoice:
    """Layers [layer_start, layer_end) on device class ``device_class`` with ``recompute``."""

    layer_start: int
    layer_end: int
    device_class: int
    recompute: str


@dataclass(frozen=True, order=True)
class ReplicaGroup:
    """``replicas`` data-parallel replicas on ``device_class``, each taking
    ``micro_batch_size`` samples per micro-batch (uneven shares, single-stage plans)."""

    device_class: int
    replicas: int
    micro_batch_size: int
    recompute: str


@dataclass(frozen=True, order=True)
class PlanConfig:
    """One point of the search space.

    ``stages`` lists pp × chunks stages in pipeline order; stage s runs on pipeline rank
    s % pp. ``replica_groups`` is non-empty only for single-stage plans whose replicas run on
    several device classes with uneven shares; then ``stages`` has the one stage and ``dp`` is
    the total of the groups' replicas.
    """

    tp: int
    dp: int
    micro_batch_size: int
    num_micro_batches: int
    schedule: str
    chunks: int
    zero1: bool
    stages: tuple[StageChoice, ...]
    replica_groups: tuple[ReplicaGroup, ...] = ()

    @property
    def pipeline_degree(self) -> int:
        return len(self.stages) // self.chunks

    @property
    def samples_per_iteration(self) -> int:
        if self.replica_groups:
            per_micro = sum(g.replicas * g.micro_batch_size for g in self.replica_groups)
            return per_micro * self.num_micro_batches
        return self.dp * self.micro_batch_size * self.num_micro_batches

    @property
    def world_size(self) -> int:
        return self.pipeline_degree * self.dp * self.tp

    def summary(self) -> str:
        """Knobs in one line."""
        split = "/".join(str(s.layer_end - s.layer_start) for s in self.stages)
        mbs = (
            ",".join(f"{g.micro_batch_size}x{g.replicas}" for g in self.replica_groups)
            if self.replica_groups
            else str(self.micro_batch_size)
        )
        chunks = f" v={self.chunks}" if self.chunks > 1 else ""
        return (
            f"pp={self.pipeline_degree} dp={self.dp} tp={self.tp} mbs={mbs} "
            f"m={self.num_micro_batches} {self.schedule}{chunks} zero1={self.zero1} "
            f"split={split}"
        )
