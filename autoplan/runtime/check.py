"""Refuse, before any process trains, a plan the runtime would reject later or run wrongly.

Checked on every rank (and by ``autoplan run --local`` before it starts any process), so a bad
plan is one line, not a hang or an error from every rank halfway into the first step. The
checks are about the plan alone; the launch (world size, node ranks) is ``launch_check``'s and
the device (GPU type) ``device_check``'s.
"""

from __future__ import annotations

import logging

from torch import nn

from autoplan.checks import check_runtime_engine
from autoplan.errors import InputError
from autoplan.names import is_hf_name
from autoplan.plan.schema import Plan, Replica, Stage
from autoplan.runtime.model_stage import find_tied_weights, meta_model, pipeline_layers
from autoplan.runtime.tensor_parallel import vocabulary_shard_rows, vocabulary_sizes
from autoplan.schedule.zero_bubble import zero_bubble_problem
from autoplan.zoo import get_model_spec
from autoplan.zoo.moe import MoE

__all__ = ["check_async_plan", "check_runnable"]

logger = logging.getLogger(__name__)


def _placement(replica: Replica) -> tuple[str, str, int, tuple[int, ...], int]:
    return (
        replica.gpu_type,
        replica.node,
        replica.tensor_parallel_degree,
        tuple(replica.ranks),
        replica.micro_batch_size,
    )


def _check_stage_layout(plan: Plan) -> None:
    par = plan.parallelism
    previous_end = 0
    for position, stage in enumerate(plan.stages):
        if stage.index != position:
            raise InputError(f"stage {position} of the plan has index {stage.index}")
        if stage.layer_start != previous_end or stage.layer_end <= stage.layer_start:
            raise InputError(
                f"stage {stage.index} holds layers [{stage.layer_start}, {stage.layer_end}); "
                f"stages must be non-empty and follow on (it should start at {previous_end})"
            )
        # Both executors place stage s on pipeline rank s % pp (the plan's convention, and
        # torch's pipelining's), or in the V of the zbv and dualpipev schedules.
        if stage.pipeline_rank != par.rank_of_stage(stage.index):
            raise InputError(
                f"stage {stage.index} is on pipeline rank {stage.pipeline_rank}; with pp = "
                f"{par.pipeline_degree} it must be on {par.rank_of_stage(stage.index)}"
            )
        previous_end = stage.layer_end


def _check_shares(plan: Plan) -> None:
    par = plan.parallelism
    batch = par.micro_batch_size * par.num_micro_batches
    if batch != plan.inputs.global_batch_size:
        raise InputError(
            f"micro-batches of {par.micro_batch_size} samples × {par.num_micro_batches} = "
            f"{batch} samples, but the plan's global batch is {plan.inputs.global_batch_size}"
        )
    for stage in plan.stages:
        if stage.micro_batch_size != par.micro_batch_size:
            shares = " + ".join(str(share) for share in stage.shares)
            raise InputError(
                f"stage {stage.index}'s replicas take {shares} = {stage.micro_batch_size} "
                f"samples of each micro-batch; the plan's micro-batch is {par.micro_batch_size}"
            )


