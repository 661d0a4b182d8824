"""The plan of cp groups across two GPU types: the whole model, one stage, its split searched.

``span_plan`` places n1 cp ranks of class k1 (tp GPUs each) on one node of that class and n2 of
class k2 on one node of it, launched in that order so that the group's ranks are consecutive
(one (pp, dp, cp, tp) mesh: the mesh executor runs it), takes the token split of
``autoplan.solve.context_span.best_split`` (every split, every recompute mode, each member's
memory) and writes the plan with its prediction: m micro-batches of 1F1B on one stage (no
bubble, no transfers), the gradient all-reduce over the cp ranks on the link joining the two
nodes (the tp rings share it), of which the mesh executor's DDP hides what the last backward
covers, and the slower member's optimizer step. The time breakdown puts the ring's exposed
time, like tp's collectives, in tp_comm_ms.

With ``replicas`` k > 1 the plan is k such groups as data-parallel replicas, group d on the
d-th node of each class (disjoint node pairs, launched pair by pair: one (1, k, cp, tp) mesh),
each taking B / k samples, the gradient all-reduce over the k × cp ranks.

``span_times`` is that prediction's iteration time of a priced split, the figure the split is
chosen by (every split and mode tried): the search's spanning family
(``autoplan.solve.context_span_family``) ranks its groups by it and ``autoplan solve`` writes
the winner with ``span_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.schema import Node
from autoplan.cost.comm import ring_allreduce_ms
from autoplan.cost.context_span import span_layer_costs
from autoplan.cost.model import CostModel
from autoplan.errors import InfeasibleError
from autoplan.plan.schema import (
    IdleGpus,
    MemoryEstimate,
    Parallelism,
    Plan,
    PlanInputs,
    PlanNode,
    Prediction,
    RankEntry,
    Replica,
    ReplicaTiming,
    Stage,
    StageTiming,
    TimeBreakdown,
)
from autoplan.solve.context_span import MODES, SpanSplit, best_split
from autoplan.solve.emit import model_flops_per_iteration, with_fingerprint

__all__ = ["SpanTimes", "span_plan", "span_times"]


@dataclass(frozen=True)
class SpanTimes:
    """A spanning plan's iteration (ms) and its parts beside m micro-batches of work."""

    iteration_ms: float
    allreduce_ms: float  # the gradient all-reduce over the cp ranks
    exposed_ms: float  # what of it the last backward does not hide
    step_ms: float  # the slower member's optimizer step


def span_times(
    model: CostModel, found: SpanSplit, num_micro_batches: int, replicas: int = 1
) -> SpanTimes:
    """The iteration of m = ``num_micro_batches`` micro-batches of ``found`` on one stage
    (module docstring): m × its work, the exposed all-reduce over the ``replicas`` groups' cp
    ranks and the slower member's step."""
    span = found.span
    names = {n for member in span.members for n in model.classes[member.device_class].groups}
    bandwidth = model.cluster.inter_node_bandwidth(names) / span.tp
    allreduce = ring_allreduce_ms(
        found.params_per_gpu * model.dtype_bytes,
        span.cp * replicas,
        bandwidth,
        model.cluster.inter_node_latency(names),
    )
    exposed = max(0.0, allreduce - found.backward_ms)  # DDP overlaps the last backward
    step = max(
        model.optimizer_ms(found.params_per_gpu, member.device_class, 1, 0)
        + model.step_overhead_ms(member.device_class)
        for member in span.members
    )
    iteration = num_micro_batches * found.work_ms + exposed + step
    return SpanTimes(iteration, allreduce, exposed, step)


def _nodes_of(model: CostModel, device_class: int, gpus: int, count: int) -> list[Node]:
    """The first ``count`` nodes of ``device_class`` with ``gpus`` GPUs (a member's ranks
    share one; each group its own)."""
    groups = set(model.classes[device_class].groups)
    found = [n for n in model.cluster.nodes() if n.group in groups and n.gpus >= gpus][:count]
    if len(found) < count:
        name = model.classes[device_class].gpu.name
        if count == 1:
            raise InfeasibleError(f"no {name} node holds {gpus} GPUs of one cp group's ranks")
        raise InfeasibleError(
            f"fewer than {count} {name} nodes hold {gpus} GPUs of one cp group's ranks each"
        )
    return found


