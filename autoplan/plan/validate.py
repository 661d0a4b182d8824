"""An independent check of a plan: the rules every executable plan obeys.

The solver re-checks its own answer with its own code; this module checks plans again from
their definition only (``autoplan.plan.schema``: stages, their replicas, the rank map; the
cluster file and, when given, the profile), so that a bug in the cost model or the search
cannot hide itself. It must therefore never import ``autoplan.cost`` or ``autoplan.solve``.

Every rule is checked and every violation is reported at once, in one PlanInvalidError.
Plans made with ``model_copy(update=...)`` skip pydantic's own checks, so nothing here assumes
that the schema validators ran.

The rules, by family (one ``_check_*`` function each):

- stages: indices in order, stage ``s`` on pipeline rank ``s % pp``, contiguous non-empty
  layer ranges that cover the model;
- batch and schedule: every stage's replica shares add up to ``micro_batch_size``, global
  batch = micro_batch_size × num_micro_batches, ZeRO-1 only over more than one replica, the
  interleaved schedule's conditions;
- replicas and ranks: ranks 0..world-1 once each; every rank belongs to exactly one replica of
  its pipeline rank, and its rank_map entry agrees with that replica (pipeline rank, dp index
  = replica index, tp index = position in the replica, node, GPU type); a replica's tp GPUs sit
  on its one node; the stages of one pipeline rank run on identical replicas (same GPUs, same
  shares; recompute may differ per stage module); offload only with recompute none or full;
- nodes: in launch order, each holding the contiguous block of ranks torchrun gives it;
- memory: an estimate for every (pipeline rank, replica kind = GPU type, tp, share), its parts
  adding up, total + reserve within the GPU's memory; with the profile, the independent floor;
- prediction: samples/s, tokens/s, the breakdown, TFLOP/s per GPU over the world size, the
  per-replica and per-rank figures, and the idle GPUs per type.

The independent memory floor of one GPU of a replica of tp t on pipeline rank p: it holds at
least its stages' parameters split t ways (a tp group shards at most every parameter), once as
weights and once as gradients (in the training dtype), and Adam's two moments per parameter in
fp32 (fp64 when training in fp64), those of a stage further split over the stage's replicas
under ZeRO-1, and weights and gradients too under ZeRO-2/3 (FSDP2 holds their shards).
Mixed-precision Adam keeps more (fp32 master weights, 16-18 bytes per parameter), so this is
a floor: a plan's estimate below it has forgotten something, and a floor above the
GPU's usable memory means the plan cannot run.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import GpuSpec, Node
from autoplan.errors import PlanInvalidError
from autoplan.limits import GIB
from autoplan.plan.schema import (
    MemoryEstimate,
    Plan,
    RankEntry,
    Replica,
    ReplicaTiming,
    Stage,
    StageTiming,
)
from autoplan.profile.schema import Profile
from autoplan.schedule.names import MULTI_STAGE_SCHEDULES, V_SCHEDULES
from autoplan.schedule.zero_bubble import zero_bubble_problem

__all__ = ["plan_problems", "validate_plan"]

# Relative tolerance when comparing figures the plan states twice (rates, sums of parts).
_RELATIVE_TOLERANCE = 0.01
# Bytes per element of one Adam moment, by training dtype (fp32 states unless fp64).
_ADAM_MOMENT_BYTES = {"fp64": 8}
_ADAM_MOMENT_BYTES_DEFAULT = 4
# Replica kind: what one memory estimate describes (pipeline rank, GPU type, tp, share).
_Kind = tuple[int, str, int, int]


def validate_plan(plan: Plan, profile: Profile | None = None) -> None:
    """Raise PlanInvalidError listing every rule ``plan`` breaks; return None if it breaks none.

    With ``profile`` (the one the plan was solved on), also check the layer count,
    tensor-parallel divisibility and the independent memory floor.
    """
    problems = plan_problems(plan, profile)
    if problems:
        raise PlanInvalidError(problems)


def plan_problems(plan: Plan, profile: Profile | None = None, *, fit: bool = True) -> list[str]:
    """Every rule ``plan`` breaks, as one message each (empty when valid).

    ``fit=False`` leaves out whether the memory estimates fit the GPUs (``autoplan cost``
    prices a configuration that does not fit, and says so, rather than refusing it)."""
    problems: list[str] = []
    _check_layers_and_stages(plan, profile, problems)
    _check_batch_and_schedule(plan, problems)
    _check_replicas(plan, problems)
    _check_nodes(plan, problems)
    _check_sequence_parallel(plan, problems)
    _check_context_parallel(plan, problems)
    _check_executor(plan, problems)
    _check_async_pb(plan, problems)
    _check_expert_parallel(plan, profile, problems)
    _check_experts_without_sp(plan, profile, problems)
    if profile is not None:
        _check_against_profile(plan, profile, problems)
    _check_memory(plan, profile, problems, fit)
    _check_prediction(plan, problems)
    _check_idle_gpus(plan, problems)
    return problems


def _check_executor(plan: Plan, problems: list[str]) -> None:
    # A prediction priced for the mesh executor hides the all-reduce behind the last
    # backward: the runtime must be able to run the plan there.
    if plan.parallelism.executor == "mesh" and not plan.runs_on_mesh():
        problems.append(
            "priced for the mesh executor, but one (pp, dp, cp, tp) mesh cannot hold the plan "
            "(stages of other replicas, tp or shares, ranks out of mesh order, or expert "
            "parallelism): it runs on per-stage groups"
        )


def _check_async_pb(plan: Plan, problems: list[str]) -> None:
    """async_pb runs any (dp, tp) per stage, but keeps each forward's weight version: no
    recompute or offload (a recomputed forward would use other weights), and steps plain
    momentum SGD per replica: no ZeRO."""
    if plan.parallelism.schedule != "async_pb":
        return
    for stage in plan.stages:
        if stage.zero_stage > 0:
            problems.append(f"async_pb stage {stage.index} has ZeRO-{stage.zero_stage}; use 0")
        modes = sorted({r.recompute for r in stage.replicas if r.recompute != "none"})
        if modes or any(r.offload for r in stage.replicas):
            problems.append(
                f"async_pb stage {stage.index} has recompute {modes or ['none']} / offload "
                f"{any(r.offload for r in stage.replicas)}; it needs neither"
            )


def _check_experts_without_sp(plan: Plan, profile: Profile | None, problems: list[str]) -> None:
    """Sequence parallelism is not run on mixture-of-experts models (the runtime's router
    does not take a sequence-sharded stream), on any stage."""
    stages = plan.sequence_parallel_stages
    if not stages or profile is None:
        return
    if any(layer.experts is not None for layer in profile.layers):
        named = f"stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))}"
        where = "" if plan.parallelism.sequence_parallel else f" ({named})"
        problems.append(
            f"sequence parallelism is on{where}, but the model has mixture-of-experts layers"
        )


def _check_expert_parallel(plan: Plan, profile: Profile | None, problems: list[str]) -> None:
    """ep cuts a stage's replicas into expert groups of ep consecutive replicas, each of one
    GPU type, tp and share (its ranks exchange equal slot buffers), unless its replicas say
    which experts they hold (``routed_experts``: experts placed by speed, ``_check_uneven_
    experts``); ep divides the experts of every MoE layer of the stage (with the profile: and
    the model has some); ZeRO 0 or 1 with it (``autoplan.cost.expert_parallel``)."""
    for stage in plan.stages:
        ep = stage.expert_parallel_degree
        uneven = [r.routed_experts for r in stage.replicas]
        if ep == 1:
            if any(x is not None for x in uneven):
                problems.append(
                    f"stage {stage.index} (ep 1): its replicas list routed_experts; only a "
                    "stage with ep > 1 places experts"
                )
            continue
        where = f"stage {stage.index} (ep {ep})"
        replicas = stage.replicas
        if len(replicas) % ep:
            problems.append(f"{where}: ep must divide its {len(replicas)} replicas")
        elif any(x is not None for x in uneven):
            _check_uneven_experts(stage, profile, where, problems)
        else:
            for start in range(0, len(replicas), ep):
                kinds = {
                    (
                        r.gpu_type,
                        r.tensor_parallel_degree,
                        r.context_parallel_degree,
                        r.micro_batch_size,
                    )
                    for r in replicas[start : start + ep]
                }
                if len(kinds) > 1:
                    problems.append(
                        f"{where}: expert group of replicas {start}-{start + ep - 1} mixes "
                        f"(GPU type, tp, cp, share) {sorted(kinds)}; an expert group is one kind"
                    )
        if stage.zero_stage > 1:
            problems.append(f"{where} has ZeRO-{stage.zero_stage}; ep composes with ZeRO 0 or 1")
        if profile is None:
            continue
        counts = {
            layer.experts.num_experts
            for layer in profile.layers[stage.layer_start : stage.layer_end]
            if layer.experts is not None
        }
        # A stage without MoE layers (an embedding alone) may carry the plan's ep: it then
        # only groups its ZeRO-1 shards by expert index. A model without any may not.
        if not any(layer.experts is not None for layer in profile.layers):
            problems.append(f"{where}: the model has no mixture-of-experts layers")
        if any(x is not None for x in uneven):
            continue  # the sums of routed_experts are checked against the experts instead
        for count in sorted(c for c in counts if c % ep):
            problems.append(f"{where}: ep must divide the {count} experts of its MoE layers")


def _check_uneven_experts(
    stage: Stage, profile: Profile | None, where: str, problems: list[str]
) -> None:
    """Experts placed by speed: every replica says how many experts it holds (at least one);
    every expert group holds each layer's experts once (its replicas' counts sum to the
    experts of every MoE layer of the model) and in the same order (the replicas at one place
    of their groups hold the same experts: their gradients are summed together); its ranks
    share tp and cp (each tp rank exchanges with the same tp rank of the others), while GPU
    types and shares may differ (the exchange's split sizes follow them)."""
    ep = stage.expert_parallel_degree
    held = [r.routed_experts for r in stage.replicas]
    if any(x is None for x in held):
        problems.append(
            f"{where}: some replicas list routed_experts and some do not; all or none do"
        )
        return
    first = held[:ep]
    for start in range(0, len(held), ep):
        group = stage.replicas[start : start + ep]
        if held[start : start + ep] != first:
            problems.append(
                f"{where}: expert group of replicas {start}-{start + ep - 1} holds "
                f"{held[start : start + ep]} experts; the first holds {first} (every expert "
                "group places the experts alike)"
            )
        shapes = {(r.tensor_parallel_degree, r.context_parallel_degree) for r in group}
        if len(shapes) > 1:
            problems.append(
                f"{where}: expert group of replicas {start}-{start + ep - 1} mixes (tp, cp) "
                f"{sorted(shapes)}; its ranks exchange tp rank by tp rank"
            )
    total = sum(x for x in first if x is not None)
    counts: set[int] = set()
    if profile is not None:
        counts = {layer.experts.num_experts for layer in profile.layers if layer.experts}
    for count in sorted(counts - {total}):
        problems.append(
            f"{where}: an expert group's routed_experts sum to {total}; the model's MoE "
            f"layers have {count}"
        )


def _check_sequence_parallel(plan: Plan, problems: list[str]) -> None:
    """SP shards the sequence over each tp group of the stages that run it (all of them with
    ``parallelism.sequence_parallel``, else those with their own flag): the plan-wide setting
    needs tp > 1 somewhere, a stage's own needs tp > 1 in that stage (without it the flag says
    nothing: the canonical plan does not write it), and every tp degree of a stage running it
    must divide the sequence length."""
    degrees: set[int] = set()
    for stage in plan.stages:
        stage_degrees = {r.tensor_parallel_degree for r in stage.replicas}
        if stage.sequence_parallel and max(stage_degrees) <= 1:
            problems.append(
                f"stage {stage.index} runs sequence parallelism (its sequence_parallel) but "
                "none of its replicas runs tensor parallel"
            )
        if plan.stage_sequence_parallel(stage):
            degrees |= stage_degrees
    if plan.parallelism.sequence_parallel and max(degrees) <= 1:
        problems.append("sequence parallelism is on but no replica runs tensor parallel")
    seq = plan.inputs.seq_len
    for degree in sorted(degrees):
        if degree > 1 and seq % degree:
            problems.append(
                f"sequence parallelism: tensor parallel degree {degree} does not divide the "
                f"sequence length {seq}"
            )


def _check_context_parallel(plan: Plan, problems: list[str]) -> None:
    """cp cuts every sample into 2·cp equal pieces (load-balanced causal chunks), so 2·cp must
    divide the sequence length; a stage's replicas share one cp (its cp ranks reduce
    gradients with its replicas as one group). Uneven chunks (``context_tokens``) are two
    mirrored pieces per rank: even counts summing to the sequence length, each divisible by
    tp under sequence parallelism (its tp group splits the rank's chunk)."""
    seq = plan.inputs.seq_len
    for stage in plan.stages:
        sp = plan.stage_sequence_parallel(stage)
        degrees = sorted({r.context_parallel_degree for r in stage.replicas})
        if len(degrees) > 1:
            problems.append(
                f"stage {stage.index} mixes context parallel degrees {degrees}; its replicas "
                "share one"
            )
        for d, replica in enumerate(stage.replicas):
            tokens = replica.context_tokens
            if tokens is None:
                continue
            name = f"replica {d} of stage {stage.index}"
            if sum(tokens) != seq or any(t <= 0 or t % 2 for t in tokens):
                problems.append(
                    f"{name}: context_tokens {tokens} must be positive even counts (two "
                    f"mirrored pieces per cp rank) summing to the sequence length {seq}"
                )
            tp = replica.tensor_parallel_degree
            if sp and any(t % tp for t in tokens):
                problems.append(
                    f"{name}: sequence parallelism splits each cp rank's tokens over tp {tp}; "
                    f"context_tokens {tokens} are not all divisible by {tp}"
                )
        for degree in degrees:
            uneven = all(r.context_tokens is not None for r in stage.replicas)
            if degree > 1 and seq % (2 * degree) and not uneven:
                problems.append(
                    f"context parallel degree {degree} of stage {stage.index}: 2 × {degree} "
                    f"load-balanced chunks do not divide the sequence length {seq}"
                )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_RELATIVE_TOLERANCE, abs_tol=1e-9)


