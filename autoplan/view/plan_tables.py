"""``autoplan show``: a plan's shape, stages and their replicas, memory, time breakdown, idle
GPUs and runners-up, as a Document (``autoplan.view.render`` lays it out)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from autoplan.cluster.catalog import precision_warnings
from autoplan.plan.fingerprint import edited_since_costed
from autoplan.plan.schema import Plan, Replica, Stage, StageTiming
from autoplan.plan.stage_spec import format_stage_specs, plan_stage_specs
from autoplan.view.document import Document, Figure, Section
from autoplan.view.memory_bars import memory_section
from autoplan.view.unit_names import stage_units_text
from autoplan.view.units import (
    count_text,
    counted,
    duration_text,
    node_ranges,
    percent_text,
    rate_text,
    runs_text,
)

__all__ = [
    "ALTERNATIVES_LEGEND",
    "ENGINE_NAMES",
    "LEGACY_LEGEND",
    "alternatives_section",
    "breakdown_section",
    "engine_text",
    "gpus_text",
    "idle_section",
    "micro_batch_text",
    "overview_section",
    "plan_document",
    "plan_precision_warnings",
    "replicas_text",
    "stages_section",
    "strategy_text",
]


ALTERNATIVES_LEGEND = (
    "pp pipeline ranks, m micro-batches, then the schedule (v: stages per rank; sp: sequence "
    "parallelism, cost --sp); each stage as "
    "autoplan cost --stages takes it: TYPE*replicas:Lfirst-last (inclusive layers):tpT (GPUs "
    "per replica):mbB (micro-batch per replica), (…) a type's own, full/selective recompute, "
    "offload (activations to host), zZ ZeRO level, sp the stage's own sequence parallelism; "
    "price one with autoplan cost --stages "
    "'…' --num-micro-batches M --schedule S."
)
LEGACY_LEGEND = (
    "Older plans: 'pp=2 m=8 mbs=16 1f1b | 0-12: A100:4x1(b4,f,o) z1' is mbs samples per "
    "micro-batch per stage (all replicas), layers [0, 12) (end excluded), 4 replicas x tp 1, "
    "b4 samples per replica, s/f selective/full recompute, o offload, z1 ZeRO level."
)
# The summary notation of plans written before the stage-spec one: 'mbs=16' and '0-12: '.
_LEGACY_SUMMARY = re.compile(r"\bmbs=\d+|\b\d+-\d+: ")


def strategy_text(strategy: str) -> str:
    """The plan's strategy in words: the search's own plans are not called "optimal" here;
    whether they are proven is the certificate's to say (``search``)."""
    return "autoplan's search" if strategy == "optimal" else strategy


ENGINE_NAMES = {"autoplan": "autoplan's runtime", "megatron-deepspeed": "Megatron-DeepSpeed"}


def engine_text(engine: str, executor: str | None = None) -> str:
    """The engine (and autoplan's executor) a plan is priced for, in words
    (``autoplan.cost.engines``)."""
    if engine == "autoplan" and executor == "groups":
        return "autoplan's runtime, groups executor (gradients summed after the last backward)"
    if engine == "autoplan":
        return "autoplan's runtime (DDP hides the gradient all-reduce behind the last backward)"
    return f"{ENGINE_NAMES.get(engine, engine)} (gradient all-reduce after the last backward)"


def _ms(milliseconds: float) -> Figure:
    return Figure(duration_text(milliseconds), milliseconds, "ms")