def _check_replicas(plan: Plan) -> None:
    """Every replica's ranks are where the rank map says, the stages of one pipeline rank run
    on the same replicas, and every rank of the launch serves exactly one pipeline rank."""
    world = plan.world_size
    for stage in plan.stages:
        for d, replica in enumerate(stage.replicas):
            # torch orders a process group's ranks ascending, and so the shards of a tp
            # DeviceMesh made from it: tp index t must be the t-th smallest rank.
            if replica.ranks != sorted(set(replica.ranks)):
                raise InputError(
                    f"stage {stage.index} replica {d} lists ranks {replica.ranks}; a replica's "
                    "ranks must be distinct and ascending by tp index"
                )
            tp = replica.tensor_parallel_degree
            where = (replica.gpu_type, replica.node)
            for position, rank in enumerate(replica.ranks):
                c, t = divmod(position, tp)  # rank i of a replica: cp index i // tp, tp i % tp
                if not 0 <= rank < world or plan.rank_map[rank].rank != rank:
                    raise InputError(
                        f"stage {stage.index} replica {d} lists rank {rank}; the rank map "
                        f"holds ranks 0..{world - 1} in order"
                    )
                entry = plan.rank_map[rank]
                if t == 0 and c > 0 and replica.context_tokens is not None:
                    # A cp group across GPU types spans nodes: each cp rank's tp group is on
                    # the node of its first rank (the validator checks the types).
                    where = (entry.gpu_type, entry.node)
                expected = (stage.pipeline_rank, d, t, *where)
                found = (
                    entry.pipeline_rank,
                    entry.dp_index,
                    entry.tp_index,
                    entry.gpu_type,
                    entry.node,
                )
                if found != expected:
                    raise InputError(
                        f"rank {rank} is (pipeline rank, replica, tp index, GPU type, node) "
                        f"= {found} in the rank map, but stage {stage.index} puts it at "
                        f"{expected}"
                    )
    owner: dict[int, int] = {}
    for p in range(plan.parallelism.pipeline_degree):
        stages = plan.stages_of_rank(p)
        first = stages[0]
        for other in stages[1:]:
            if [_placement(r) for r in other.replicas] != [_placement(r) for r in first.replicas]:
                raise InputError(
                    f"stages {first.index} and {other.index} both run on pipeline rank {p} but "
                    "on different replicas (GPUs, tp or shares); interleaved stages of one "
                    "pipeline rank must share its replicas"
                )
        for rank in first.ranks:
            if rank in owner:
                raise InputError(
                    f"rank {rank} serves pipeline ranks {owner[rank]} and {p}; a GPU runs one"
                )
            owner[rank] = p
    unused = sorted(set(range(world)) - set(owner))
    if unused:
        raise InputError(f"ranks {unused} of the rank map are in no stage's replicas")


def _check_tensor_parallel(plan: Plan, model: nn.Module) -> None:
    spec = get_model_spec(plan.inputs.model.name)
    degrees = sorted({r.tensor_parallel_degree for s in plan.stages for r in s.replicas})
    divisor = spec.tensor_parallel_divisor
    for tp in degrees:
        if divisor is not None and divisor % tp:
            raise InputError(
                f"tensor parallel degree {tp} does not divide {plan.inputs.model.name}'s "
                f"heads, kv heads and MLP width (their gcd is {divisor})"
            )
    # A tp degree that does not divide the vocabulary is not refused: the embedding and head
    # are then split unevenly (see tensor_parallel).
    for tp in degrees:
        for size in sorted(vocabulary_sizes(model)) if tp > 1 else []:
            if size % tp:
                logger.info(
                    "tensor parallel degree %d does not divide %s's vocabulary of %d: its "
                    "token embedding and head are split unevenly, %s rows per tp rank",
                    tp,
                    plan.inputs.model.name,
                    size,
                    "/".join(str(rows) for rows in vocabulary_shard_rows(size, tp)),
                )


def _check_same_config(plan: Plan, model: nn.Module) -> None:
    """A Hugging Face config is a file read again at run time: refuse one that no longer
    builds the model the plan was made for (the plan's parameter count is the profile's)."""
    name = plan.inputs.model.name
    if not is_hf_name(name):
        return
    count = sum(parameter.numel() for parameter in model.parameters())
    if count != plan.inputs.model.parameter_count:
        raise InputError(
            f"model '{name}' now has {count:,} parameters; the plan was made for "
            f"{plan.inputs.model.parameter_count:,} (the config changed since it was profiled: "
            "profile and solve again)"
        )


def _check_zero1(stage: Stage) -> None:
    degrees = {replica.tensor_parallel_degree for replica in stage.replicas}
    if stage.zero1 and len(degrees) > 1:
        raise InputError(
            f"stage {stage.index} shards optimizer states (ZeRO-{stage.zero_stage}) over replicas "
            f"of tp {sorted(degrees)}; the runtime shards them only over replicas of one tp degree "
            "(their shards must line up)"
        )