def _stages_by_rank(plan: Plan) -> dict[int, list[Stage]]:
    """Stages of each pipeline rank 0..pp-1, in stage order (a rank may have none)."""
    by_rank: dict[int, list[Stage]] = {p: [] for p in range(plan.parallelism.pipeline_degree)}
    for stage in plan.stages:
        by_rank.setdefault(stage.pipeline_rank, []).append(stage)
    return by_rank


def _replicas_of_rank(plan: Plan) -> dict[int, list[Replica]]:
    """The replicas of each pipeline rank: those of its first stage (the others must agree)."""
    return {p: stages[0].replicas for p, stages in _stages_by_rank(plan).items() if stages}


def _kind_text(kind: _Kind) -> str:
    p, gpu_type, tp, share = kind
    return (
        f"pipeline rank {p}'s {gpu_type} tp {tp} replicas with {share} "
        f"sample{'' if share == 1 else 's'}"
    )


# ---- stages -------------------------------------------------------------------------------


def _check_layers_and_stages(plan: Plan, profile: Profile | None, problems: list[str]) -> None:
    par = plan.parallelism
    num_layers = plan.inputs.model.num_layers
    if profile is not None and len(profile.layers) != num_layers:
        problems.append(
            f"plan's model has {num_layers} layers; the profile has {len(profile.layers)}"
        )
        num_layers = len(profile.layers)
    expected_stages = par.pipeline_degree * par.virtual_stages_per_rank
    if len(plan.stages) != expected_stages:
        problems.append(
            f"{len(plan.stages)} stages; pp ({par.pipeline_degree}) × virtual stages per rank "
            f"({par.virtual_stages_per_rank}) = {expected_stages}"
        )
    next_layer = 0
    for position, stage in enumerate(plan.stages):
        if stage.index != position:
            problems.append(f"stage at position {position} has index {stage.index}")
        if stage.pipeline_rank != par.rank_of_stage(position):
            rule = "the V of " + par.schedule if par.schedule in V_SCHEDULES else f"{position} % pp"
            problems.append(
                f"stage {position} runs on pipeline rank {stage.pipeline_rank}; "
                f"it must be {par.rank_of_stage(position)} ({rule})"
            )
        if stage.layer_start != next_layer:
            problems.append(
                f"stage {position} starts at layer {stage.layer_start}; the previous stage "
                f"ends at {next_layer} (stages must be contiguous, in order, non-overlapping)"
            )
        if stage.layer_end <= stage.layer_start:
            problems.append(
                f"stage {position} is empty or reversed: layers [{stage.layer_start}, "
                f"{stage.layer_end})"
            )
        next_layer = max(next_layer, stage.layer_end)
    if next_layer != num_layers:
        problems.append(f"stages cover layers up to {next_layer}; the model has {num_layers}")