def replicas_text(stage: Stage, rank_types: dict[int, str] | None = None) -> str:
    """A stage's replicas by kind, in order of first appearance, with each replica's
    micro-batch size (samples per micro-batch of one replica, as Megatron-LM counts it), e.g.
    'A100-40GB tp1 × 4 (micro-batch 8 each) + V100-16GB tp4 × 1 (micro-batch 4)'; a
    context-parallel replica reads 'H100 tp2 cp4 × 1' (cp groups of tp GPUs, each a chunk of
    the sequence), with uneven chunks 'H100 tp1 cp2 (H100 640 + A100 384 tokens) × 1' (each
    cp rank's GPU type from ``rank_types``, global rank → GPU type, where given)."""
    kinds: Counter[tuple[str, int, int, str, int]] = Counter()
    for replica in stage.replicas:
        kind = (
            replica.gpu_type,
            replica.tensor_parallel_degree,
            replica.context_parallel_degree,
            _chunks_text(replica, rank_types or {}),
            replica.micro_batch_size,
        )
        kinds[kind] += 1
    parts = []
    for (gpu_type, tp, cp, chunks, share), count in kinds.items():
        each = " each" if count > 1 else ""
        ring = f" cp{cp}{chunks}" if cp > 1 else ""
        parts.append(f"{gpu_type} tp{tp}{ring} × {count} (micro-batch {share}{each})")
    return " + ".join(parts)


def _chunks_text(replica: Replica, rank_types: dict[int, str]) -> str:
    """' (H100 640 + 2 × A100 192 tokens)' for uneven chunks (runs of one GPU type and count
    merged), '' for equal ones."""
    if replica.context_tokens is None:
        return ""
    tp = replica.tensor_parallel_degree
    runs: list[list[Any]] = []
    for c, tokens in enumerate(replica.context_tokens):
        rank = replica.ranks[c * tp] if c * tp < len(replica.ranks) else -1
        # Unknown where the caller gives no rank map: the count alone.
        gpu_type = rank_types.get(rank, "")
        if runs and runs[-1][1:] == [gpu_type, tokens]:
            runs[-1][0] += 1
        else:
            runs.append([1, gpu_type, tokens])
    parts = [
        f"{f'{n} × ' if n > 1 else ''}{f'{gpu_type} ' if gpu_type else ''}{tokens}"
        for n, gpu_type, tokens in runs
    ]
    return f" ({' + '.join(parts)} tokens)"


def micro_batch_text(plan: Plan) -> str:
    """The micro-batch as the field says it: per replica first, the stage total named so:
    'micro-batch 2 per replica (8 per stage: 4 replicas)', or the shares where they differ."""
    par = plan.parallelism
    shares = sorted({r.micro_batch_size for s in plan.stages for r in s.replicas})
    replicas = sorted({s.data_parallel_degree for s in plan.stages})
    if len(shares) == 1:
        per = f"micro-batch {shares[0]} per replica"
        over = "/".join(map(str, replicas))
        total = f"{counted(par.micro_batch_size, 'sample')} per stage"
        return f"{per} ({total}: {over} {'replica' if replicas == [1] else 'replicas'})"
    return (
        f"micro-batch {'/'.join(map(str, shares))} per replica (uneven shares; "
        f"{counted(par.micro_batch_size, 'sample')} per stage)"
    )


def gpus_text(plan: Plan) -> str:
    """GPUs used of the cluster's, per type: '12 of 16 (A100-80GB 8 of 8, V100-32GB 4 of 8)'."""
    in_cluster: Counter[str] = Counter()
    for node in plan.inputs.cluster.nodes():
        in_cluster[node.gpu] += node.gpus
    used = Counter(entry.gpu_type for entry in plan.rank_map)
    per_type = ", ".join(f"{t} {used[t]} of {n}" for t, n in in_cluster.items())
    return f"{plan.world_size} of {sum(in_cluster.values())} ({per_type})"


