"""An independent check of a plan: the rules every executable plan obeys.

The solver re-checks its own answer with its own code; this module checks plans again from
their definition only (the rank convention of ``autoplan.plan.schema``, the cluster file and,
when given, the profile), so that a bug in the cost model or the search cannot hide itself.
It must therefore never import ``autoplan.cost`` or ``autoplan.solve``.

Every rule is checked and every violation is reported at once, in one PlanInvalidError.
Plans made with ``model_copy(update=...)`` skip pydantic's own checks, so nothing here assumes
that the schema validators ran.

The independent memory bound: a GPU of pipeline rank p holds at least its stages' parameters
split ``tp`` ways, once as weights and once as gradients (in the training dtype), and Adam's
two moments per parameter in fp32 (fp64 when training in fp64), further split ``dp`` ways
under ZeRO-1. Mixed-precision Adam keeps more (fp32 master weights, 16-18 bytes per
parameter), so this is a floor: a plan's estimate below it has forgotten something, and a
floor above the GPU's memory means the plan cannot run.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import Node
from autoplan.errors import PlanInvalidError
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile

__all__ = ["plan_problems", "validate_plan"]

# Relative tolerance when comparing figures the plan states twice (rates, sums of parts).
_RELATIVE_TOLERANCE = 0.01
# Bytes per element of one Adam moment, by training dtype (fp32 states unless fp64).
_ADAM_MOMENT_BYTES = {"fp64": 8}
_ADAM_MOMENT_BYTES_DEFAULT = 4
_GIB = 1024**3


def validate_plan(plan: Plan, profile: Profile | None = None) -> None:
    """Raise PlanInvalidError listing every rule ``plan`` breaks; return None if it breaks none.

    With ``profile`` (the one the plan was solved on), also check the layer count,
    tensor-parallel divisibility and the independent memory floor.
    """
    problems = plan_problems(plan, profile)
    if problems:
        raise PlanInvalidError(problems)


def plan_problems(plan: Plan, profile: Profile | None = None) -> list[str]:
    """Every rule ``plan`` breaks, as one message each (empty when valid)."""
    problems: list[str] = []
    _check_layers_and_stages(plan, profile, problems)
    _check_rank_convention(plan, problems)
    _check_nodes(plan, problems)
    _check_batch_and_schedule(plan, problems)
    if profile is not None:
        _check_against_profile(plan, profile, problems)
    _check_memory(plan, profile, problems)
    _check_prediction(plan, problems)
    return problems


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_RELATIVE_TOLERANCE, abs_tol=1e-9)


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
        if stage.pipeline_rank != position % par.pipeline_degree:
            problems.append(
                f"stage {position} runs on pipeline rank {stage.pipeline_rank}; "
                f"it must be {position} % pp = {position % par.pipeline_degree}"
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


def _check_rank_convention(plan: Plan, problems: list[str]) -> None:
    par = plan.parallelism
    pp, dp, tp = par.pipeline_degree, par.data_parallel_degree, par.tensor_parallel_degree
    world = pp * dp * tp
    ranks = [entry.rank for entry in plan.rank_map]
    missing = sorted(set(range(world)) - set(ranks))
    extra = sorted({r for r in ranks if r >= world})
    repeated = sorted(r for r, count in Counter(ranks).items() if count > 1)
    if missing or extra or repeated:
        problems.append(
            f"rank_map must hold ranks 0..{world - 1} once each (pp×dp×tp = {world}); "
            f"missing {missing[:8]}, out of range {extra[:8]}, repeated {repeated[:8]}"
        )
    for entry in plan.rank_map:
        expected = entry.pipeline_rank * dp * tp + entry.dp_index * tp + entry.tp_index
        in_range = entry.pipeline_rank < pp and entry.dp_index < dp and entry.tp_index < tp
        if not in_range or expected != entry.rank:
            problems.append(
                f"rank {entry.rank} says (pipeline {entry.pipeline_rank}, dp {entry.dp_index}, "
                f"tp {entry.tp_index}); the convention r = p·dp·tp + d·tp + t with "
                f"pp={pp} dp={dp} tp={tp} gives {expected}"
                + ("" if in_range else " and an index is out of range")
            )
    # A tp group all-reduces every layer: it must stay on one node's fast link.
    nodes_of_group: dict[tuple[int, int], set[str]] = defaultdict(set)
    for entry in plan.rank_map:
        nodes_of_group[(entry.pipeline_rank, entry.dp_index)].add(entry.node)
    for (pipeline_rank, dp_index), nodes in sorted(nodes_of_group.items()):
        if len(nodes) > 1:
            problems.append(
                f"tp group (pipeline {pipeline_rank}, dp {dp_index}) spans nodes {sorted(nodes)}; "
                "a tp group must be on one node"
            )
    # Stage GPU types must be those of the ranks that run it.
    types_of_pipeline_rank: dict[int, set[str]] = defaultdict(set)
    for entry in plan.rank_map:
        types_of_pipeline_rank[entry.pipeline_rank].add(entry.gpu_type)
    for stage in plan.stages:
        actual = types_of_pipeline_rank.get(stage.pipeline_rank, set())
        if set(stage.gpu_types) != actual:
            problems.append(
                f"stage {stage.index} says GPU types {sorted(stage.gpu_types)}; its pipeline "
                f"rank {stage.pipeline_rank} runs on {sorted(actual)}"
            )


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
    unlisted = sorted(set(ranks_on) - set(plan_node_names))
    if unlisted:
        problems.append(f"ranks run on nodes {unlisted} that the plan's node list omits")
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


def _check_batch_and_schedule(plan: Plan, problems: list[str]) -> None:
    par = plan.parallelism
    shares = par.replica_micro_batch_sizes
    if len(shares) != par.data_parallel_degree:
        problems.append(
            f"{len(shares)} replica micro-batch sizes for dp = {par.data_parallel_degree}"
        )
    if min(shares, default=0) < 1:
        problems.append(f"a replica micro-batch size is below 1: {shares}")
    samples = sum(shares) * par.num_micro_batches
    if samples != plan.inputs.global_batch_size:
        problems.append(
            f"global batch {plan.inputs.global_batch_size} != sum of replica micro-batch sizes "
            f"({sum(shares)}) × micro-batches ({par.num_micro_batches}) = {samples}"
        )
    if len(set(shares)) > 1 and par.pipeline_degree > 1:
        problems.append(f"uneven replica shares {shares} need pp = 1 (pp is {par.pipeline_degree})")
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
    elif par.virtual_stages_per_rank != 1:
        problems.append(
            f"virtual_stages_per_rank {par.virtual_stages_per_rank} needs schedule "
            f"interleaved_1f1b, not {par.schedule}"
        )


def _check_against_profile(plan: Plan, profile: Profile, problems: list[str]) -> None:
    if profile.model.name != plan.inputs.model.name:
        problems.append(
            f"plan is for model '{plan.inputs.model.name}'; profile is of '{profile.model.name}'"
        )
    if profile.seq_len != plan.inputs.seq_len:
        problems.append(f"plan seq_len {plan.inputs.seq_len} != profile seq_len {profile.seq_len}")
    tp = plan.parallelism.tensor_parallel_degree
    if tp == 1:
        return
    for layer in profile.layers:
        split = layer.tensor_parallel
        if split is not None and split.degree_must_divide % tp:
            problems.append(
                f"tp {tp} does not divide layer {layer.index} ({layer.name})'s "
                f"{split.degree_must_divide}"
            )


def _memory_floor_bytes(plan: Plan, profile: Profile, pipeline_rank: int) -> int:
    """The independent lower bound on one GPU's memory (module docstring)."""
    par = plan.parallelism
    params = sum(
        layer.param_count
        for stage in plan.stages
        if stage.pipeline_rank == pipeline_rank
        for layer in profile.layers[stage.layer_start : stage.layer_end]
    )
    params_per_gpu = params / par.tensor_parallel_degree
    weights_and_grads = 2 * params_per_gpu * profile.dtype_bytes
    moment_bytes = _ADAM_MOMENT_BYTES.get(profile.dtype, _ADAM_MOMENT_BYTES_DEFAULT)
    optimizer = 2 * moment_bytes * params_per_gpu
    if par.zero1:
        optimizer /= par.data_parallel_degree
    return int(weights_and_grads + optimizer)