def span_plan(
    model: CostModel,
    inputs: PlanInputs,
    kinds: tuple[tuple[int, int], tuple[int, int]],
    tp: int,
    num_micro_batches: int,
    modes: tuple[str, ...] = MODES,
    sequence_parallel: bool = False,
    found: SpanSplit | None = None,
    replicas: int = 1,
) -> Plan:
    """The plan of one cp group of ``kinds`` ((device class, cp ranks) in ring order, tp GPUs
    a rank) running the whole model on micro-batches of global batch / ``num_micro_batches``
    samples at the split and recompute mode (of ``modes``) of least ``span_times``, with
    sequence parallelism in the tp groups or not (module docstring); InfeasibleError where no
    split fits or the nodes cannot hold it. ``found``: the split already chosen (by the
    search's spanning family, at these micro-batches), taken as it is. ``replicas``: that
    many such groups as data-parallel replicas (module docstring)."""
    batch = inputs.global_batch_size
    if batch % (num_micro_batches * replicas):
        raise InfeasibleError(
            f"{num_micro_batches} micro-batches of {replicas} replica(s) do not divide the "
            f"global batch {batch}"
        )
    micro = batch // (num_micro_batches * replicas)
    layers = (0, len(model.profile.layers))
    # 1F1B on one stage: one micro-batch in flight.
    if found is None:
        found = best_split(
            model,
            kinds,
            tp,
            micro,
            layers,
            1,
            modes,
            sequence_parallel,
            objective=lambda split: (
                span_times(model, split, num_micro_batches, replicas).iteration_ms
            ),
        )
    if found is None:
        raise InfeasibleError(
            "no token split of the cp group fits: every member's weights, optimizer states "
            "and saved activations at every recompute mode exceed its GPU"
        )
    per_class = [_nodes_of(model, k, n * tp, replicas) for k, n in kinds]
    nodes = [node for pair in zip(*per_class, strict=True) for node in pair]  # pair by pair
    if len({n.name for n in nodes}) < len(nodes):
        raise InfeasibleError("a cp group across GPU types needs two nodes")
    entries: list[RankEntry] = []
    group_ranks: list[list[int]] = []
    for d in range(replicas):
        group_ranks.append([])
        for member, ((_, ranks), node) in enumerate(
            zip(kinds, nodes[2 * d : 2 * d + 2], strict=True)
        ):
            for local in range(ranks * tp):
                cp_index = sum(n for _, n in kinds[:member]) + local // tp
                group_ranks[d].append(len(entries))
                entries.append(
                    RankEntry(
                        rank=len(entries),
                        node=node.name,
                        node_rank=2 * d + member,
                        local_rank=local,
                        gpu_type=node.gpu,
                        pipeline_rank=0,
                        dp_index=d,
                        tp_index=local % tp,
                        cp_index=cp_index,
                    )
                )
    stage_replicas = [
        Replica(
            gpu_type=nodes[2 * d].gpu,
            node=nodes[2 * d].name,
            tensor_parallel_degree=tp,
            context_parallel_degree=found.span.cp,
            ranks=group_ranks[d],
            micro_batch_size=micro,
            recompute=found.recompute,  # type: ignore[arg-type]
            context_tokens=list(found.span.rank_tokens()),
        )
        for d in range(replicas)
    ]
    return with_fingerprint(
        Plan(
            inputs=inputs,
            parallelism=Parallelism(
                pipeline_degree=1,
                schedule="1f1b",
                num_micro_batches=num_micro_batches,
                micro_batch_size=micro * replicas,
                sequence_parallel=sequence_parallel,
                executor="mesh",
            ),
            stages=[
                Stage(
                    index=0,
                    pipeline_rank=0,
                    layer_start=0,
                    layer_end=layers[1],
                    replicas=stage_replicas,
                )
            ],
            nodes=[
                PlanNode(
                    node_rank=i, name=n.name, gpu_type=n.gpu, nproc_per_node=kinds[i % 2][1] * tp
                )
                for i, n in enumerate(nodes)
            ],
            rank_map=entries,
            prediction=_prediction(
                model, found, micro, num_micro_batches, inputs, sequence_parallel, replicas
            ),
        )
    )


