"""A concrete configuration to cost: every knob of a plan, as plain numbers.

A configuration is a pipeline of stages; each stage holds layers ``[layer_start, layer_end)``
and one or more replica groups. A group is ``replicas`` data-parallel replicas of ``tp`` GPUs
of one device class, each running ``micro_batch_size`` samples of every micro-batch with
``recompute`` (with ``cp`` > 1, a replica is tp × cp GPUs, each cp rank a chunk of every
sample's sequence: ``autoplan.cost.context_parallel``). The groups' samples add up to the
same micro-batch in every stage. With ``chunks = v > 1`` (interleaved 1F1B) stage ``s`` runs
on pipeline rank ``s % pp`` and the stages of one rank have the same groups (they run on the
same GPUs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.plan.schema import Executor

__all__ = [
    "PlanConfig",
    "ReplicaGroup",
    "StageChoice",
    "canonical_sequence_parallel",
    "with_cp",
]


@dataclass(frozen=True, order=True)
class ReplicaGroup:
    """``replicas`` replicas of ``tp`` GPUs of class ``device_class``, each taking
    ``micro_batch_size`` samples of every micro-batch, with ``recompute`` (and with
    ``offload``, its saved activations kept in host memory between forward and backward);
    each replica's sequence is split over ``cp`` GPUs (context parallelism)."""

    device_class: int
    tp: int
    replicas: int
    micro_batch_size: int
    recompute: str
    offload: bool = False
    cp: int = 1

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp * self.cp

    @property
    def samples(self) -> int:
        """Samples of one micro-batch the group runs."""
        return self.replicas * self.micro_batch_size