def overview_section(plan: Plan) -> Section:
    """Key facts: model, cluster, pipeline, batch, predicted time and speed, idle GPUs."""
    par = plan.parallelism
    inputs = plan.inputs
    prediction = plan.prediction
    section = Section(title="Plan", columns=["what", "value"], key_value=True)
    model = inputs.model
    section.add(
        "model",
        f"{model.name}: {model.num_layers} layers, {count_text(model.parameter_count)} parameters"
        + (
            f" ({count_text(model.active_parameter_count)} active per token)"
            if model.active_parameter_count is not None
            else ""
        ),
    )
    section.add(
        "cluster",
        f"{inputs.cluster.name}: GPUs used {gpus_text(plan)} on {counted(len(plan.nodes), 'node')} "
        f"({node_ranges(node.name for node in plan.nodes)})",
    )
    section.add("strategy", strategy_text(inputs.strategy))
    section.add("priced for", engine_text(inputs.engine, plan.parallelism.executor))
    if plan.search is not None:  # the certificate: never "optimal" unless proven
        found = plan.search
        section.add(
            "search",
            f"{found.words()}; {found.explored:,} candidates explored",
        )
    elif inputs.strategy == "optimal":
        section.add("search", "no bound recorded (not solved by this autoplan's search)")
    virtual = (
        f" × {par.virtual_stages_per_rank} virtual stages"
        if par.virtual_stages_per_rank > 1
        else ""
    )
    levels = sorted({stage.zero_stage for stage in plan.stages if stage.zero_stage})
    zero = ", ".join(
        f"ZeRO-{z} on {counted(sum(stage.zero_stage == z for stage in plan.stages), 'stage')}"
        for z in levels
    )
    section.add(
        "pipeline",
        f"{counted(par.pipeline_degree, 'rank')}{virtual}, {counted(len(plan.stages), 'stage')}, "
        f"{par.schedule}"
        + (f", {zero}" if zero else "")
        + _sequence_parallel_text(plan)
        + _expert_text(plan),
    )
    virtual_flag = f" v={par.virtual_stages_per_rank}" if par.virtual_stages_per_rank > 1 else ""
    uneven = any(r.context_tokens for s in plan.stages for r in s.replicas)
    section.add(
        "as cost --stages",
        # The notation has no uneven cp chunks: a line without them would price another plan.
        "- (uneven cp chunks, which the notation does not write)"
        if uneven
        else f"pp={par.pipeline_degree} m={par.num_micro_batches} {par.schedule}{virtual_flag}"
        f"{' sp' if par.sequence_parallel else ''} | " + format_stage_specs(plan_stage_specs(plan)),
    )
    if par.async_pb is not None:  # it changes the optimisation, not only the speed
        settings = par.async_pb
        section.add(
            "ASYNCHRONOUS",
            "Pipelined Backpropagation: no flush, momentum SGD (α "
            f"{settings.momentum:g}) stepped per micro-batch on stale weights; weight "
            f"prediction {'on' if settings.weight_prediction else 'off'}, spike compensation "
            f"{'on' if settings.spike_compensation else 'off'}",
        )
    section.add(
        "batch",
        f"global {inputs.global_batch_size} = "
        f"{counted(par.num_micro_batches, 'micro-batch', 'micro-batches')} × "
        f"{par.micro_batch_size}; {micro_batch_text(plan)}; seq {inputs.seq_len}, {inputs.dtype}",
    )
    section.add(
        "iteration",
        Figure(
            f"{duration_text(prediction.iteration_time_ms)} predicted",
            prediction.iteration_time_ms,
            "ms",
        ),
    )
    section.add(
        "throughput",
        Figure(
            f"{rate_text(prediction.samples_per_s, 'samples')}, "
            f"{rate_text(prediction.tokens_per_s, 'tokens')}",
            prediction.tokens_per_s,
            "tokens_per_s",
        ),
    )
    section.add(
        "efficiency",
        Figure(
            f"{prediction.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {percent_text(prediction.mfu)}",
            prediction.mfu,
            "mfu",
        ),
    )
    idle = prediction.idle_gpus
    section.add(
        "idle GPUs",
        "; ".join(f"{g.count} {g.gpu_type}: {g.reason}" for g in idle) if idle else "none",
    )
    for warning in plan_precision_warnings(plan):
        section.add("PRECISION", warning, style="bold red")
    if edited_since_costed(plan):
        section.add(
            "STALE",
            "the stages, batch or inputs were edited after these times were computed: price "
            "the plan again with autoplan cost PLAN --profile PROFILE",
            style="bold red",
        )
    return section