def _prediction(
    model: CostModel,
    found: SpanSplit,
    micro: int,
    m: int,
    inputs: PlanInputs,
    sequence_parallel: bool,
    replicas: int,
) -> Prediction:
    """The plan's figures (module docstring)."""
    span, mode = found.span, found.recompute
    costs = span_layer_costs(model, span, micro, sequence_parallel)
    # Per layer, the slowest member's collectives (its tp all-reduces and exposed ring).
    tp_ms = 0.0
    for per_member in zip(*costs, strict=True):
        slowest = max(per_member, key=lambda c: c.forward_ms() + c.backward_ms(mode))
        tp_ms += slowest.forward_tp_comm_ms + slowest.backward_tp_comm_ms
    params = found.params_per_gpu
    times = span_times(model, found, m, replicas)
    allreduce, exposed, step = times.allreduce_ms, times.exposed_ms, times.step_ms
    work = m * found.work_ms
    iteration = times.iteration_ms
    seconds = iteration / 1e3
    flops = model_flops_per_iteration(model, inputs.global_batch_size)
    world = replicas * span.cp * span.tp
    peak = sum(
        model.peak_tflops_of(model.classes[member.device_class].gpu.name)
        * member.ranks
        * span.tp
        * replicas
        for member in span.members
    )
    memory = []
    for member, per_member, peak_bytes in zip(span.members, costs, found.peak_bytes, strict=True):
        k = member.device_class
        weights, grads, optimizer = model.static_bytes(params, span.cp * replicas, 0)
        saved = sum(c.saved_bytes[mode] for c in per_member)
        parts = {
            "weights_bytes": round(weights),
            "gradients_bytes": round(grads),
            "optimizer_bytes": round(optimizer),
            "activations_bytes": round(saved),
            "transient_bytes": round(peak_bytes - weights - grads - optimizer - saved),
        }
        memory.append(
            MemoryEstimate(
                pipeline_rank=0,
                gpu_type=model.classes[k].gpu.name,
                tensor_parallel_degree=span.tp,
                micro_batch_size=micro,
                total_bytes=sum(parts.values()),
                reserved_bytes=model.reserved_bytes(k),
                capacity_bytes=model.capacity_bytes(k),
                **parts,
            )
        )
    used: dict[str, int] = {}
    for member in span.members:
        name = model.classes[member.device_class].gpu.name
        used[name] = used.get(name, 0) + member.ranks * span.tp * replicas
    present: dict[str, int] = {}
    for node in model.cluster.nodes():
        present[node.gpu] = present.get(node.gpu, 0) + node.gpus
    idle = [
        IdleGpus(
            gpu_type=name,
            count=total - used.get(name, 0),
            reason="outside the cp groups this plan is of (autoplan.solve.context_span_plan)",
        )
        for name, total in present.items()
        if total > used.get(name, 0)
    ]
    saved_most = max(sum(c.saved_bytes[mode] for c in per_member) for per_member in costs)
    timing = ReplicaTiming(
        forward_ms=found.forward_ms,
        backward_ms=found.backward_ms,
        saved_activation_bytes=round(saved_most),
    )
    return Prediction(
        iteration_time_ms=iteration,
        breakdown=TimeBreakdown(
            compute_ms=work - m * tp_ms,
            bubble_ms=0.0,
            tp_comm_ms=m * tp_ms,
            pp_comm_ms=0.0,
            dp_comm_ms=exposed,
            optimizer_ms=step,
        ),
        samples_per_s=inputs.global_batch_size / seconds,
        tokens_per_s=inputs.global_batch_size * inputs.seq_len / seconds,
        model_flops_per_iteration=flops,
        tflops_per_gpu=flops / seconds / world / 1e12,
        mfu=flops / seconds / (peak * 1e12) if peak else 0.0,
        stage_timings=[
            StageTiming(
                stage=0,
                forward_ms=found.forward_ms,
                backward_ms=found.backward_ms,
                send_ms=0.0,
                saved_activation_bytes=round(saved_most),
                replicas=[timing] * replicas,
            )
        ],
        dp_allreduce_ms=allreduce,
        rank_dp_allreduce_ms=[allreduce],
        memory=memory,
        idle_gpus=idle,
    )
