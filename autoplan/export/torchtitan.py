"""torchtitan's job configuration for a plan: the TOML sections that hold its parallelism.

The file holds ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]`` with
torchtitan's own key names (``torchtitan/config/job_config.py``); ``[model]``, ``[optimizer]``
and the rest are the user's, merged in. The pipeline split is written as
``module_fqns_per_model_part``, one list of module names per (virtual) stage, which holds any
split; the names are those of torchtitan's decoder models: ``tok_embeddings``, ``layers.N``,
``norm`` and ``output`` (the plan's head is the final norm and the output layer).

Batches: every replica runs ``pipeline_parallel_microbatch_size`` samples per micro-batch.
With pp > 1 its ``local_batch_size`` is the plan's micro-batches together (torchtitan splits
it into the micro-batches); with pp = 1 it is one micro-batch and ``global_batch_size``
makes torchtitan accumulate gradients over the plan's micro-batch count.

Data parallelism: at ZeRO-0, ``data_parallel_replicate_degree`` (weights replicated,
gradients all-reduced, as the plan costs it); from ZeRO-1 on, FSDP over the replicas
(``data_parallel_shard_degree``). ZeRO-2 is FSDP with ``fsdp_reshard_after_forward =
"never"`` (weights stay gathered from forward to backward, as the plan's level 2), ZeRO-3
with ``"always"`` (gathered again for the backward). torchtitan has no ZeRO-1 alone: a ZeRO-1
plan is written as ZeRO-2 is, which shards the optimizer states as ZeRO-1 does and gradients
and weights too (no more memory than the plan's; a note says so). With pp > 1, torch's
pipeline stage defers FSDP's reduce-scatter to the last micro-batch (the plan's runtime does
it per micro-batch, ``autoplan.runtime.fsdp``): a note says gradients and weights stay
unsharded through the step there. Recompute: ``none`` and ``full`` are
torchtitan's; the plan's ``selective`` (matmul outputs kept, attention recomputed) is closest
to torchtitan's per-op selective checkpointing, which also recomputes every second matmul (a
note says so). Precision: ``mixed_precision_param`` is bfloat16 or float32, so fp16 and fp64
plans are refused.
"""

from __future__ import annotations

import json

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
    "SCHEDULE_NAMES",
    "TARGET",
    "export_torchtitan",
    "module_fqns",
    "restrictions",
    "torchtitan_config",
]

TARGET = "torchtitan"
# PyTorch's schedule class names, which torchtitan's pipeline_parallel_schedule takes
# (torch.distributed.pipelining.schedules.get_schedule_class); torchtitan places the stages
# of ZBVZeroBubble and DualPipeV in a V itself, as the plan's ranks do.
SCHEDULE_NAMES: dict[ScheduleName, str] = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    "interleaved_zero_bubble": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
_PARAM_DTYPE = {"bf16": "bfloat16", "fp32": "float32", "tf32": "float32"}

TomlValue = int | str | bool | list[str] | list[list[str]]


def module_fqns(plan: Plan, layout: TransformerLayout) -> list[list[str]]:
    """Module names of each (virtual) stage in stage order, torchtitan's decoder naming."""
    last = plan.inputs.model.num_layers - 1
    parts = []
    for stage in plan.stages:
        names: list[str] = []
        for layer in range(stage.layer_start, stage.layer_end):
            block = layout.block_index[layer]
            if block is not None:
                names.append(f"layers.{block}")
            elif layer == 0:
                names.append("tok_embeddings")
            elif layer == last:
                names += ["norm", "output"]
        parts.append(names)
    return parts