def _check_schedule(plan: Plan) -> None:
    par = plan.parallelism
    m = par.num_micro_batches
    dp = max(stage.data_parallel_degree for stage in plan.stages)
    modes = tuple(replica.recompute for stage in plan.stages for replica in stage.replicas)
    problem = zero_bubble_problem(par.schedule, par.pipeline_degree, m, dp, modes)
    if problem is not None:
        raise InputError(problem)
    if par.schedule == "1f1b" and m < par.pipeline_degree:
        raise InputError(f"1F1B needs micro-batches ({m}) >= pipeline stages ({par.num_stages})")
    if par.schedule == "interleaved_1f1b":
        rounds = max(1, m // par.pipeline_degree)
        if m % rounds:
            raise InputError(
                f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of "
                f"{rounds} = max(1, micro-batches // pp {par.pipeline_degree})"
            )


def check_runnable(plan: Plan) -> None:
    """Raise InputError (one line) unless the runtime can run ``plan``: the model it names
    with the plan's layer count (and, for a Hugging Face config, its parameter count); stages
    that follow on, each on pipeline rank index % pp; replica shares that add up to the
    micro-batch; replicas whose ranks match the rank map, the same replicas for every stage of
    a pipeline rank (interleaving); tp degrees that split whole heads; ZeRO-1 only over
    replicas of one tp; a schedule its micro-batches fit; a plan priced for this runtime."""
    check_runtime_engine(plan)
    model = meta_model(plan)
    _check_same_config(plan, model)
    num_layers = len(pipeline_layers(model))
    if num_layers != plan.inputs.model.num_layers:
        raise InputError(
            f"model '{plan.inputs.model.name}' has {num_layers} layers; the plan was made for "
            f"{plan.inputs.model.num_layers}"
        )
    if plan.stages[-1].layer_end != num_layers:
        raise InputError(
            f"the plan's stages cover layers [0, {plan.stages[-1].layer_end}); the model has "
            f"{num_layers}"
        )
    cps = sorted({r.context_parallel_degree for s in plan.stages for r in s.replicas} - {1})
    if cps and plan.mesh_shape() is None:
        raise InputError(
            f"the plan uses context parallelism (cp {cps[0]}) on stages of different shapes; "
            "autoplan's runtime runs cp on one (pp, dp, cp, tp) mesh only"
        )
    if plan.sequence_parallel_stages and any(isinstance(m, MoE) for m in model.modules()):
        # The router would take the sequence-sharded residual stream as it is (a DTensor).
        raise InputError(
            "the plan runs sequence parallelism on a mixture-of-experts model, which autoplan's "
            "runtime does not execute: solve with --no-sp"
        )
    _check_stage_layout(plan)
    _check_shares(plan)
    _check_replicas(plan)
    _check_tensor_parallel(plan, model)
    for stage in plan.stages:
        _check_zero1(stage)
    _check_schedule(plan)
    if plan.parallelism.schedule == "async_pb":
        check_async_plan(plan)


def check_async_plan(plan: Plan) -> None:
    """Refuse, in one line, async_pb plans the async executor cannot run.

    Any (dp, tp) per stage runs, unequal shares included. Refused: more than one stage per
    rank; expert parallelism (the replicas' gradients are summed whole, experts included);
    ZeRO (the stage's momentum-SGD state is not sharded); recompute and activation offload (a
    recomputed forward would run at the current weights, not the version the forward used,
    and give wrong gradients); weights tied across stages (their copies would need a gradient
    sum between stages that step at different times).
    """
    if plan.parallelism.virtual_stages_per_rank != 1:
        raise InputError("schedule async_pb runs one stage per pipeline rank")
    for stage in plan.stages:
        if stage.expert_parallel_degree > 1:
            raise InputError(
                f"schedule async_pb sums each stage's gradients over all its replicas; stage "
                f"{stage.index} asks for expert parallelism {stage.expert_parallel_degree} "
                "(use 1)"
            )
        if stage.zero_stage > 0:
            raise InputError(
                f"schedule async_pb steps momentum SGD per replica; stage {stage.index} asks "
                f"for ZeRO-{stage.zero_stage} (use zero_stage 0)"
            )
        for replica in stage.replicas:
            if replica.recompute != "none" or replica.offload:
                raise InputError(
                    f"schedule async_pb keeps the weights each forward used; stage "
                    f"{stage.index} asks for recompute {replica.recompute!r} / offload "
                    f"{replica.offload}, which would recompute at other weights (use none)"
                )
    model = meta_model(plan)
    if plan.stages[-1].layer_end != len(pipeline_layers(model)):
        return  # stages that miss layers: check_runnable says so
    tied = find_tied_weights(model, plan)
    if tied:
        raise InputError(
            f"schedule async_pb cannot run weights tied across stages ({', '.join(tied[0].names)} "
            f"on stages {list(tied[0].stages)}): each stage steps at its own time"
        )
