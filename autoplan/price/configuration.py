"""Price a configuration a person wrote: a plan file or stage specs → the plan solve would write.

``autoplan cost`` and ``autoplan.api.cost_plan`` read a configuration (a plan file, hand-written
or edited, or stage specs: ``autoplan.plan.stage_spec``), turn it into the cost model's
``PlanConfig``, cost it with the same ``CostModel.evaluate`` the search uses, and emit it with
the same ``emit_plan`` (placement on the nodes, rank map, prediction, memory per replica kind).
Nothing is searched: every knob is the user's.

Stage specs name GPU types; where a stage mixes types without saying how many replicas each
runs (``A+B:...:dp3``), the split is the first (most even first, stages in order) that fits
the cluster's GPUs and nodes. Replicas of one type go to its device classes in file order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from autoplan.checks import check_plan
from autoplan.cluster.schema import Cluster
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.engines import ENGINES, Engine
from autoplan.cost.model import CostModel, PlanCost
from autoplan.errors import InputError
from autoplan.names import shown
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.plan.stage_spec import StageSpec, TypeShare, format_stage_specs, parse_stages
from autoplan.profile.schema import Profile
from autoplan.schedule.names import MULTI_STAGE_SCHEDULES, V_SCHEDULES, stage_rank
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.emit import emit_plan
from autoplan.solve.placement import place

__all__ = [
    "PipelineKnobs",
    "Priced",
    "config_from_plan",
    "config_from_specs",
    "price_config",
    "price_configuration",
]

# Splits of mixed stages tried before giving up and asking for explicit counts (``A*2+B*1``).
_MAX_SPLITS = 20_000


@dataclass(frozen=True)
class PipelineKnobs:
    """What stage specs leave to the caller: the batch, the plan-wide knobs, and each stage's
    defaults where its spec does not say (``:mbB``, ``:full``, ``:zZ``).

    The micro-batches are ``num_micro_batches``, or ``global_batch`` over one micro-batch's
    samples; ``micro_batch_size`` is the samples of EACH replica per micro-batch (Megatron-LM's
    --micro-batch-size); ``pipeline_degree`` the pipeline ranks (default: one per stage; fewer
    for the multi-stage schedules, whose rank r runs stages r, r + pp, ...)."""

    global_batch: int | None = None
    num_micro_batches: int | None = None
    micro_batch_size: int = 1
    schedule: str = "1f1b"
    pipeline_degree: int | None = None
    recompute: str = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False


@dataclass(frozen=True)
class Priced:
    """A priced configuration: the plan as solve would write it, and the cost model's
    violations (what does not fit memory; empty when it fits)."""

    plan: Plan
    violations: list[str]
    # The same configuration as each engine runs it (``autoplan.cost.engines``); the plan's
    # prediction is its own engine's (``PlanInputs.engine``).
    iteration_ms_by_engine: dict[Engine, float] = field(default_factory=dict)


def _normal(name: str) -> str:
    # GPU names are written many ways ("GH-96", "gh96", "RTX_3090"): compare without case,
    # dashes, underscores or spaces.
    return "".join(ch for ch in name.casefold() if ch not in "-_ .")


def _classes_named(model: CostModel, name: str) -> list[int]:
    """Device classes a stage's type name stands for: its GPU type, or a node group's name."""
    wanted = _normal(name)
    by_type = [c.index for c in model.classes if _normal(c.gpu.name) == wanted]
    if by_type:
        return by_type
    by_group = [c.index for c in model.classes if any(_normal(g) == wanted for g in c.groups)]
    if by_group:
        return by_group
    known = sorted(
        {c.gpu.name for c in model.classes} | {g for c in model.classes for g in c.groups}
    )
    raise InputError(
        f"--stages names {shown(name)}: the cluster has no such GPU type or node group "
        f"(it has {', '.join(known)})"
    )


def _own_tp(spec: StageSpec, share: TypeShare) -> int:
    """A type's tp: its own, else the stage's (the parser makes sure one is given)."""
    return share.tensor_parallel_degree or spec.tensor_parallel_degree or 1


def _samples(spec: StageSpec, default_mbs: int) -> int:
    """Samples of one micro-batch the stage runs, over all its replicas."""
    stage_mbs = spec.micro_batch_size or default_mbs
    if all(t.micro_batch_size is None for t in spec.types):
        return spec.data_parallel_degree * stage_mbs
    # The parser asks for every type's replicas when one has its own share.
    return sum((t.replicas or 0) * (t.micro_batch_size or stage_mbs) for t in spec.types)


def _even_first(total: int, parts: int) -> list[tuple[int, ...]]:
    """Compositions of ``total`` into ``parts`` positive parts, the most even first."""
    out = [
        tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
        for cuts in itertools.combinations(range(1, total), parts - 1)
    ]
    return sorted(out, key=lambda c: (max(c) - min(c), [-x for x in c]))


def _stage_splits(spec: StageSpec) -> list[tuple[int, ...]]:
    """Replicas per listed type: given counts kept, the rest split every way (even first)."""
    free = [i for i, t in enumerate(spec.types) if t.replicas is None]
    given = sum(t.replicas or 0 for t in spec.types)
    left = spec.data_parallel_degree - given
    if not free:
        return [tuple(t.replicas or 0 for t in spec.types)]
    if left < len(free):
        return []
    out = []
    for parts in _even_first(left, len(free)):
        counts = [t.replicas or 0 for t in spec.types]
        for i, n in zip(free, parts, strict=True):
            counts[i] = n
        out.append(tuple(counts))
    return out


def _groups(
    model: CostModel,
    spec: StageSpec,
    counts: tuple[int, ...],
    classes: list[list[int]],
    free: list[int],
    defaults: tuple[int, str],
) -> tuple[ReplicaGroup, ...] | None:
    """The stage's replica groups, taking GPUs from ``free`` (per class; updated), or None
    when the counts do not fit what is left."""
    groups = []
    for count, options, share in zip(counts, classes, spec.types, strict=True):
        tp = _own_tp(spec, share)
        cp = share.context_parallel_degree or spec.context_parallel_degree or 1
        mbs = share.micro_batch_size or spec.micro_batch_size or defaults[0]
        recompute = share.recompute or spec.recompute or defaults[1]
        offload = spec.offload if share.offload is None else share.offload
        for k in options:
            size = tp * cp  # a replica's GPUs, on one node
            per_node = model.classes[k].gpus_per_node // size
            take = min(count, free[k] // size, per_node * model.classes[k].num_nodes)
            if take <= 0:
                continue
            groups.append(ReplicaGroup(k, tp, take, mbs, recompute, offload, cp))
            free[k] -= take * size
            count -= take
            if count == 0:
                break
        if count:
            return None
    return tuple(groups)


def _experts_held(
    model: CostModel, spec: StageSpec, groups: tuple[ReplicaGroup, ...]
) -> tuple[int, ...]:
    """Each group's experts where the spec's types say theirs (``xN``: experts placed by GPU
    speed), else () (experts / ep)."""
    held = [t.routed_experts for t in spec.types]
    if all(x is None for x in held):
        return ()
    if any(x is None for x in held):
        raise InputError(
            f"--stages L{spec.first_layer}-{spec.last_layer}: some types say their experts (xN) "
            "and some do not; all or none do"
        )
    out = []
    for group in groups:
        owner = next(t for t in spec.types if group.device_class in _classes_named(model, t.name))
        assert owner.routed_experts is not None
        out.append(owner.routed_experts)
    return tuple(out)


def _assignments(
    model: CostModel,
    specs: list[StageSpec],
    pp: int,
    defaults: tuple[int, str],
) -> Iterator[list[tuple[ReplicaGroup, ...]]]:
    """Every way (up to ``_MAX_SPLITS``) to give the first ``pp`` stages their groups."""
    classes = [[_classes_named(model, t.name) for t in spec.types] for spec in specs[:pp]]
    for spec, names in zip(specs, classes, strict=False):
        for t, options in zip(spec.types, names, strict=True):
            cp = t.context_parallel_degree or spec.context_parallel_degree or 1
            if _own_tp(spec, t) * cp > max(model.classes[k].gpus_per_node for k in options):
                raise InputError(
                    f"--stages: tp {_own_tp(spec, t)} x cp {cp} exceeds the "
                    f"{max(model.classes[k].gpus_per_node for k in options)} GPUs per node of "
                    f"{shown(t.name)} (a replica stays within one node)"
                )
    splits = [_stage_splits(spec) for spec in specs[:pp]]
    for tried, choice in enumerate(itertools.product(*splits), start=1):
        if tried > _MAX_SPLITS:
            raise InputError(
                "--stages: too many ways to split the mixed stages' replicas among their GPU "
                "types; say how many each runs, e.g. A100*2+V100*1"
            )
        free = [c.total_gpus for c in model.classes]
        out = []
        for spec, counts, names in zip(specs[:pp], choice, classes, strict=True):
            groups = _groups(model, spec, counts, names, free, defaults)
            if groups is None:
                break
            out.append(groups)
        else:
            yield out


def config_from_specs(
    model: CostModel, specs: list[StageSpec], knobs: PipelineKnobs = PipelineKnobs()
) -> PlanConfig:
    """The configuration ``specs`` describe on ``model``'s cluster, run with ``knobs``.
    Raises InputError naming what does not fit."""
    global_batch, num_micro_batches = knobs.global_batch, knobs.num_micro_batches
    micro_batch_size, schedule = knobs.micro_batch_size, knobs.schedule
    layers = model.num_layers
    if specs[-1].last_layer != layers - 1:
        raise InputError(
            f"--stages end at layer {specs[-1].last_layer}; the model's last layer is "
            f"{layers - 1} (layers 0-{layers - 1}, {layers} layers)"
        )
    pp = knobs.pipeline_degree or len(specs)
    if len(specs) % pp:
        raise InputError(f"{len(specs)} stages do not divide among {pp} pipeline ranks")
    chunks = len(specs) // pp
    if chunks > 1 and schedule not in MULTI_STAGE_SCHEDULES:
        raise InputError(
            f"{len(specs)} stages on {pp} pipeline ranks need a multi-stage schedule "
            f"({', '.join(MULTI_STAGE_SCHEDULES)}), not {schedule}"
        )
    v_shape = schedule in V_SCHEDULES
    for s, spec in enumerate(specs):
        rank = stage_rank(s, pp, v_shape=v_shape)
        owner = specs[rank]
        same = (
            "types",
            "tensor_parallel_degree",
            "data_parallel_degree",
            "micro_batch_size",
            "context_parallel_degree",
        )
        if any(getattr(spec, f) != getattr(owner, f) for f in same):
            raise InputError(
                f"--stages stage {s} runs on the GPUs of stage {rank} "
                f"(pipeline rank {rank}): give it the same types, tp, dp "
                "and micro-batch size"
            )
    samples = [_samples(spec, micro_batch_size) for spec in specs]
    if len(set(samples)) > 1:
        rows = ", ".join(f"stage {s}: {n}" for s, n in enumerate(samples))
        raise InputError(
            f"every stage must take the same samples per micro-batch (dp × per-replica "
            f"micro-batch size); they take {rows}: set each stage's with :mbB"
        )
    if num_micro_batches is None:
        if global_batch is None:
            raise InputError("give --global-batch or --num-micro-batches")
        if global_batch % samples[0]:
            raise InputError(
                f"--global-batch {global_batch} is not a multiple of one micro-batch's "
                f"{samples[0]} samples (dp × per-replica micro-batch size)"
            )
        num_micro_batches = global_batch // samples[0]
    elif global_batch is not None and global_batch != num_micro_batches * samples[0]:
        raise InputError(
            f"--global-batch {global_batch} != {num_micro_batches} micro-batches × "
            f"{samples[0]} samples"
        )
    defaults = (micro_batch_size, knobs.recompute)
    for groups in _assignments(model, specs, pp, defaults):
        stages = tuple(
            StageChoice(
                spec.first_layer,
                spec.last_layer + 1,
                groups[stage_rank(s, pp, v_shape=v_shape)],
                knobs.zero_stage if spec.zero_stage is None else spec.zero_stage,
                spec.expert_parallel_degree or 1,
                _experts_held(model, spec, groups[stage_rank(s, pp, v_shape=v_shape)]),
                spec.sequence_parallel,
            )
            for s, spec in enumerate(specs)
        )
        for s, stage in enumerate(stages):
            if stage.sequence_parallel and not stage.tensor_parallel:
                # SP shards each tp group's sequence: without tp the flag would be dropped.
                raise InputError(
                    f"--stages stage {s}: :sp (sequence parallelism) needs tp > 1 in the stage"
                )
            try:
                model.expert_span(stage)
            except ValueError as error:
                raise InputError(f"--stages stage {s}: {error}") from None
        config = PlanConfig(num_micro_batches, schedule, chunks, stages, knobs.sequence_parallel)
        if not config.mesh_shaped():  # autoplan's runtime runs it on per-stage groups
            config = dataclasses.replace(config, executor="groups")
        tp = max(g.tp for stage in stages for g in stage.groups)
        if tp > 1 and not any(layer.tensor_parallel for layer in model.profile.layers):
            # Without the split every tp rank would run whole layers: not tensor parallelism.
            raise InputError(
                f"tp {tp} needs the profile's tensor-parallel split and this profile has none "
                "(profile a factory model with --tp-divisor)"
            )
        try:
            place(model, config)
        except ValueError:
            continue  # this split does not fit the nodes: try the next
        return config
    have = ", ".join(f"{c.total_gpus} {c.gpu.name} ({c.label})" for c in model.classes)
    raise InputError(
        f"the stages do not fit the cluster's GPUs and nodes (it has {have}); check each "
        "stage's tp × dp and GPU types"
    )


def config_from_plan(model: CostModel, plan: Plan) -> PlanConfig:
    """The configuration of ``plan``'s stages and replicas (their GPU types by node), as the
    cost model reads it. Replicas of one kind in a stage become one group."""
    if plan.parallelism.schedule == "async_pb":
        raise InputError(
            "async_pb plans are priced by `autoplan solve --allow-async`, not by `autoplan cost`"
        )
    if any(r.context_tokens for s in plan.stages for r in s.replicas):
        # A configuration's groups are one class with equal chunks: pricing it as one would
        # drop the chunks (autoplan.solve.context_span_plan prices the one such plan it writes).
        raise InputError(
            "the plan splits sequences unevenly over its cp ranks (context_tokens), which "
            "`autoplan cost` does not price"
        )
    class_of_group = {name: c.index for c in model.classes for name in c.groups}
    class_of_node = {node.name: class_of_group[node.group] for node in model.cluster.nodes()}
    stages = []
    for stage in plan.stages:
        counts: dict[tuple[int, int, int, str, bool, int, int | None], int] = {}
        for replica in stage.replicas:
            k = class_of_node.get(replica.node)
            if k is None:
                raise InputError(
                    f"stage {stage.index}: node {shown(replica.node)} is not in the cluster"
                )
            if model.classes[k].gpu.name != replica.gpu_type:
                raise InputError(
                    f"stage {stage.index}: node {shown(replica.node)} has "
                    f"{model.classes[k].gpu.name} GPUs, the replica says {replica.gpu_type}"
                )
            key = (
                k,
                replica.tensor_parallel_degree,
                replica.micro_batch_size,
                replica.recompute,
                replica.offload,
                replica.context_parallel_degree,
                replica.routed_experts,
            )
            counts[key] = counts.get(key, 0) + 1
        groups = tuple(
            ReplicaGroup(k, tp, n, mbs, recompute, offload, cp)
            for (k, tp, mbs, recompute, offload, cp, _), n in counts.items()
        )
        # Experts placed by speed: each group's experts per rank (its replicas' own).
        held = tuple(key[-1] for key in counts)
        experts = () if None in held else tuple(x for x in held if x is not None)
        choice = StageChoice(
            stage.layer_start,
            stage.layer_end,
            groups,
            stage.zero_stage,
            stage.expert_parallel_degree,
            experts,
            stage.sequence_parallel,
        )
        try:
            model.expert_span(choice)
        except ValueError as error:
            raise InputError(f"stage {stage.index}: {error}") from None
        stages.append(choice)
    par = plan.parallelism
    # Plans written before the executor was recorded run where the runtime puts them.
    executor = par.executor or ("mesh" if plan.runs_on_mesh() else "groups")
    return PlanConfig(
        par.num_micro_batches,
        par.schedule,
        par.virtual_stages_per_rank,
        tuple(stages),
        par.sequence_parallel,
        executor,
    )


def price_config(model: CostModel, config: PlanConfig, inputs: PlanInputs) -> Priced:
    """``config`` costed and emitted as a plan (no alternatives: nothing was searched).

    Raises InputError where the stages of one pipeline rank differ or the GPUs do not fit
    the nodes; memory that does not fit is a violation, not an error (the price is still the
    answer the user asked for)."""
    if config.samples_per_iteration != inputs.global_batch_size:
        raise InputError(
            f"the stages run {config.samples_per_iteration} samples per iteration "
            f"({config.num_micro_batches} micro-batches of {config.micro_batch_size}); the "
            f"global batch is {inputs.global_batch_size}"
        )
    expected = 0
    for s, stage in enumerate(config.stages):
        if stage.layer_start != expected or stage.layer_end <= stage.layer_start:
            raise InputError(
                f"stage {s} holds layers [{stage.layer_start}, {stage.layer_end}); the stages "
                f"must cover the layers in order without gaps, so it must start at {expected} "
                "and hold at least one"
            )
        expected = stage.layer_end
    if expected != model.num_layers:
        raise InputError(
            f"the stages end at layer {expected - 1}; the model has layers "
            f"0-{model.num_layers - 1} ({model.num_layers} layers)"
        )
    try:
        cost: PlanCost = model.evaluate(config)
        plan = emit_plan(model, config, cost, inputs, [])
    except ValueError as error:
        raise InputError(f"the stages cannot be placed on the cluster: {error}") from None
    by_engine = {
        engine: (
            cost.iteration_ms
            if engine == model.engine
            else model.with_engine(engine).evaluate(config).iteration_ms
        )
        for engine in ENGINES
    }
    return Priced(plan, list(cost.violations), by_engine)


def price_configuration(
    profile: Profile,
    cluster: Cluster | None,
    *,
    plan: Plan | None = None,
    stages: str | Sequence[StageSpec] | None = None,
    knobs: PipelineKnobs = PipelineKnobs(),
    profile_sha256: str = "",
    engine: Engine | None = None,
) -> Priced:
    """Price ``plan`` (on its own cluster unless ``cluster`` is given) or ``stages`` (text or
    specs, on ``cluster``, run with ``knobs``), checked as ``solve``'s plans are, memory fit
    aside (see ``Priced``), as ``engine`` runs it (default: the plan's own engine; autoplan's
    runtime for stages).

    Raises InputError for what cannot be priced, PlanInvalidError for a plan that breaks the
    validator's rules."""
    if (plan is None) == (stages is None):
        raise InputError("price either a plan or stages, not both or neither")
    if plan is not None:
        if plan.inputs.model.name != profile.model.name:
            raise InputError(
                f"the plan is for model {shown(plan.inputs.model.name)}; the profile is of "
                f"{shown(profile.model.name)}"
            )
        hardware = plan.inputs.cluster if cluster is None else cluster
        model = cost_model(profile, hardware, SolveOptions(engine=engine or plan.inputs.engine))
        config = config_from_plan(model, plan)
        pinned = {"source": "plan"}
    else:
        if cluster is None:
            raise InputError("pricing stages needs a cluster")
        hardware = cluster
        specs = parse_stages(stages) if isinstance(stages, str) else list(stages or [])
        if not specs:
            raise InputError("no stages to price")
        model = cost_model(profile, hardware, SolveOptions(engine=engine or "autoplan"))
        config = config_from_specs(model, specs, knobs)
        pinned = {"stages": format_stage_specs(specs)}
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256=profile_sha256,
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=hardware,
        global_batch_size=config.samples_per_iteration,
        strategy="given",
        pinned=pinned,
        engine=model.engine,
    )
    priced = price_config(model, config, inputs)
    # Memory that does not fit is the answer (``violations``), not a reason to refuse.
    check_plan(priced.plan, profile, fit=False)
    return priced