def plan_precision_warnings(plan: Plan) -> list[str]:
    """The plan's GPU types that have no tensor cores for its dtype, and what it costs."""
    used = [entry.gpu_type for entry in plan.rank_map]
    return precision_warnings(plan.inputs.cluster, plan.inputs.dtype, used)


def _sequence_parallel_text(plan: Plan) -> str:
    """', sequence parallelism (SP) on' (every stage), ', sequence parallelism (SP) on stages
    0, 2' (those of their own), or '' without SP."""
    if plan.parallelism.sequence_parallel:
        return ", sequence parallelism (SP) on"
    stages = plan.sequence_parallel_stages
    if not stages:
        return ""
    named = f"stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))}"
    return f", sequence parallelism (SP) on {named}"


def _expert_text(plan: Plan) -> str:
    """', expert parallelism ep 4 on 2 stages' (each degree), or '' without ep."""
    degrees = sorted({s.expert_parallel_degree for s in plan.stages} - {1})
    counts = [sum(s.expert_parallel_degree == d for s in plan.stages) for d in degrees]
    uneven = sum(s.replicas[0].routed_experts is not None for s in plan.stages)
    return "".join(
        f", expert parallelism ep {d} on {n} stage{'s' if n > 1 else ''}"
        for d, n in zip(degrees, counts, strict=True)
    ) + (f" (experts by GPU speed on {counted(uneven, 'stage')})" if uneven else "")


def _zero_and_experts(stage: Stage) -> str | Figure:
    """The ZeRO column: the level, with 'ep E' where the stage splits experts, and where its
    experts are placed by speed, what each rank of an expert group holds ('5 H100 + 3 A100')."""
    ep = stage.expert_parallel_degree
    if ep == 1:
        return Figure(str(stage.zero_stage), stage.zero_stage, "") if stage.zero_stage else "no"
    text = f"{stage.zero_stage or 'no'} · ep {ep}"
    group = stage.replicas[:ep]
    if group[0].routed_experts is not None:
        text += " (" + " + ".join(f"{r.routed_experts} {r.gpu_type}" for r in group) + ")"
    return text


def stages_section(plan: Plan) -> Section:
    """One row per stage: layers, replicas by kind, nodes, recompute, times per micro-batch."""
    timing_of = {timing.stage: timing for timing in plan.prediction.stage_timings}
    section = Section(
        title="Stages (times per micro-batch, slowest replica)",
        columns=[
            *("stage", "rank", "layers", "replicas", "nodes", "recompute", "ZeRO"),
            *("fwd", "bwd", "send", "times"),
        ],
        right=frozenset({0, 1, 7, 8, 9}),
        heading_columns=2,
    )
    node_of = {entry.rank: entry.node for entry in plan.rank_map}
    for stage in plan.stages:
        timing = timing_of.get(stage.index)
        last = stage.index + 1 == len(plan.stages)
        times: list[str] = (
            [
                _ms(timing.forward_ms),
                _ms(timing.backward_ms),
                "-" if last else _ms(timing.send_ms),
            ]
            if timing
            else ["-"] * 3
        )
        count = stage.layer_end - stage.layer_start
        # At sub-block grain: which block parts the stage starts and ends at.
        units = stage_units_text(plan.inputs.model, stage.layer_start, stage.layer_end)
        section.add(
            Figure(str(stage.index), stage.index, ""),
            Figure(str(stage.pipeline_rank), stage.pipeline_rank, ""),
            f"{stage.layer_start}-{stage.layer_end - 1} ({counted(count, 'layer')})"
            + (f": {units}" if units else ""),
            replicas_text(stage, {entry.rank: entry.gpu_type for entry in plan.rank_map}),
            # Every rank's node: a cp group across GPU types spans nodes.
            node_ranges(
                node_of.get(rank, replica.node)
                for replica in stage.replicas
                for rank in replica.ranks
            ),
            runs_text(
                replica.recompute + (" +offload" if replica.offload else "")
                for replica in stage.replicas
            ),
            _zero_and_experts(stage),
            *times,
            _time_source(count, timing),
        )
    return section