# ---- batch and schedule -------------------------------------------------------------------


def _check_batch_and_schedule(plan: Plan, problems: list[str]) -> None:
    par = plan.parallelism
    micro_batch = par.micro_batch_size
    for stage in plan.stages:
        shares = stage.shares
        if not shares:
            problems.append(f"stage {stage.index} has no replicas")
            continue
        if min(shares) < 1:
            problems.append(f"stage {stage.index} has a replica share below 1: {shares}")
        if sum(shares) != micro_batch:
            problems.append(
                f"stage {stage.index}'s replica shares {shares} add up to {sum(shares)}; the "
                f"micro-batch is {micro_batch} samples (every stage runs all of them)"
            )
        if stage.zero1 and len(shares) < 2:
            problems.append(
                f"stage {stage.index} has zero1 with a single replica; ZeRO-1 shards optimizer "
                "states across replicas"
            )
        tps = sorted({replica.tensor_parallel_degree for replica in stage.replicas})
        if stage.zero_stage >= 2 and len(tps) > 1:
            problems.append(
                f"stage {stage.index} has ZeRO-{stage.zero_stage} over replicas of tp {tps}; "
                "its shards line up only over replicas of one tp"
            )
    samples = micro_batch * par.num_micro_batches
    if samples != plan.inputs.global_batch_size:
        problems.append(
            f"global batch {plan.inputs.global_batch_size} != micro-batch size ({micro_batch}) × "
            f"micro-batches ({par.num_micro_batches}) = {samples}"
        )
    modes = tuple(replica.recompute for stage in plan.stages for replica in stage.replicas)
    dp = max((stage.data_parallel_degree for stage in plan.stages), default=1)
    zero_bubble = zero_bubble_problem(
        par.schedule, par.pipeline_degree, par.num_micro_batches, dp, modes
    )
    if zero_bubble is not None:
        problems.append(zero_bubble)
    if par.schedule == "interleaved_1f1b":
        if par.num_micro_batches % par.pipeline_degree:
            problems.append(
                f"interleaved 1F1B needs micro-batches ({par.num_micro_batches}) divisible by "
                f"pp ({par.pipeline_degree})"
            )
        num_stages = par.pipeline_degree * par.virtual_stages_per_rank
        if plan.inputs.model.num_layers < num_stages:
            problems.append(
                f"interleaved 1F1B with {num_stages} stages needs at least as many layers "
                f"({plan.inputs.model.num_layers})"
            )
    elif par.virtual_stages_per_rank != 1 and par.schedule not in MULTI_STAGE_SCHEDULES:
        problems.append(
            f"virtual_stages_per_rank {par.virtual_stages_per_rank} needs schedule "
            f"interleaved_1f1b, not {par.schedule}"
        )


