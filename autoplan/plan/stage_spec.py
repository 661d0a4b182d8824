"""Stages written by hand, one string per pipeline: ``TYPES:Lfirst-last:tpT:dpD`` per stage.

The grammar (stages separated by ``|``; fields after the first two in any order)::

    stages  := stage ( "|" stage )*
    stage   := types ":L" first "-" last ( ":" extra )*
    types   := type ( "+" type )*          e.g. RTX-2080+RTX-3090, or A100*2+V100*1
    type    := NAME ( "*" REPLICAS )? ( "(" own ( "," own )* ")" )?
                                           a GPU type or node-group name; REPLICAS of the D
    extra   := own | "dp" D                D replicas in all (needed unless every type
             | "z" Z                       says how many); ZeRO level (0-3) of the stage
             | "ep" E                      expert parallelism of the stage's MoE layers
             | "sp"                        sequence parallelism in the stage's tp groups
    own     := "tp" T                      GPUs per replica (needed, per stage or per type)
             | "cp" C                      context parallelism: C × tp GPUs per replica
             | "mb" B                      samples per micro-batch of each replica
             | "none" | "selective" | "full"  activation recompute
             | "offload"                   saved activations parked in host memory
             | "x" X                       (per type) routed experts each of its replicas
                                           holds: experts placed by GPU speed, with "ep" E

Layer ranges are inclusive (``L0-11`` is layers 0 to 11, twelve layers), as the stage tables
of ``autoplan show`` print them. ``RTX-2080+RTX-3090:L0-11:tp8:dp2`` is a stage of two
replicas of eight GPUs, one of each type (``*N`` says how many of each where several splits
fit the cluster). This is the notation of the measured runs in ``../shared/calibration``.
What a type says in parentheses is its replicas' own, over the stage's: the replicas of one
stage may differ in tp, share and recompute, as ``solve``'s plans do
(``A100*1(tp4,mb4)+V100*4(tp1,mb1):L0-11``); the alternatives of a plan are written so.
``:sp`` is the stage's own sequence parallelism (``Stage.sequence_parallel``), for plans where
some stages run it and others do not; ``cost --sp`` turns it on in every stage.

Parsing only: no cluster or profile is read here (``autoplan.price.configuration`` resolves
the names).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoplan import limits
from autoplan.errors import InputError
from autoplan.names import shown
from autoplan.plan.schema import Plan, Recompute, ZeroStage

__all__ = [
    "StageSpec",
    "TypeShare",
    "format_stage_specs",
    "megatron_stage_specs",
    "parse_stages",
    "plan_stage_specs",
    "written_stage",
]

_LAYERS = re.compile(r"L(?P<first>\d{1,6})-(?P<last>\d{1,6})")
_TYPE = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:\*(?P<count>\d{1,6}))?(?:\((?P<own>[^()]*)\))?"
)
_NUMBERED = re.compile(r"(?P<key>tp|cp|dp|mb|ep|z|x)(?P<value>\d{1,7})")
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
    tensor_parallel_degree: int | None = Field(
        default=None, ge=1, le=limits.MAX_GPUS_PER_NODE, description="None: the stage's."
    )
    context_parallel_degree: int | None = Field(
        default=None, ge=1, le=limits.MAX_GPUS_PER_NODE, description="None: the stage's."
    )
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=limits.MAX_MICRO_BATCH_SIZE,
        description="Samples per micro-batch of each of its replicas (None: the stage's).",
    )
    recompute: Recompute | None = Field(default=None, description="None: the stage's.")
    offload: bool | None = Field(default=None, description="None: the stage's.")
    routed_experts: int | None = Field(
        default=None,
        ge=1,
        le=limits.MAX_FILE_INT,
        description="Routed experts each of its replicas holds (experts placed by GPU speed, "
        "Replica.routed_experts); None: experts / ep.",
    )

    def text(self) -> str:
        """The type in the grammar of the module docstring."""
        own = []
        if self.tensor_parallel_degree is not None:
            own.append(f"tp{self.tensor_parallel_degree}")
        if self.context_parallel_degree is not None:
            own.append(f"cp{self.context_parallel_degree}")
        if self.micro_batch_size is not None:
            own.append(f"mb{self.micro_batch_size}")
        if self.recompute is not None:
            own.append(self.recompute)
        if self.offload:
            own.append("offload")
        if self.routed_experts is not None:
            own.append(f"x{self.routed_experts}")
        count = "" if self.replicas is None else f"*{self.replicas}"
        return self.name + count + (f"({','.join(own)})" if own else "")


class StageSpec(BaseModel):
    """One pipeline stage as a person writes it (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    types: list[TypeShare] = Field(min_length=1, max_length=limits.MAX_GPU_TYPES)
    first_layer: int = Field(ge=0, le=limits.MAX_LAYERS, description="First layer (inclusive).")
    last_layer: int = Field(ge=0, le=limits.MAX_LAYERS, description="Last layer (inclusive).")
    tensor_parallel_degree: int | None = Field(
        default=None, ge=1, le=limits.MAX_GPUS_PER_NODE, description="None: each type says."
    )
    context_parallel_degree: int | None = Field(
        default=None, ge=1, le=limits.MAX_GPUS_PER_NODE, description="None: 1, or each type's."
    )
    expert_parallel_degree: int | None = Field(
        default=None, ge=1, le=limits.MAX_CLUSTER_GPUS, description="None: 1 (no ep)."
    )
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
    sequence_parallel: bool = Field(
        default=False,
        description="Sequence parallelism in this stage's tp groups (``:sp``; the command's "
        "--sp: every stage's).",
    )

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer + 1

    def text(self) -> str:
        """The stage in the grammar of the module docstring (parses back to itself)."""
        parts = ["+".join(t.text() for t in self.types), f"L{self.first_layer}-{self.last_layer}"]
        if self.tensor_parallel_degree is not None:
            parts.append(f"tp{self.tensor_parallel_degree}")
        if self.context_parallel_degree is not None:
            parts.append(f"cp{self.context_parallel_degree}")
        if any(t.replicas is None for t in self.types):
            parts.append(f"dp{self.data_parallel_degree}")
        if self.micro_batch_size is not None:
            parts.append(f"mb{self.micro_batch_size}")
        if self.recompute is not None:
            parts.append(self.recompute)
        if self.zero_stage is not None:
            parts.append(f"z{self.zero_stage}")
        if self.expert_parallel_degree is not None:
            parts.append(f"ep{self.expert_parallel_degree}")
        if self.offload:
            parts.append("offload")
        if self.sequence_parallel:
            parts.append("sp")
        return ":".join(parts)


def _options(
    items: list[str], where: str, allowed: tuple[str, ...], words: tuple[str, ...] = ("offload",)
) -> dict[str, int | str | bool]:
    """``tpT``, ``mbB``, recompute, ``offload`` (and ``dpD``, ``zZ``, ``sp`` where allowed),
    each at most once."""
    out: dict[str, int | str | bool] = {}
    for item in items:
        numbered = _NUMBERED.fullmatch(item)
        if numbered is not None and numbered["key"] in allowed and numbered["key"] not in out:
            out[numbered["key"]] = int(numbered["value"])
        elif item in ("none", "selective", "full") and "recompute" not in out:
            out["recompute"] = item
        elif item in words and item not in out:
            out[item] = True
        else:
            listed = ", ".join(f"{key}N" for key in allowed)
            raise InputError(
                f"{where}: {shown(item)} is not one of {listed}, none/selective/full, "
                f"{', '.join(words)} (each at most once)"
            )
    return out


def _stage(text: str, number: int) -> StageSpec:
    where = f"--stages stage {number} ({shown(text)})"
    head, _, rest = text.partition(":")
    fields = [part.strip() for part in rest.split(":")] if rest else []
    if not fields or not fields[0].startswith("L"):
        raise InputError(f"{where}: expected TYPES:Lfirst-last:tpT:dpD, e.g. A100:L0-11:tp2:dp4")
    types = []
    for item in head.split("+"):
        match = _TYPE.fullmatch(item.strip())
        if match is None:
            raise InputError(
                f"{where}: {shown(item)} is not a GPU type (NAME, NAME*REPLICAS, NAME(tpT,mbB))"
            )
        own = _options(
            [o.strip() for o in match["own"].split(",")] if match["own"] else [],
            where,
            ("tp", "cp", "mb", "x"),
        )
        count = match["count"]
        types.append(
            # The parsed words checked by the schema (validation, not a typed call).
            TypeShare.model_validate(
                {
                    "name": match["name"],
                    "replicas": None if count is None else int(count),
                    "tensor_parallel_degree": own.get("tp"),
                    "context_parallel_degree": own.get("cp"),
                    "micro_batch_size": own.get("mb"),
                    "recompute": own.get("recompute"),
                    "offload": own.get("offload"),
                    "routed_experts": own.get("x"),
                }
            )
        )
    layers = _LAYERS.fullmatch(fields[0])
    if layers is None:
        raise InputError(f"{where}: the layers are written Lfirst-last, e.g. L0-11")
    first, last = int(layers["first"]), int(layers["last"])
    if last < first:
        raise InputError(f"{where}: the last layer ({last}) comes before the first ({first})")
    numbers = _options(fields[1:], where, ("tp", "cp", "dp", "mb", "z", "ep"), ("offload", "sp"))
    given = [t.replicas for t in types if t.replicas is not None]
    if "dp" not in numbers:
        if len(given) < len(types):
            raise InputError(f"{where}: no dp; write e.g. :dp1 (or give every type's replicas)")
        numbers["dp"] = sum(given)
    dp = int(numbers["dp"])
    if "tp" not in numbers and any(t.tensor_parallel_degree is None for t in types):
        raise InputError(f"{where}: no tp; write e.g. :tp1 (or give every type's own)")
    if int(numbers.get("z", 0)) > 3:
        raise InputError(f"{where}: ZeRO levels are 0 to 3, not {numbers['z']}")
    if len(given) == len(types) and sum(given) != dp:
        raise InputError(f"{where}: the replicas per type add up to {sum(given)}, not dp {dp}")
    if len(types) > dp:
        raise InputError(f"{where}: {len(types)} GPU types need at least {len(types)} replicas")
    if any(t.micro_batch_size is not None for t in types) and len(given) < len(types):
        raise InputError(f"{where}: types with their own mb need their replicas: NAME*N(mbB)")
    try:
        return StageSpec.model_validate(
            {
                "types": types,
                "first_layer": first,
                "last_layer": last,
                "tensor_parallel_degree": numbers.get("tp"),
                "context_parallel_degree": numbers.get("cp"),
                "expert_parallel_degree": numbers.get("ep"),
                "data_parallel_degree": dp,
                "micro_batch_size": numbers.get("mb"),
                "recompute": numbers.get("recompute"),
                "zero_stage": numbers.get("z"),
                "offload": bool(numbers.get("offload", False)),
                "sequence_parallel": bool(numbers.get("sp", False)),
            }
        )
    except ValidationError as error:  # a pydantic bound: say which
        first_error = error.errors()[0]
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


def written_stage(
    first_layer: int,
    last_layer: int,
    groups: list[tuple[str, int, int, int, str, bool, int]],
    zero_stage: int,
    expert_parallel_degree: int = 1,
    experts: tuple[int, ...] = (),
    sequence_parallel: bool = False,
) -> StageSpec:
    """A stage of ``groups`` (name, replicas, tp, samples each, recompute, offload, cp) as the
    shortest spec that says it: what all groups share at the stage, the rest per type; with
    ``experts`` (one per group), the experts each group's replicas hold; with
    ``sequence_parallel``, its own SP (``:sp``)."""

    def common(index: int) -> object:
        values = {group[index] for group in groups}
        return next(iter(values)) if len(values) == 1 else None

    tp, mbs, recompute, offload, cp = common(2), common(3), common(4), common(5), common(6)
    # What the groups share is of no one type (``common``): the schema checks it.
    types = [
        TypeShare.model_validate(
            {
                "name": name,
                "replicas": count,
                "tensor_parallel_degree": None if tp is not None else group_tp,
                "micro_batch_size": None if mbs is not None else group_mbs,
                "recompute": None if recompute is not None else group_recompute,
                "offload": None if offload is not None else (group_offload or None),
                "context_parallel_degree": None if cp is not None else group_cp,
                "routed_experts": held,
            }
        )
        for (name, count, group_tp, group_mbs, group_recompute, group_offload, group_cp), held in (
            zip(groups, experts or [None] * len(groups), strict=True)
        )
    ]
    return StageSpec.model_validate(
        {
            "types": types,
            "first_layer": first_layer,
            "last_layer": last_layer,
            "tensor_parallel_degree": tp,
            "context_parallel_degree": None if cp in (None, 1) else cp,
            "expert_parallel_degree": None
            if expert_parallel_degree == 1
            else expert_parallel_degree,
            "data_parallel_degree": sum(group[1] for group in groups),
            "micro_batch_size": mbs,
            "recompute": None if recompute in (None, "none") else recompute,
            "zero_stage": zero_stage or None,
            "offload": bool(offload),
            "sequence_parallel": sequence_parallel,
        }
    )


def plan_stage_specs(plan: Plan) -> list[StageSpec]:
    """``plan``'s stages in this notation: its replicas of one kind (GPU type, tp, cp, share,
    recompute, offload) counted, in order of first appearance."""
    out = []
    for stage in plan.stages:
        kinds: dict[tuple[str, int, int, str, bool, int, int | None], int] = {}
        for r in stage.replicas:
            key = (
                r.gpu_type,
                r.tensor_parallel_degree,
                r.micro_batch_size,
                r.recompute,
                r.offload,
                r.context_parallel_degree,
                r.routed_experts,
            )
            kinds[key] = kinds.get(key, 0) + 1
        groups = [
            (name, n, tp, mbs, rc, off, cp) for (name, tp, mbs, rc, off, cp, _), n in kinds.items()
        ]
        held = [key[-1] for key in kinds]
        out.append(
            written_stage(
                stage.layer_start,
                stage.layer_end - 1,
                groups,
                stage.zero_stage,
                stage.expert_parallel_degree,
                () if None in held else tuple(x for x in held if x is not None),
                stage.sequence_parallel,
            )
        )
    return out
