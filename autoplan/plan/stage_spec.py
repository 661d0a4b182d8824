"""Stages written by hand, one string per pipeline: ``TYPES:Lfirst-last:tpT:dpD`` per stage.

The grammar (stages separated by ``|``; fields after the first two in any order)::

    stages  := stage ( "|" stage )*
    stage   := types ":L" first "-" last ":tp" T ":dp" D ( ":" extra )*
    types   := type ( "+" type )*          e.g. RTX-2080+RTX-3090, or A100*2+V100*1
    type    := NAME ( "*" REPLICAS )?      a GPU type or node-group name; REPLICAS of the D
    extra   := "mb" B                      samples per micro-batch of each replica
             | "none" | "selective" | "full"  activation recompute
             | "z" Z                       ZeRO level (0-3) across the stage's replicas
             | "offload"                   saved activations parked in host memory

Layer ranges are inclusive (``L0-11`` is layers 0 to 11, twelve layers), as the stage tables
of ``autoplan show`` print them. ``RTX-2080+RTX-3090:L0-11:tp8:dp2`` is a stage of two
replicas of eight GPUs, one of each type (``*N`` says how many of each where several splits
fit the cluster). This is the notation of the measured runs in ``../shared/calibration``.

Parsing only: no cluster or profile is read here (``autoplan.plan.pricing`` resolves the names).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from autoplan import limits
from autoplan.errors import InputError
from autoplan.names import shown
from autoplan.plan.schema import Recompute, ZeroStage

__all__ = ["StageSpec", "TypeShare", "format_stage_specs", "megatron_stage_specs", "parse_stages"]

_TYPE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:\*(?P<count>\d{1,6}))?")
_LAYERS = re.compile(r"L(?P<first>\d{1,6})-(?P<last>\d{1,6})")
_NUMBERED = re.compile(r"(?P<key>tp|dp|mb|z)(?P<value>\d{1,7})")
_MAX_STAGES = limits.MAX_PIPELINE_DEGREE * limits.MAX_VIRTUAL_STAGES


class TypeShare(BaseModel):
    """One GPU type of a stage and, where the user says, how many of its replicas it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="A GPU type or node-group name of the cluster, as written.")
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=limits.MAX_CLUSTER_GPUS,
        description="Replicas of this type (None: split to fit the cluster).",
    )