# ---- replicas and ranks -------------------------------------------------------------------


def _gpus_and_shares(replica: Replica) -> tuple[str, str, int, int, tuple[int, ...], int]:
    """What makes two stages' replicas the same GPUs with the same samples."""
    return (
        replica.gpu_type,
        replica.node,
        replica.tensor_parallel_degree,
        replica.context_parallel_degree,
        tuple(replica.ranks),
        replica.micro_batch_size,
    )


def _cp_nodes(
    replica: Replica, entry_of: dict[int, RankEntry], cluster_nodes: dict[str, Node]
) -> list[tuple[str, str]]:
    """(node, GPU type) of each cp index of ``replica``: its node for all, except where its cp
    group spans nodes (uneven chunks across GPU types, ``context_tokens``): cp index c > 0 is
    on its first rank's node (rank_map), a GPU type of the cluster's; each tp group stays on
    one node."""
    tp, cp = replica.tensor_parallel_degree, replica.context_parallel_degree
    nodes = [(replica.node, replica.gpu_type)] * cp
    if replica.context_tokens is None:
        return nodes
    for c in range(1, min(cp, len(replica.ranks) // tp)):
        found = entry_of.get(replica.ranks[c * tp])
        if found is not None:
            node = cluster_nodes.get(found.node)
            nodes[c] = (found.node, found.gpu_type if node is None else node.gpu)
    return nodes


def _check_replicas(plan: Plan, problems: list[str]) -> None:
    world = len(plan.rank_map)
    ranks = [entry.rank for entry in plan.rank_map]
    missing = sorted(set(range(world)) - set(ranks))
    extra = sorted({r for r in ranks if r >= world})
    repeated = sorted(r for r, count in Counter(ranks).items() if count > 1)
    if missing or extra or repeated:
        problems.append(
            f"rank_map must hold ranks 0..{world - 1} once each ({world} entries); "
            f"missing {missing[:8]}, out of range {extra[:8]}, repeated {repeated[:8]}"
        )
    entry_of: dict[int, RankEntry] = {}
    for entry in plan.rank_map:
        entry_of.setdefault(entry.rank, entry)
    cluster_nodes = {node.name: node for node in plan.inputs.cluster.nodes()}

    for stage in plan.stages:
        for d, replica in enumerate(stage.replicas):
            if replica.offload and replica.recompute == "selective":
                # The runtime's offload works through saved-tensor hooks, which selective
                # checkpointing bypasses for the tensors it keeps.
                problems.append(
                    f"stage {stage.index} replica {d}: offload pairs with recompute none or "
                    "full, not selective"
                )
    owner: dict[int, str] = {}
    for p, stages in sorted(_stages_by_rank(plan).items()):
        if not stages:
            problems.append(f"pipeline rank {p} runs no stage")
            continue
        first = stages[0]
        for other in stages[1:]:
            if [_gpus_and_shares(r) for r in other.replicas] != [
                _gpus_and_shares(r) for r in first.replicas
            ]:
                problems.append(
                    f"stages {first.index} and {other.index} of pipeline rank {p} have "
                    "different replicas; the stages of one rank run on the same GPUs with "
                    "the same shares"
                )
        for d, replica in enumerate(first.replicas):
            name = f"replica {d} of pipeline rank {p}"
            tp, cp = replica.tensor_parallel_degree, replica.context_parallel_degree
            if len(replica.ranks) != tp * cp:
                degree = f"tp × cp is {tp} × {cp}" if cp > 1 else f"tp is {tp}"
                problems.append(f"{name} lists {len(replica.ranks)} ranks; its {degree}")
            cp_nodes = _cp_nodes(replica, entry_of, cluster_nodes)
            node = cluster_nodes.get(replica.node)
            if node is None:
                problems.append(f"{name} is on node '{replica.node}', not in the cluster")
            elif node.gpu != replica.gpu_type:
                problems.append(
                    f"{name} says GPU type {replica.gpu_type}; node {node.name} has {node.gpu}"
                )
            for position, rank in enumerate(replica.ranks):
                c, t = divmod(position, tp)
                if rank in owner:
                    problems.append(f"rank {rank} belongs to {owner[rank]} and to {name}")
                    continue
                owner[rank] = name
                found = entry_of.get(rank)
                if found is None:
                    problems.append(f"{name} lists rank {rank}, which rank_map lacks")
                    continue
                says = (found.pipeline_rank, found.dp_index, found.tp_index, found.node)
                should_node, should_type = cp_nodes[c] if c < len(cp_nodes) else cp_nodes[0]
                should = (p, d, t, should_node)
                if says != should or found.gpu_type != should_type or found.cp_index != c:
                    # The cp index is named only where cp is in play.
                    said = f"cp {found.cp_index}, " if cp > 1 or found.cp_index else ""
                    due = f"cp {c}, " if cp > 1 or found.cp_index else ""
                    where = f"rank {position}" if cp > 1 else f"tp index {t}"
                    problems.append(
                        f"rank {rank} says (pipeline {found.pipeline_rank}, dp {found.dp_index}, "
                        f"{said}tp {found.tp_index}, {found.node}, {found.gpu_type}); as {where} "
                        f"of {name} it is (pipeline {p}, dp {d}, {due}tp {t}, {should_node}, "
                        f"{should_type})"
                    )
    for entry in plan.rank_map:
        if entry.rank not in owner:
            problems.append(
                f"rank {entry.rank} (pipeline {entry.pipeline_rank}, dp {entry.dp_index}, "
                f"tp {entry.tp_index}) belongs to no replica of its pipeline rank's stages"
            )


# ---- nodes --------------------------------------------------------------------------------


def _check_nodes(plan: Plan, problems: list[str]) -> None:
    cluster_nodes: dict[str, Node] = {node.name: node for node in plan.inputs.cluster.nodes()}
    used_slots: dict[tuple[str, int], int] = {}
    for entry in plan.rank_map:
        node = cluster_nodes.get(entry.node)
        if node is None:
            problems.append(f"rank {entry.rank} is on node '{entry.node}', not in the cluster")
            continue
        if entry.gpu_type != node.gpu:
            problems.append(
                f"rank {entry.rank} says GPU type {entry.gpu_type}; node {node.name} has {node.gpu}"
            )
        if entry.local_rank >= node.gpus:
            problems.append(
                f"rank {entry.rank} has local rank {entry.local_rank}; node {node.name} has "
                f"{node.gpus} GPUs"
            )
        slot = (entry.node, entry.local_rank)
        if slot in used_slots:
            problems.append(
                f"ranks {used_slots[slot]} and {entry.rank} share GPU {entry.local_rank} of "
                f"node {entry.node}"
            )
        else:
            used_slots[slot] = entry.rank

    # Launch order: torchrun gives node k the ranks right after those of nodes 0..k-1, with
    # local ranks counting up from 0 in rank order.
    ranks_on: dict[str, list[int]] = defaultdict(list)
    entry_of = {entry.rank: entry for entry in plan.rank_map}
    for entry in sorted(plan.rank_map, key=lambda e: e.rank):
        ranks_on[entry.node].append(entry.rank)
    plan_node_names = [node.name for node in plan.nodes]
    if len(set(plan_node_names)) != len(plan_node_names):
        problems.append(f"plan nodes repeat a name: {plan_node_names}")
    unfound = sorted(set(ranks_on) - set(plan_node_names))
    if unfound:
        problems.append(f"ranks run on nodes {unfound} that the plan's node list omits")
    first_rank = 0
    for position, plan_node in enumerate(plan.nodes):
        if plan_node.node_rank != position:
            problems.append(
                f"node {plan_node.name} is launch position {position} but has node_rank "
                f"{plan_node.node_rank}"
            )
        cluster_node = cluster_nodes.get(plan_node.name)
        if cluster_node is None:
            problems.append(f"plan node '{plan_node.name}' is not in the cluster")
        elif plan_node.gpu_type != cluster_node.gpu:
            problems.append(
                f"plan node {plan_node.name} says GPU type {plan_node.gpu_type}; the cluster "
                f"has {cluster_node.gpu}"
            )
        ranks = ranks_on.get(plan_node.name, [])
        if plan_node.nproc_per_node != len(ranks):
            problems.append(
                f"node {plan_node.name} has nproc_per_node {plan_node.nproc_per_node} but "
                f"{len(ranks)} ranks"
            )
        expected = list(range(first_rank, first_rank + len(ranks)))
        if ranks != expected:
            shown = f"{ranks[:4]}..." if len(ranks) > 4 else str(ranks)
            problems.append(
                f"node {plan_node.name} (launch position {position}) holds ranks {shown}; "
                f"torchrun gives it {first_rank}..{first_rank + len(ranks) - 1}"
            )
        for local, rank in enumerate(ranks):
            entry = entry_of[rank]
            if entry.local_rank != local or entry.node_rank != plan_node.node_rank:
                problems.append(
                    f"rank {rank} says node_rank {entry.node_rank}, local rank "
                    f"{entry.local_rank}; torchrun gives it {plan_node.node_rank}, {local}"
                )
                break
        first_rank += len(ranks)


# ---- profile ------------------------------------------------------------------------------


def _check_against_profile(plan: Plan, profile: Profile, problems: list[str]) -> None:
    if profile.model.name != plan.inputs.model.name:
        problems.append(
            f"plan is for model '{plan.inputs.model.name}'; profile is of '{profile.model.name}'"
        )
    if profile.seq_len != plan.inputs.seq_len:
        problems.append(f"plan seq_len {plan.inputs.seq_len} != profile seq_len {profile.seq_len}")
    splittable = any(layer.tensor_parallel is not None for layer in profile.layers)
    for stage in plan.stages:
        tps = sorted({r.tensor_parallel_degree for r in stage.replicas} - {1})
        if tps and not splittable:
            # Without the split every tp rank would run its layers whole: not tensor parallelism.
            problems.append(
                f"stage {stage.index} runs tp {tps[0]} but the profile has no tensor-parallel "
                "split (profile a factory model with --tp-divisor)"
            )
            continue
        for tp in sorted({r.tensor_parallel_degree for r in stage.replicas} - {1}):
            failing = [
                (layer.index, layer.name, layer.tensor_parallel.degree_must_divide)
                for layer in profile.layers[stage.layer_start : stage.layer_end]
                if layer.tensor_parallel is not None
                and layer.tensor_parallel.degree_must_divide % tp
            ]
            if failing:
                index, name, degree = failing[0]
                more = f" (and {len(failing) - 1} more layers)" if len(failing) > 1 else ""
                problems.append(
                    f"tp {tp} of stage {stage.index} does not divide layer {index} ({name})'s "
                    f"{degree}{more}"
                )


# ---- memory -------------------------------------------------------------------------------


def _estimate_kind(estimate: MemoryEstimate) -> _Kind:
    return (
        estimate.pipeline_rank,
        estimate.gpu_type,
        estimate.tensor_parallel_degree,
        estimate.micro_batch_size,
    )


def _replica_kinds(plan: Plan) -> list[_Kind]:
    """Every (pipeline rank, GPU type, tp, share) some replica has, in rank order (each GPU
    type of a cp group that spans types)."""
    entry_of = {entry.rank: entry for entry in plan.rank_map}
    cluster_nodes = {node.name: node for node in plan.inputs.cluster.nodes()}
    kinds: list[_Kind] = []
    for p, replicas in sorted(_replicas_of_rank(plan).items()):
        for replica in replicas:
            for _, gpu_type in _cp_nodes(replica, entry_of, cluster_nodes):
                tp = replica.tensor_parallel_degree
                kind = (p, gpu_type, tp, replica.micro_batch_size)
                if kind not in kinds:
                    kinds.append(kind)
    return kinds


def _memory_floor_bytes(plan: Plan, profile: Profile, kind: _Kind) -> int:
    """The independent lower bound on one GPU of this replica kind (module docstring)."""
    pipeline_rank, gpu_type, tp, share = kind
    moment_bytes = _ADAM_MOMENT_BYTES.get(profile.dtype, _ADAM_MOMENT_BYTES_DEFAULT)
    total = 0.0
    for stage in plan.stages:
        if stage.pipeline_rank != pipeline_rank:
            continue
        layers = profile.layers[stage.layer_start : stage.layer_end]
        params: float = sum(layer.param_count for layer in layers)
        # Expert parallelism leaves each GPU 1/ep of the routed experts, or, placed by
        # speed, its replica's (the fewest of the kind's replicas in this stage).
        ep = stage.expert_parallel_degree
        experts = sum(layer.experts.expert_param_count for layer in layers if layer.experts)
        kept = 1 / ep
        counts = [layer.experts.num_experts for layer in layers if layer.experts]
        held = [
            r.routed_experts
            for r in stage.replicas
            if (r.gpu_type, r.tensor_parallel_degree, r.micro_batch_size) == (gpu_type, tp, share)
            and r.routed_experts is not None
        ]
        if held and counts:
            kept = min(held) / max(counts)
        params -= experts * (1 - kept)
        per_gpu = params / tp
        optimizer = 2 * moment_bytes * per_gpu
        # cp ranks shard ZeRO's states as replicas do.
        n = sum(replica.context_parallel_degree for replica in stage.replicas)
        weights = grads = per_gpu * profile.dtype_bytes
        if stage.zero1 and n > 1:
            # With ep, ZeRO-1 shards over the replicas of one expert index.
            optimizer /= max(1, n // ep)
        if stage.zero_stage >= 2 and n > 1:
            # FSDP2 keeps shards of weights and gradients as model states (ZeRO-2's gathered
            # parameters during the step are a transient).
            grads /= n
            weights /= n
        total += weights + grads + optimizer
    return int(total)


def _check_estimate(
    estimate: MemoryEstimate, specs: dict[str, GpuSpec], problems: list[str], fit: bool
) -> None:
    what = _kind_text(_estimate_kind(estimate))
    parts = (
        estimate.weights_bytes
        + estimate.gradients_bytes
        + estimate.optimizer_bytes
        + estimate.activations_bytes
        + estimate.transient_bytes
    )
    if parts != estimate.total_bytes:
        problems.append(
            f"memory of {what}: parts add up to {parts} bytes, total says {estimate.total_bytes}"
        )
    needed = estimate.total_bytes + estimate.reserved_bytes
    if fit and needed > estimate.capacity_bytes:
        reserve = (
            f" (of which {estimate.reserved_bytes / GIB:.2f} GiB reserved)"
            if estimate.reserved_bytes
            else ""
        )
        problems.append(
            f"{what} need {needed / GIB:.2f} GiB per GPU{reserve}; a {estimate.gpu_type} has "
            f"{estimate.capacity_bytes / GIB:.2f} GiB"
        )
    spec = specs.get(estimate.gpu_type)
    if spec is None:
        problems.append(f"memory estimate names unknown GPU type {estimate.gpu_type}")
    elif estimate.capacity_bytes != spec.memory_bytes:
        problems.append(
            f"memory estimate of {what} says a {estimate.gpu_type} holds "
            f"{estimate.capacity_bytes} bytes; its spec says {spec.memory_bytes}"
        )


def _check_memory(plan: Plan, profile: Profile | None, problems: list[str], fit: bool) -> None:
    specs = gpu_specs(plan.inputs.cluster)
    kinds = _replica_kinds(plan)
    estimates: dict[_Kind, list[MemoryEstimate]] = defaultdict(list)
    for estimate in plan.prediction.memory:
        estimates[_estimate_kind(estimate)].append(estimate)
        _check_estimate(estimate, specs, problems, fit)
    for kind in kinds:
        if kind not in estimates:
            problems.append(f"no memory estimate for {_kind_text(kind)}")
    for kind in sorted(set(estimates) - set(kinds)):
        problems.append(f"a memory estimate is for {_kind_text(kind)}; the plan has none")
    if profile is None:
        return
    for kind in kinds:
        floor = _memory_floor_bytes(plan, profile, kind)
        spec = specs.get(kind[1])
        if fit and spec is not None:
            usable = spec.memory_bytes - int(spec.memory_reserve_gib * GIB)
            if floor > usable:
                reserve = (
                    f" less its {spec.memory_reserve_gib:g} GiB reserve"
                    if spec.memory_reserve_gib
                    else ""
                )
                problems.append(
                    f"{_kind_text(kind)} need at least {floor / GIB:.2f} GiB per GPU for "
                    f"weights, gradients and Adam states alone; a {spec.name} has "
                    f"{usable / GIB:.2f} GiB{reserve}"
                )
        for estimate in estimates.get(kind, []):
            states = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
            if states < floor * (1 - _RELATIVE_TOLERANCE):
                problems.append(
                    f"the estimate of weights+gradients+optimizer of {_kind_text(kind)} "
                    f"({states / GIB:.3f} GiB) is below the independent floor "
                    f"({floor / GIB:.3f} GiB)"
                )


# ---- prediction ---------------------------------------------------------------------------


def _check_prediction(plan: Plan, problems: list[str]) -> None:
    prediction = plan.prediction
    seconds = prediction.iteration_time_ms / 1000
    if seconds <= 0:
        problems.append(f"iteration time {prediction.iteration_time_ms} ms is not positive")
        return
    rate = plan.inputs.global_batch_size / seconds
    if not _close(prediction.samples_per_s, rate):
        problems.append(
            f"samples_per_s {prediction.samples_per_s:.6g} != global batch "
            f"{plan.inputs.global_batch_size} / iteration time {seconds:.6g} s = {rate:.6g}"
        )
    tokens = prediction.samples_per_s * plan.inputs.seq_len
    if not _close(prediction.tokens_per_s, tokens):
        problems.append(
            f"tokens_per_s {prediction.tokens_per_s:.6g} != samples_per_s × seq_len = {tokens:.6g}"
        )
    parts = prediction.breakdown.model_dump()
    if not _close(sum(parts.values()), prediction.iteration_time_ms):
        problems.append(
            f"time breakdown adds up to {sum(parts.values()):.6g} ms; iteration time is "
            f"{prediction.iteration_time_ms:.6g} ms"
        )
    world = len(plan.rank_map)
    if prediction.model_flops_per_iteration > 0 and world > 0:
        tflops = prediction.model_flops_per_iteration / seconds / world / 1e12
        if not _close(prediction.tflops_per_gpu, tflops):
            problems.append(
                f"tflops_per_gpu {prediction.tflops_per_gpu:.6g} != model FLOPs / time / "
                f"{world} GPUs = {tflops:.6g}"
            )
    if prediction.mfu > 1:
        problems.append(f"MFU {prediction.mfu:.3f} exceeds 1")
    _check_stage_timings(plan, problems)
    _check_allreduce_figures(plan, problems)


def _check_stage_timings(plan: Plan, problems: list[str]) -> None:
    timings = plan.prediction.stage_timings
    timed = [timing.stage for timing in timings]
    if timed != list(range(len(plan.stages))):
        problems.append(f"stage timings are for stages {timed}; the plan has {len(plan.stages)}")
        return
    for stage, timing in zip(plan.stages, timings, strict=True):
        # W is part of the backward (I = backward - W): a larger W is a figure no run can have.
        figures: list[tuple[str, StageTiming | ReplicaTiming]] = [("", timing)]
        figures += [(f" replica {d}", r) for d, r in enumerate(timing.replicas)]
        for where, figure in figures:
            weight = figure.weight_gradient_ms
            if weight is not None and weight > figure.backward_ms * (1 + 1e-9):
                problems.append(
                    f"stage {stage.index}{where}'s weight-gradient time {weight:.6g} ms is more "
                    f"than its whole backward, {figure.backward_ms:.6g} ms"
                )
        if not timing.replicas:
            continue
        if len(timing.replicas) != len(stage.replicas):
            problems.append(
                f"stage {stage.index}'s timing has {len(timing.replicas)} replica figures; the "
                f"stage has {len(stage.replicas)} replicas"
            )
            continue
        slowest_forward = max(r.forward_ms for r in timing.replicas)
        slowest_backward = max(r.backward_ms for r in timing.replicas)
        if not (_close(timing.forward_ms, slowest_forward)) or not _close(
            timing.backward_ms, slowest_backward
        ):
            problems.append(
                f"stage {stage.index}'s timing says forward {timing.forward_ms:.6g} ms, backward "
                f"{timing.backward_ms:.6g} ms; its slowest replicas take "
                f"{slowest_forward:.6g} ms and {slowest_backward:.6g} ms"
            )


def _check_allreduce_figures(plan: Plan, problems: list[str]) -> None:
    prediction = plan.prediction
    per_rank = prediction.rank_dp_allreduce_ms
    pp = plan.parallelism.pipeline_degree
    if not per_rank:
        return
    if len(per_rank) != pp:
        problems.append(
            f"rank_dp_allreduce_ms has {len(per_rank)} figures; the plan has {pp} pipeline ranks"
        )
        return
    if not _close(prediction.dp_allreduce_ms, max(per_rank)):
        problems.append(
            f"dp_allreduce_ms {prediction.dp_allreduce_ms:.6g} is not the longest per-rank "
            f"all-reduce ({max(per_rank):.6g} ms)"
        )
    replicas = _replicas_of_rank(plan)
    for p, ms in enumerate(per_rank):
        if ms < 0:
            problems.append(f"pipeline rank {p}'s all-reduce time {ms} ms is negative")
        elif ms > 0 and [r.context_parallel_degree for r in replicas.get(p, [])] == [1]:
            # (A replica's cp ranks reduce gradients among themselves.)
            problems.append(
                f"pipeline rank {p} has one replica, yet its gradient all-reduce takes {ms:.6g} ms"
            )


def _check_idle_gpus(plan: Plan, problems: list[str]) -> None:
    in_cluster: Counter[str] = Counter()
    for node in plan.inputs.cluster.nodes():
        in_cluster[node.gpu] += node.gpus
    used = Counter(entry.gpu_type for entry in plan.rank_map)
    stated: Counter[str] = Counter()
    for idle in plan.prediction.idle_gpus:
        stated[idle.gpu_type] += idle.count
        if not idle.reason.strip():
            problems.append(f"idle_gpus gives no reason for its {idle.count} {idle.gpu_type}")
    for gpu_type in sorted(set(in_cluster) | set(used) | set(stated)):
        unused = in_cluster[gpu_type] - used[gpu_type]
        if unused != stated[gpu_type]:
            problems.append(
                f"the cluster has {in_cluster[gpu_type]} {gpu_type} GPUs and the plan uses "
                f"{used[gpu_type]}, so {unused} are idle; idle_gpus says {stated[gpu_type]}"
            )
