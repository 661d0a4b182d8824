"""Megatron-LM's command-line arguments for a plan, as a bash array to source.

The file defines ``MEGATRON_ARGS``, one argument with its value per line, each word quoted
for the shell; ``torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <model and data args>``
uses it. It holds the parallelism, batch, sequence, precision and recompute arguments and the
number of transformer layers; the model's shape (hidden size, heads, FFN size), data and
optimizer are the user's. Argument names are Megatron-LM's (``megatron/training/arguments.py``).

Layers: Megatron-LM counts transformer layers only (``--num-layers``) and puts the embedding
on the first stage and the output head with the loss on the last, as the plan does. The
plan's split of transformer layers over (virtual) stages is written the simplest way that
Megatron-LM divides back to exactly that split: nothing when it is even (per stage, or per
virtual stage with ``--num-layers-per-virtual-pipeline-stage``), ``--decoder-first-
pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` when only the first or last
pipeline rank differs, else ``--pipeline-model-parallel-layout`` (Megatron-core's layout
string, e.g. ``E|t*16|t*15,L``; 2025 and later), which holds any split.

Recompute: the plan's ``full`` is Megatron-LM's full recompute of every layer
(``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``); its
``selective`` is Megatron-LM's own selective recompute (attention core recomputed). ZeRO-1 is
``--use-distributed-optimizer`` (ZeRO-2/3 plans are refused), sequence parallelism
``--sequence-parallel`` (global: a plan with SP on some stages only is refused), context
parallelism ``--context-parallel-size`` (its ring attention with load-balanced causal chunks,
ranks ordered tp-cp-dp-pp as the plan's). Megatron-LM has
no GPipe schedule: a GPipe plan runs as 1F1B, with the same bubble and fewer micro-batches in
flight (a note says so).
"""

from __future__ import annotations

import shlex

from autoplan.export.expressible import (
    ExportResult,
    NotExpressibleError,
    PlanShape,
    TransformerLayout,
    check_schedule,
    plan_shape,
    tf32_note,
    transformer_layout,
)
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.profile.schema import LayerKind
from autoplan.schedule.names import ScheduleName
from autoplan.solve.options import SolveOptions

__all__ = [
    "ARRAY_NAME",
    "TARGET",
    "export_megatron",
    "layout_string",
    "megatron_args",
    "megatron_layer_split",
    "restrictions",
]

TARGET = "megatron"
# Megatron-LM's schedules: 1F1B (GPipe plans run as it, noted) and interleaved 1F1B; its
# zero-bubble schedules live in forks (sail-sg's), not in Megatron-LM itself.
SCHEDULES: tuple[ScheduleName, ...] = ("gpipe", "1f1b", "interleaved_1f1b")
ARRAY_NAME = "MEGATRON_ARGS"
_PRECISION_FLAG = {"bf16": "--bf16", "fp16": "--fp16", "fp32": None, "tf32": None}