def _check_memory(plan: Plan, profile: Profile | None, problems: list[str]) -> None:
    par = plan.parallelism
    specs = gpu_specs(plan.inputs.cluster)
    types_of: dict[int, set[str]] = defaultdict(set)
    for entry in plan.rank_map:
        types_of[entry.pipeline_rank].add(entry.gpu_type)
    estimated = {estimate.pipeline_rank for estimate in plan.prediction.memory}
    missing = sorted(set(range(par.pipeline_degree)) - estimated)
    if missing:
        problems.append(f"no memory estimate for pipeline ranks {missing}")
    for estimate in plan.prediction.memory:
        p = estimate.pipeline_rank
        parts = (
            estimate.weights_bytes
            + estimate.gradients_bytes
            + estimate.optimizer_bytes
            + estimate.activations_bytes
            + estimate.transient_bytes
        )
        if parts != estimate.total_bytes:
            problems.append(
                f"memory of pipeline rank {p}: parts add up to {parts} bytes, total says "
                f"{estimate.total_bytes}"
            )
        if estimate.total_bytes > estimate.capacity_bytes:
            problems.append(
                f"pipeline rank {p} needs {estimate.total_bytes / _GIB:.2f} GiB per "
                f"{estimate.gpu_type}; it has {estimate.capacity_bytes / _GIB:.2f} GiB"
            )
        spec = specs.get(estimate.gpu_type)
        if spec is None:
            problems.append(f"memory estimate names unknown GPU type {estimate.gpu_type}")
        elif estimate.capacity_bytes != spec.memory_bytes:
            problems.append(
                f"memory estimate of pipeline rank {p} says {estimate.gpu_type} holds "
                f"{estimate.capacity_bytes} bytes; its spec says {spec.memory_bytes}"
            )
        if types_of.get(p) and estimate.gpu_type not in types_of[p]:
            problems.append(
                f"memory estimate of pipeline rank {p} is for {estimate.gpu_type}; the rank "
                f"runs on {sorted(types_of[p])}"
            )
    if profile is None:
        return
    stated = {estimate.pipeline_rank: estimate for estimate in plan.prediction.memory}
    for p in range(par.pipeline_degree):
        floor = _memory_floor_bytes(plan, profile, p)
        capacities = [specs[t].memory_bytes for t in types_of.get(p, ()) if t in specs]
        if capacities and floor > min(capacities):
            problems.append(
                f"pipeline rank {p} needs at least {floor / _GIB:.2f} GiB for weights, gradients "
                f"and Adam states alone; its smallest GPU has {min(capacities) / _GIB:.2f} GiB"
            )
        estimate = stated.get(p)
        if estimate is not None:
            states = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
            if states < floor * (1 - _RELATIVE_TOLERANCE):
                problems.append(
                    f"pipeline rank {p}'s estimate of weights+gradients+optimizer "
                    f"({states / _GIB:.3f} GiB) is below the independent floor "
                    f"({floor / _GIB:.3f} GiB)"
                )


def _check_prediction(plan: Plan, problems: list[str]) -> None:
    prediction = plan.prediction
    par = plan.parallelism
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
    world = par.pipeline_degree * par.data_parallel_degree * par.tensor_parallel_degree
    if prediction.model_flops_per_iteration > 0:
        tflops = prediction.model_flops_per_iteration / seconds / world / 1e12
        if not _close(prediction.tflops_per_gpu, tflops):
            problems.append(
                f"tflops_per_gpu {prediction.tflops_per_gpu:.6g} != model FLOPs / time / GPUs "
                f"= {tflops:.6g}"
            )
    if prediction.mfu > 1:
        problems.append(f"MFU {prediction.mfu:.3f} exceeds 1")
    timed = [timing.stage for timing in prediction.stage_timings]
    if timed != list(range(len(plan.stages))):
        problems.append(f"stage timings are for stages {timed}; the plan has {len(plan.stages)}")