class StageSpec(BaseModel):
    """One pipeline stage as a person writes it (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    types: list[TypeShare] = Field(min_length=1, max_length=limits.MAX_GPU_TYPES)
    first_layer: int = Field(ge=0, le=limits.MAX_LAYERS, description="First layer (inclusive).")
    last_layer: int = Field(ge=0, le=limits.MAX_LAYERS, description="Last layer (inclusive).")
    tensor_parallel_degree: int = Field(ge=1, le=limits.MAX_GPUS_PER_NODE)
    data_parallel_degree: int = Field(
        ge=1, le=limits.MAX_CLUSTER_GPUS, description="Replicas of the stage, all types."
    )
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=limits.MAX_MICRO_BATCH_SIZE,
        description="Samples per micro-batch of EACH replica (None: the command's default).",
    )
    recompute: Recompute | None = Field(default=None, description="None: the default.")
    zero_stage: ZeroStage | None = Field(default=None, description="None: the default.")
    offload: bool = Field(default=False, description="Activation offload to host memory.")

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer + 1

    def text(self) -> str:
        """The stage in the grammar of the module docstring (parses back to itself)."""
        types = "+".join(
            t.name if t.replicas is None else f"{t.name}*{t.replicas}" for t in self.types
        )
        parts = [
            types,
            f"L{self.first_layer}-{self.last_layer}",
            f"tp{self.tensor_parallel_degree}",
            f"dp{self.data_parallel_degree}",
        ]
        if self.micro_batch_size is not None:
            parts.append(f"mb{self.micro_batch_size}")
        if self.recompute is not None:
            parts.append(self.recompute)
        if self.zero_stage is not None:
            parts.append(f"z{self.zero_stage}")
        if self.offload:
            parts.append("offload")
        return ":".join(parts)


def _stage(text: str, number: int) -> StageSpec:
    where = f"--stages stage {number} ({shown(text)})"
    fields = [part.strip() for part in text.split(":")]
    if len(fields) < 4:
        raise InputError(f"{where}: expected TYPES:Lfirst-last:tpT:dpD, e.g. A100:L0-11:tp2:dp4")
    types = []
    for item in fields[0].split("+"):
        match = _TYPE.fullmatch(item.strip())
        if match is None:
            raise InputError(f"{where}: {shown(item)} is not a GPU type (NAME or NAME*REPLICAS)")
        count = match["count"]
        types.append(TypeShare(name=match["name"], replicas=None if count is None else int(count)))
    layers = _LAYERS.fullmatch(fields[1])
    if layers is None:
        raise InputError(f"{where}: the layers are written Lfirst-last, e.g. L0-11")
    first, last = int(layers["first"]), int(layers["last"])
    if last < first:
        raise InputError(f"{where}: the last layer ({last}) comes before the first ({first})")
    numbers: dict[str, int] = {}
    recompute: str | None = None
    offload = False
    for item in fields[2:]:
        numbered = _NUMBERED.fullmatch(item)
        if numbered is not None and numbered["key"] not in numbers:
            numbers[numbered["key"]] = int(numbered["value"])
        elif item in ("none", "selective", "full") and recompute is None:
            recompute = item
        elif item == "offload" and not offload:
            offload = True
        else:
            raise InputError(
                f"{where}: {shown(item)} is not one of tpT, dpD, mbB, none/selective/full, zZ, "
                "offload (each at most once)"
            )
    for key in ("tp", "dp"):
        if key not in numbers:
            raise InputError(f"{where}: no {key}; write e.g. :{key}1")
    if numbers.get("z", 0) > 3:
        raise InputError(f"{where}: ZeRO levels are 0 to 3, not {numbers['z']}")
    given = [t.replicas for t in types if t.replicas is not None]
    if len(given) == len(types) and sum(given) != numbers["dp"]:
        raise InputError(
            f"{where}: the replicas per type add up to {sum(given)}, not dp {numbers['dp']}"
        )
    if len(types) > numbers["dp"]:
        raise InputError(f"{where}: {len(types)} GPU types need at least {len(types)} replicas")
    try:
        return StageSpec(
            types=types,
            first_layer=first,
            last_layer=last,
            tensor_parallel_degree=numbers["tp"],
            data_parallel_degree=numbers["dp"],
            micro_batch_size=numbers.get("mb"),
            recompute=recompute,  # type: ignore[arg-type]  # one of the three, checked above
            zero_stage=numbers.get("z"),  # type: ignore[arg-type]  # 0-3, checked above
            offload=offload,
        )
    except ValueError as error:  # a pydantic bound: say which
        first_error = error.errors()[0]  # type: ignore[attr-defined]
        name = ".".join(str(p) for p in first_error["loc"])
        raise InputError(f"{where}: {name}: {first_error['msg']}") from None


def parse_stages(text: str) -> list[StageSpec]:
    """The stages of ``text`` (module docstring), checked to cover layers 0.. contiguously.

    Raises InputError naming the stage that is malformed."""
    parts = text.split("|")
    if len(parts) > _MAX_STAGES:
        raise InputError(f"--stages lists {len(parts)} stages; at most {_MAX_STAGES}")
    stages = [_stage(part.strip(), n) for n, part in enumerate(parts)]
    expected = 0
    for n, stage in enumerate(stages):
        if stage.first_layer != expected:
            raise InputError(
                f"--stages stage {n} starts at layer {stage.first_layer}; the stages must cover "
                f"the layers in order, so it must start at {expected}"
            )
        expected = stage.last_layer + 1
    return stages


def format_stage_specs(stages: list[StageSpec]) -> str:
    """``stages`` as one ``--stages`` string."""
    return " | ".join(stage.text() for stage in stages)


def megatron_stage_specs(
    num_layers: int,
    tp: int,
    pp: int,
    dp: int,
    gpu_types: list[str],
    layer_split: list[int] | None = None,
) -> list[StageSpec]:
    """A Megatron-style description (every stage dp replicas of tp GPUs) as stage specs.

    ``gpu_types``: one name for every stage, or one per stage (each may be 'A+B' for a mix);
    ``layer_split``: layers per stage, else as even as the layers allow (earlier stages take
    the extra layers, as Megatron-LM's uneven split would put them)."""
    if layer_split is None:
        base, extra = divmod(num_layers, pp)
        if base == 0:
            raise InputError(f"--pp {pp} is more stages than the model's {num_layers} layers")
        layer_split = [base + (1 if s < extra else 0) for s in range(pp)]
    if len(layer_split) != pp:
        raise InputError(f"--pp {pp} disagrees with --layer-split of {len(layer_split)} stages")
    if sum(layer_split) != num_layers or min(layer_split) < 1:
        raise InputError(
            f"--layer-split {','.join(map(str, layer_split))} must be positive and add up to "
            f"the model's {num_layers} layers"
        )
    if len(gpu_types) not in (1, pp):
        raise InputError(f"--gpu-type names {len(gpu_types)} types: give one, or one per stage")
    names = gpu_types * pp if len(gpu_types) == 1 else gpu_types
    text = []
    start = 0
    for count, name in zip(layer_split, names, strict=True):
        text.append(f"{name}:L{start}-{start + count - 1}:tp{tp}:dp{dp}")
        start += count
    return parse_stages(" | ".join(text))