def _time_source(layers: int, timing: StageTiming | None) -> str:
    """'measured' when every replica's layers are timed from measurements, 'modelled' when
    none are, else how many of the layers are measured (per replica kind)."""
    if timing is None or not timing.replicas:
        return "-"
    counts = sorted({replica.measured_layers for replica in timing.replicas})
    if counts == [layers]:
        return "measured"
    if counts == [0]:
        return "modelled"
    return "measured " + ", ".join(f"{c}/{layers}" for c in counts)


def breakdown_section(plan: Plan) -> Section:
    """Where the predicted iteration time goes, and each part's share."""
    breakdown = plan.prediction.breakdown
    total = plan.prediction.iteration_time_ms
    section = Section(
        title="Time per iteration (exposed)",
        columns=["part", "time", "share"],
        right=frozenset({1, 2}),
    )
    parts = [
        ("compute", breakdown.compute_ms),
        ("pipeline bubble", breakdown.bubble_ms),
        ("tensor-parallel comm", breakdown.tp_comm_ms),
        ("pipeline sends", breakdown.pp_comm_ms),
        ("data-parallel all-reduce", breakdown.dp_comm_ms),
        ("optimizer", breakdown.optimizer_ms),
    ]
    for name, ms in parts:
        share = Figure(percent_text(ms / total), ms / total, "fraction") if total else "-"
        section.add(name, _ms(ms), share)
    section.add("iteration (predicted)", _ms(total), "", style="bold")
    return section


def idle_section(plan: Plan) -> Section:
    """GPUs of the cluster the plan leaves unused, per type, and why."""
    section = Section(title="Idle GPUs", columns=["GPU", "idle", "reason"], right=frozenset({1}))
    for idle in plan.prediction.idle_gpus:
        section.add(idle.gpu_type, Figure(str(idle.count), idle.count, "count"), idle.reason)
    if not plan.prediction.idle_gpus:
        section.add("-", "0", "every GPU of the cluster is used")
    return section


def alternatives_section(plan: Plan) -> Section:
    """The runners-up the solver kept, with their speed relative to the chosen plan."""
    section = Section(
        title="Alternatives",
        columns=[
            *("#", "pipeline and stages", "layers per stage", "GPU per stage"),
            *("iteration", "samples/s", "vs chosen"),
        ],
        right=frozenset({0, 4, 5, 6}),
    )
    chosen = plan.prediction.samples_per_s
    for alternative in plan.alternatives:
        section.add(
            str(alternative.rank),
            alternative.summary,
            " ".join(str(count) for count in alternative.layer_split),
            " ".join(alternative.gpu_types),
            _ms(alternative.iteration_time_ms),
            Figure(
                rate_text(alternative.samples_per_s, "samples").removesuffix(" samples/s"),
                alternative.samples_per_s,
                "per_s",
            ),
            Figure(
                f"{alternative.samples_per_s / chosen:.2f}×",
                alternative.samples_per_s / chosen,
                "ratio",
            ),
        )
    legacy = any(_LEGACY_SUMMARY.search(a.summary) for a in plan.alternatives)
    section.note = ALTERNATIVES_LEGEND + (" " + LEGACY_LEGEND if legacy else "")
    return section


def plan_document(plan: Plan, title: str = "") -> Document:
    """Everything ``autoplan show`` prints, in order."""
    sections = [
        overview_section(plan),
        stages_section(plan),
        memory_section(plan),
        breakdown_section(plan),
        idle_section(plan),
    ]
    if plan.alternatives:
        sections.append(alternatives_section(plan))
    return Document(title=title, sections=sections)