@dataclass(frozen=True, order=True)
class StageChoice:
    """Layers [layer_start, layer_end) on ``groups``; ``zero_stage`` shards across all the
    stage's replicas: 1 the optimizer states, 2 also the gradients, 3 also the parameters;
    ``ep`` splits the routed experts of its MoE layers over expert groups of ep replicas
    inside each replica group (``autoplan.cost.expert_parallel``); with ``experts`` (one
    entry per group), the expert groups span the groups instead, each taking replicas / k of
    every group (k = the stage's replicas / ep expert groups), a rank of group g holding
    ``experts[g]`` experts of each MoE layer (experts placed by speed). With
    ``sequence_parallel`` the stage's tp groups run sequence parallelism
    (``autoplan.cost.sequence_parallel``) whatever the rest of the plan does
    (``PlanConfig.sequence_parallel``: every stage does)."""

    layer_start: int
    layer_end: int
    groups: tuple[ReplicaGroup, ...]
    zero_stage: int = 0
    ep: int = 1
    experts: tuple[int, ...] = ()
    sequence_parallel: bool = False

    @property
    def tensor_parallel(self) -> bool:
        """Whether a group of the stage runs tensor parallel (SP means something there)."""
        return any(g.tp > 1 for g in self.groups)

    @property
    def zero1(self) -> bool:
        """Optimizer states sharded (ZeRO stage 1 or higher)."""
        return self.zero_stage >= 1

    @property
    def replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    @property
    def cp(self) -> int:
        """Context-parallel degree of the stage's groups (one per stage: its cp ranks shard
        the gradient reduction with its replicas)."""
        return max(g.cp for g in self.groups)

    @property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    def gpus_of(self, device_class: int) -> int:
        """GPUs of ``device_class`` the stage uses."""
        return sum(g.gpus for g in self.groups if g.device_class == device_class)

    @property
    def classes(self) -> tuple[int, ...]:
        """Device classes of its groups, sorted, without repeats."""
        return tuple(sorted({g.device_class for g in self.groups}))

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True, order=True)
class PlanConfig:
    """One point of the search space (module docstring); ``executor`` is the runtime's
    executor it is priced for (``Executor``): the uniform family's plans run on the mesh, the
    heterogeneous family's on per-stage groups."""

    num_micro_batches: int
    schedule: str
    chunks: int
    stages: tuple[StageChoice, ...]
    sequence_parallel: bool = False
    executor: Executor = "mesh"

    @property
    def pipeline_degree(self) -> int:
        return len(self.stages) // self.chunks

    def stage_sequence_parallel(self, index: int) -> bool:
        """Whether stage ``index`` runs sequence parallelism: the plan's setting, or its own."""
        return self.sequence_parallel or self.stages[index].sequence_parallel

    def mesh_shaped(self) -> bool:
        """Whether one (pp, dp, cp, tp) mesh holds the plan, its ranks' order aside
        (``Plan.runs_on_mesh`` checks that too): every stage the same replicas of one tp and
        cp taking the same shares, and no expert parallelism."""

        def shape(stage: StageChoice) -> list[tuple[int, int, int]]:
            return sorted(
                (g.tp, g.cp, g.micro_batch_size) for g in stage.groups for _ in range(g.replicas)
            )

        first = shape(self.stages[0])
        return (
            len({(tp, cp) for tp, cp, _ in first}) == 1
            and all(shape(stage) == first for stage in self.stages)
            and all(stage.ep == 1 and not stage.experts for stage in self.stages)
        )

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch (every stage's groups together)."""
        return self.stages[0].samples

    @property
    def samples_per_iteration(self) -> int:
        return self.micro_batch_size * self.num_micro_batches

    @property
    def world_size(self) -> int:
        return sum(stage.gpus for stage in self.stages[: self.pipeline_degree])

    def gpus_of(self, device_class: int) -> int:
        """GPUs of ``device_class`` the plan uses."""
        return sum(stage.gpus_of(device_class) for stage in self.stages[: self.pipeline_degree])

    def uniform_shape(self) -> tuple[int, int] | None:
        """(dp, tp) if every stage is dp replicas of tp GPUs with the same shares."""
        first = self.stages[0]
        tps = {g.tp for stage in self.stages for g in stage.groups}
        shares = [_shares(stage) for stage in self.stages]
        if len(tps) != 1 or any(s != shares[0] for s in shares):
            return None
        return first.replicas, next(iter(tps))

    def summary(self, class_name: Callable[[int], str] = lambda k: f"c{k}") -> str:
        """Knobs in one line, e.g. 'pp=2 m=8 mbs=16 1f1b | 0-12: A100:4x1(b4) | ...'
        (replicas x tp, samples each; ',s'/',f' for selective/full recompute)."""
        chunks = f" v={self.chunks}" if self.chunks > 1 else ""
        parts = [
            f"pp={self.pipeline_degree} m={self.num_micro_batches} mbs={self.micro_batch_size} "
            f"{self.schedule}{chunks}{' sp' if self.sequence_parallel else ''}"
        ]
        for stage in self.stages:
            groups = "+".join(
                f"{class_name(g.device_class)}:{g.replicas}x{g.tp}(b{g.micro_batch_size}"
                f"{'' if g.recompute == 'none' else ',' + g.recompute[0]}"
                f"{',o' if g.offload else ''}{f',cp{g.cp}' if g.cp > 1 else ''})"
                for g in stage.groups
            )
            zero = f" z{stage.zero_stage}" if stage.zero_stage else ""
            zero += f" ep{stage.ep}" if stage.ep > 1 else ""
            zero += f"[{'+'.join(map(str, stage.experts))}]" if stage.experts else ""
            zero += " sp" if stage.sequence_parallel else ""
            parts.append(f"{stage.layer_start}-{stage.layer_end}: {groups}{zero}")
        return " | ".join(parts)


def with_cp(config: PlanConfig, cp: int) -> PlanConfig:
    """``config`` with every group at cp ``cp`` (what a search on a cp view returns is the
    plan with its groups at that cp)."""
    return dataclasses.replace(
        config,
        stages=tuple(
            dataclasses.replace(
                stage, groups=tuple(dataclasses.replace(g, cp=cp) for g in stage.groups)
            )
            for stage in config.stages
        ),
    )


def canonical_sequence_parallel(config: PlanConfig) -> PlanConfig:
    """``config`` with its sequence parallelism said one way: on for the whole plan where
    every stage with tp > 1 runs it (and one does), else per stage, only where tp > 1 (a
    stage without tp runs the same with or without it). Equal plans then compare equal."""
    tensor = [stage.tensor_parallel for stage in config.stages]
    on = [config.stage_sequence_parallel(s) and t for s, t in enumerate(tensor)]
    whole = any(on) and on == tensor
    stages = tuple(
        stage
        if stage.sequence_parallel == (on[s] and not whole)
        else dataclasses.replace(stage, sequence_parallel=on[s] and not whole)
        for s, stage in enumerate(config.stages)
    )
    if whole == config.sequence_parallel and stages == config.stages:
        return config
    return dataclasses.replace(config, stages=stages, sequence_parallel=whole)


def _shares(stage: StageChoice) -> list[int]:
    return [g.micro_batch_size for g in stage.groups for _ in range(g.replicas)]