def torchtitan_config(plan: Plan, kinds: list[LayerKind] | None) -> dict[str, dict[str, TomlValue]]:
    """The sections and keys of torchtitan's job config for the plan; NotExpressibleError
    naming what torchtitan cannot run."""
    shape = plan_shape(plan, TARGET)
    check_schedule(shape.schedule, TARGET, list(SCHEDULE_NAMES))
    if shape.dtype not in _PARAM_DTYPE:
        raise NotExpressibleError(
            TARGET,
            f"its dtype is {shape.dtype}; torchtitan's mixed_precision_param is bfloat16 or "
            "float32",
        )
    pp, dp = shape.pipeline_degree, shape.data_parallel_degree
    parallelism: dict[str, TomlValue] = {
        "data_parallel_replicate_degree": 1 if shape.zero1 else dp,
        "data_parallel_shard_degree": dp if shape.zero1 else 1,
        "tensor_parallel_degree": shape.tensor_parallel_degree,
        "pipeline_parallel_degree": pp,
    }
    if shape.context_parallel_degree > 1:
        # torchtitan's mesh is (pp, dp_replicate, dp_shard, cp, tp): the plan's rank order.
        parallelism["context_parallel_degree"] = shape.context_parallel_degree
    if shape.expert_parallel_degree > 1:
        # torchtitan's expert_parallel_degree borrows its ranks from FSDP's shard dimension
        # (and cp), never from replicated data parallelism, where the plan's groups are.
        raise NotExpressibleError(
            TARGET,
            f"its expert groups (ep {shape.expert_parallel_degree}) are replicated (ZeRO 0) "
            "data-parallel replicas; torchtitan's expert_parallel_degree must divide "
            f"data_parallel_shard_degree (1) times context_parallel_degree "
            f"({shape.context_parallel_degree})",
        )
    if shape.zero1:
        # ZeRO-3 regathers the weights for the backward; ZeRO-1 and 2 keep them gathered.
        reshard = "always" if shape.zero_stage == 3 else "never"
        parallelism["fsdp_reshard_after_forward"] = reshard
    if pp > 1:
        layout = transformer_layout(plan, kinds, TARGET)
        parallelism["pipeline_parallel_schedule"] = SCHEDULE_NAMES[shape.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = shape.micro_batch_size
        parallelism["module_fqns_per_model_part"] = module_fqns(plan, layout)
        local = shape.micro_batch_size * shape.num_micro_batches
    else:
        local = shape.micro_batch_size
    training: dict[str, TomlValue] = {
        "local_batch_size": local,
        "global_batch_size": shape.global_batch_size,
        "seq_len": shape.seq_len,
        "mixed_precision_param": _PARAM_DTYPE[shape.dtype],
    }
    checkpoint: dict[str, TomlValue] = {"mode": shape.recompute}
    if shape.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    return {
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": checkpoint,
    }


def _toml_value(value: TomlValue, indent: str = "") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # JSON's escapes of an ASCII string are TOML's basic-string escapes.
        return json.dumps(value, ensure_ascii=True)
    if value and isinstance(value[0], list):
        rows = [f"{indent}  {_toml_value(row)}," for row in value]
        return "[\n" + "\n".join(rows) + f"\n{indent}]"
    return "[" + ", ".join(_toml_value(item) for item in value) + "]"


def _notes(shape: PlanShape) -> list[str]:
    notes = []
    if shape.zero1 and shape.zero_stage == 1:
        notes.append(
            "torchtitan has no ZeRO-1 alone: data parallelism is FSDP, which shards gradients "
            "and weights as well (less memory than the plan's, an all-gather of the weights "
            "per step)"
        )
    if shape.zero_stage >= 2 and shape.pipeline_degree > 1:
        notes.append(
            "torch's pipeline stage reduce-scatters FSDP's gradients after the last "
            "micro-batch only: gradients and weights stay unsharded through the step, more "
            "memory than the plan's per-micro-batch reduce-scatter"
        )
    if shape.recompute == "selective":
        notes.append(
            "torchtitan's selective checkpointing ('op') also recomputes every second matmul: "
            "backward is slower than the plan's selective recompute predicts"
        )
    replicated = not shape.zero1 and shape.data_parallel_degree > 1
    if (
        shape.dtype == "bf16"
        and not shape.zero1
        and (shape.pipeline_degree > 1 or shape.tensor_parallel_degree > 1)
    ):
        notes.append(
            "torchtitan applies mixed_precision_param through FSDP (or autocast when data "
            "parallelism is all there is): with tp or pp and no FSDP it trains in float32"
        )
    if replicated and (shape.pipeline_degree > 1 or shape.tensor_parallel_degree > 1):
        notes.append(
            "some torchtitan versions refuse replicated data parallelism (DDP) beside tp or pp "
            "('DDP has not supported > 1D parallelism')"
        )
    if shape.tensor_parallel_degree > 1 and not shape.sequence_parallel:
        notes.append(
            "torchtitan's tensor parallelism always shards the sequence between sub-layers "
            "(sequence parallelism, its norms on sequence shards): less activation memory than "
            "the plan's, and all-gathers / reduce-scatters in place of its all-reduces"
        )
    if shape.dtype == "tf32":
        notes.append(tf32_note("torchtitan trains float32"))
    return notes


def export_torchtitan(plan: Plan, kinds: list[LayerKind] | None, source: str) -> ExportResult:
    """The TOML of torchtitan's parallelism, training and checkpointing sections for the plan."""
    config = torchtitan_config(plan, kinds)
    shape = plan_shape(plan, TARGET)
    lines = [
        f"# torchtitan job config sections for {printable(source)} (autoplan export --to "
        f"{TARGET}).",
        f"# {printable(plan.inputs.model.name)}: {shape.world_size} GPUs = pp "
        f"{shape.pipeline_degree} x dp {shape.data_parallel_degree} x tp "
        f"{shape.tensor_parallel_degree}; global batch {shape.global_batch_size} = "
        f"{shape.num_micro_batches} micro-batches x {shape.micro_batch_size} per replica x dp "
        f"{shape.data_parallel_degree}; launch the plan's nodes in its order (torchrun "
        "--node-rank), nodes:",
        "#   "
        + ", ".join(
            f"{node.node_rank} {printable(node.name)} ({node.nproc_per_node} x "
            f"{printable(node.gpu_type)})"
            for node in sorted(plan.nodes, key=lambda n: n.node_rank)
        ),
        "# Merge into your job config ([model], [optimizer], ... are yours). Module names are "
        "those of torchtitan's decoders.",
    ]
    for section, keys in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
    lines.append("")
    return ExportResult(target=TARGET, text="\n".join(lines), notes=_notes(shape))


def restrictions(num_layers: int, base: SolveOptions) -> list[SolveOptions]:
    """The solves whose best covers every plan torchtitan runs within ``base`` (uniform
    space): one recompute mode for every stage, each tried."""
    modes = [base.recompute] if base.recompute is not None else ["none", "selective", "full"]
    return [base.model_copy(update={"recompute": mode}) for mode in modes]