def megatron_layer_split(
    num_layers: int, pp: int, vpp: int, first: int | None = None, last: int | None = None
) -> list[int] | None:
    """Transformer layers per virtual stage (index chunk * pp + pipeline rank) as Megatron-LM
    divides ``num_layers`` given ``--decoder-first/last-pipeline-num-layers``; None where
    Megatron-LM refuses the numbers (its TransformerConfig checks: the first and last given
    counts positive, the rest dividing evenly over the middle ranks, each rank's count
    dividing over its vpp chunks)."""
    if pp < 2 and (first is not None or last is not None):
        return None
    remaining, middle = num_layers, pp
    for count in (first, last):
        if count is not None:
            if count <= 0:
                return None
            remaining -= count
            middle -= 1
    if middle == 0:
        if remaining != 0:
            return None
        each = 0
    elif remaining <= 0 or remaining % middle:
        return None
    else:
        each = remaining // middle
    per_rank = [each] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    if any(count % vpp for count in per_rank):
        return None
    return [per_rank[i % pp] // vpp for i in range(pp * vpp)]


def layout_string(plan: Plan, layout: TransformerLayout) -> str:
    """Megatron-core's ``--pipeline-model-parallel-layout`` for the plan's split: stages in
    order separated by '|', 'E' the embedding, 't*n' n transformer layers, 'L' the head and
    loss (a ',' only separates them for the eye)."""
    last = len(plan.stages) - 1
    parts = []
    for stage, blocks in zip(plan.stages, layout.stage_blocks, strict=True):
        words = []
        if stage.index == 0:
            words.append("E")
        if blocks:
            words.append("t" if blocks == 1 else f"t*{blocks}")
        if stage.index == last:
            words.append("L")
        parts.append(",".join(words))
    return "|".join(parts)


def _split_args(plan: Plan, shape: PlanShape, layout: TransformerLayout) -> list[list[str]]:
    """The fewest arguments with which Megatron-LM divides the layers as the plan does."""
    pp, vpp = shape.pipeline_degree, shape.virtual_stages_per_rank
    if pp == 1:
        return []
    blocks = layout.stage_blocks
    rank_total = [sum(blocks[i] for i in range(r, len(blocks), pp)) for r in range(pp)]
    for first, last in ((None, None), (rank_total[0], None), (None, rank_total[-1])):
        if megatron_layer_split(layout.num_blocks, pp, vpp, first, last) == blocks:
            break
    else:
        first, last = rank_total[0], rank_total[-1]
        if megatron_layer_split(layout.num_blocks, pp, vpp, first, last) != blocks:
            return [["--pipeline-model-parallel-layout", layout_string(plan, layout)]]
    args: list[list[str]] = []
    if vpp > 1:
        if first is None and last is None:
            args.append(["--num-layers-per-virtual-pipeline-stage", str(blocks[0])])
        else:
            # Megatron-LM takes only this form of the vpp degree with uneven first/last ranks.
            args.append(["--num-virtual-stages-per-pipeline-rank", str(vpp)])
    if first is not None:
        args.append(["--decoder-first-pipeline-num-layers", str(first)])
    if last is not None:
        args.append(["--decoder-last-pipeline-num-layers", str(last)])
    return args


def megatron_args(plan: Plan, kinds: list[LayerKind] | None) -> list[list[str]]:
    """Megatron-LM's arguments for the plan, one argument and its values per entry;
    NotExpressibleError naming what Megatron-LM cannot run."""
    shape = plan_shape(plan, TARGET)
    check_schedule(shape.schedule, TARGET, SCHEDULES)
    if shape.dtype not in _PRECISION_FLAG:
        raise NotExpressibleError(
            TARGET, f"its dtype is {shape.dtype}; Megatron-LM trains in fp32, bf16 or fp16"
        )
    if shape.zero_stage >= 2:
        raise NotExpressibleError(
            TARGET,
            f"it uses ZeRO-{shape.zero_stage}; the export writes Megatron-LM's distributed "
            "optimizer (ZeRO-1) at most",
        )
    layout = transformer_layout(plan, kinds, TARGET)
    args = [
        ["--tensor-model-parallel-size", str(shape.tensor_parallel_degree)],
        ["--pipeline-model-parallel-size", str(shape.pipeline_degree)],
        *(
            [["--context-parallel-size", str(shape.context_parallel_degree)]]
            if shape.context_parallel_degree > 1
            else []
        ),
        *_split_args(plan, shape, layout),
        ["--num-layers", str(layout.num_blocks)],
        ["--micro-batch-size", str(shape.micro_batch_size)],
        ["--global-batch-size", str(shape.global_batch_size)],
        ["--seq-length", str(shape.seq_len)],
    ]
    flag = _PRECISION_FLAG[shape.dtype]
    if flag is not None:
        args.append([flag])
    if shape.recompute == "full":
        args += [
            ["--recompute-granularity", "full"],
            ["--recompute-method", "uniform"],
            ["--recompute-num-layers", "1"],
        ]
    elif shape.recompute == "selective":
        args.append(["--recompute-granularity", "selective"])
    if shape.zero1:
        args.append(["--use-distributed-optimizer"])
    if shape.sequence_parallel:
        args.append(["--sequence-parallel"])
    if shape.expert_parallel_degree > 1:
        # Megatron-LM's expert groups sit inside the data-parallel group, as the plan's do.
        args.append(["--expert-model-parallel-size", str(shape.expert_parallel_degree)])
    return args


def _notes(shape: PlanShape) -> list[str]:
    notes = []
    if shape.pipeline_degree > 1 and shape.schedule == "gpipe":
        notes.append(
            "Megatron-LM has no GPipe schedule: it runs this pipeline with 1F1B, the same "
            "bubble with fewer micro-batches in flight (no more memory than the plan's)"
        )
    if shape.dtype == "tf32":
        notes.append(tf32_note("Megatron-LM trains fp32 without a precision flag"))
    return notes


def export_megatron(plan: Plan, kinds: list[LayerKind] | None, source: str) -> ExportResult:
    """The bash file defining ``MEGATRON_ARGS`` for the plan (module docstring)."""
    args = megatron_args(plan, kinds)
    shape = plan_shape(plan, TARGET)
    model = plan.inputs.model
    lines = [
        f"# Megatron-LM arguments for {printable(source)} (autoplan export --to {TARGET}).",
        f"# {printable(model.name)}: seq {shape.seq_len}, {shape.dtype}; {shape.world_size} GPUs"
        f" = pp {shape.pipeline_degree} x dp {shape.data_parallel_degree} x "
        f"{f'cp {shape.context_parallel_degree} x ' if shape.context_parallel_degree > 1 else ''}"
        f"tp {shape.tensor_parallel_degree}; global batch {shape.global_batch_size} = "
        f"{shape.num_micro_batches} micro-batches x {shape.micro_batch_size} per replica "
        f"(--micro-batch-size, as Megatron-LM counts it) x dp {shape.data_parallel_degree}. "
        "Launch the plan's nodes in this order (torchrun --node-rank):",
    ]
    lines += [
        f"#   {node.node_rank}: {printable(node.name)}, {node.nproc_per_node} x "
        f"{printable(node.gpu_type)}"
        for node in sorted(plan.nodes, key=lambda n: n.node_rank)
    ]
    lines += [
        "# Add the model's own arguments (hidden size, heads, FFN size), data and optimizer:",
        f'#   source FILE && torchrun ... pretrain_gpt.py "${{{ARRAY_NAME}[@]}}" ...',
        f"{ARRAY_NAME}=(",
        *(f"  {shlex.join(arg)}" for arg in args),
        ")",
        "",
    ]
    return ExportResult(target=TARGET, text="\n".join(lines), notes=_notes(shape))


def restrictions(num_layers: int, base: SolveOptions) -> list[SolveOptions]:
    """The solves whose best covers every plan Megatron-LM runs within ``base`` (uniform
    space): one recompute mode for every stage, each tried (any split is expressible)."""
    modes = [base.recompute] if base.recompute is not None else ["none", "selective", "full"]
    return [base.model_copy(update={"recompute": mode}) for mode in modes]
