"""DeepSpeed's configuration JSON for a plan.

Keys are DeepSpeed's (its config-json documentation and ``deepspeed/runtime/config.py``):
``train_batch_size``, ``train_micro_batch_size_per_gpu`` (one replica's share of a
micro-batch) and ``gradient_accumulation_steps`` (the plan's micro-batch count, which is also
the pipeline engine's micro-batches per step), ``zero_optimization.stage`` (the plan's ZeRO
level, 0-3), ``bf16`` / ``fp16``, ``tensor_parallel.autotp_size`` (AutoTP training) and the
``pipeline`` section.

What the config cannot hold, DeepSpeed takes in code, so the limits are its engine's: the
pipeline is a ``PipelineModule(layers, num_stages, partition_method)`` whose layer split is
computed, not given; of its methods only ``uniform`` gives a known split in every version, and
only when the layers divide evenly, so a pipelined plan must split its layers (the plan's
layers as the module's layer list: embedding, each block, head) evenly. Its pipeline engine
runs one schedule (1F1B-like), so interleaved plans are refused and GPipe plans run as 1F1B (a
note says so); it checkpoints activations from the config only through
``pipeline.activation_checkpoint_interval`` (1: every layer, the plan's ``full``), so full
recompute needs pp > 1 and ``selective`` is refused. AutoTP is documented with ZeRO data
parallelism, not with the pipeline engine, so tp > 1 with pp > 1 is refused.

ZeRO: the pipeline engine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with
pipeline parallelism", ``deepspeed/runtime/pipe/engine.py``), so ZeRO-2/3 plans are written
only at pp = 1; AutoTP training runs with ZeRO stages 0-2 (its tutorial), so ZeRO-3 with
tp > 1 is refused.
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.export.expressible import (
    ExportResult,
    NotExpressibleError,
    PlanShape,
    check_schedule,
    plan_shape,
    tf32_note,
)
from autoplan.plan.schema import Plan
from autoplan.profile.schema import LayerKind
from autoplan.schedule.names import ScheduleName
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import PIPELINE_DEGREES

__all__ = ["TARGET", "deepspeed_config", "export_deepspeed", "restrictions"]

TARGET = "deepspeed"
# DeepSpeed's pipeline engine runs one 1F1B-like schedule (GPipe plans run as it, noted).
SCHEDULES: tuple[ScheduleName, ...] = ("gpipe", "1f1b")
_PRECISIONS = ("bf16", "fp16", "fp32", "tf32")


def _fail(part: str) -> NotExpressibleError:
    return NotExpressibleError(TARGET, part)


def _check(shape: PlanShape) -> None:
    pp = shape.pipeline_degree
    if shape.dtype not in _PRECISIONS:
        raise _fail(f"its dtype is {shape.dtype}; DeepSpeed trains in fp32, bf16 or fp16")
    if shape.context_parallel_degree > 1:
        raise _fail(
            f"it uses context parallelism (cp {shape.context_parallel_degree}); DeepSpeed's "
            "config has no ring attention (its Ulysses sequence parallelism is all-to-all "
            "attention in the model's code)"
        )
    if shape.expert_parallel_degree > 1:
        raise _fail(
            f"it splits experts (ep {shape.expert_parallel_degree}); DeepSpeed sets expert "
            "parallelism in the model's MoE layers (deepspeed.moe), not in its config"
        )
    if shape.schedule == "interleaved_1f1b":
        raise _fail(
            "it interleaves the pipeline (interleaved 1F1B); DeepSpeed's pipeline engine runs "
            "one stage per rank"
        )
    check_schedule(shape.schedule, TARGET, SCHEDULES)
    if pp > 1 and shape.tensor_parallel_degree > 1:
        raise _fail(
            f"it combines tp {shape.tensor_parallel_degree} with pp {pp}; DeepSpeed's config "
            "sets tensor parallelism only as AutoTP, which runs beside ZeRO data parallelism, "
            "not in its pipeline engine"
        )
    if pp > 1 and len(set(shape.stage_layers)) > 1:
        split = ", ".join(str(n) for n in shape.stage_layers)
        raise _fail(
            f"its layers per stage ({split}) are uneven; DeepSpeed computes the split in code "
            "(PipelineModule's partition_method) and only 'uniform' with layers dividing "
            "evenly gives a known split"
        )
    if shape.zero_stage >= 2 and pp > 1:
        raise _fail(
            f"it uses ZeRO-{shape.zero_stage} with pp {pp}; DeepSpeed's pipeline engine runs "
            "ZeRO stages 0 and 1 only"
        )
    if shape.zero_stage == 3 and shape.tensor_parallel_degree > 1:
        raise _fail(
            f"it uses ZeRO-3 with tp {shape.tensor_parallel_degree}; DeepSpeed's AutoTP "
            "training runs with ZeRO stages 0 to 2"
        )
    if shape.sequence_parallel:
        raise _fail(
            f"it shards the sequence over tp {shape.tensor_parallel_degree} (sequence "
            "parallelism); DeepSpeed's AutoTP keeps every rank's whole sequence: more "
            "activation memory than the plan's"
        )
    if shape.recompute == "selective":
        raise _fail(
            "it uses selective recompute; DeepSpeed's config sets only full recompute "
            "(pipeline.activation_checkpoint_interval)"
        )
    if shape.recompute == "full" and pp == 1:
        raise _fail(
            "it uses full recompute without a pipeline; DeepSpeed's config sets recompute only "
            "for its pipeline engine (pipeline.activation_checkpoint_interval), the model's "
            "code does it otherwise"
        )


def deepspeed_config(plan: Plan, kinds: list[LayerKind] | None = None) -> dict[str, Any]:
    """DeepSpeed's config for the plan (layer kinds are not needed: DeepSpeed's pipeline
    counts every layer); NotExpressibleError naming what DeepSpeed cannot run."""
    shape = plan_shape(plan, TARGET)
    _check(shape)
    config: dict[str, Any] = {
        "train_batch_size": shape.global_batch_size,
        "train_micro_batch_size_per_gpu": shape.micro_batch_size,
        "gradient_accumulation_steps": shape.num_micro_batches,
        "zero_optimization": {"stage": shape.zero_stage},
        "bf16": {"enabled": shape.dtype == "bf16"},
        "fp16": {"enabled": shape.dtype == "fp16"},
    }
    if shape.pipeline_degree > 1:
        config["pipeline"] = {
            "stages": shape.pipeline_degree,
            "partition": "uniform",
            "activation_checkpoint_interval": 1 if shape.recompute == "full" else 0,
        }
    if shape.tensor_parallel_degree > 1:
        config["tensor_parallel"] = {"autotp_size": shape.tensor_parallel_degree}
    return config


def _notes(plan: Plan, shape: PlanShape) -> list[str]:
    notes = []
    pp = shape.pipeline_degree
    if pp > 1:
        notes.append(
            f"DeepSpeed builds the pipeline in code: PipelineModule(layers=<the plan's "
            f"{plan.inputs.model.num_layers} layers: embedding, blocks, head>, num_stages={pp}, "
            f"partition_method='uniform') gives its {shape.stage_layers[0]} layers per stage"
        )
        if shape.schedule == "gpipe":
            notes.append(
                "DeepSpeed's pipeline engine has no GPipe schedule: it runs 1F1B, the same "
                "bubble with fewer micro-batches in flight (no more memory than the plan's)"
            )
    if shape.dtype == "tf32":
        notes.append(tf32_note("DeepSpeed trains fp32 with neither bf16 nor fp16"))
    return notes


def export_deepspeed(plan: Plan, kinds: list[LayerKind] | None, source: str) -> ExportResult:
    """The DeepSpeed config JSON for the plan (JSON has no comments: notes hold the rest)."""
    config = deepspeed_config(plan, kinds)
    text = json.dumps(config, indent=2) + "\n"
    return ExportResult(target=TARGET, text=text, notes=_notes(plan, plan_shape(plan, TARGET)))


def restrictions(num_layers: int, base: SolveOptions) -> list[SolveOptions]:
    """The solves whose best covers every plan DeepSpeed runs within ``base`` (uniform space):
    no pipeline (any tp, no recompute, no sequence parallelism), or pp ranks of one GPU each
    (tp 1) over an even split of the layers with 1F1B and no or full recompute."""
    # AutoTP has no sequence parallelism (the pipelined plans are tp 1: it means nothing).
    found = [
        base.model_copy(
            update={"pp": 1, "layer_split": None, "recompute": "none", "sequence_parallel": False}
        )
    ]
    for pp in PIPELINE_DEGREES:
        if pp < 2 or num_layers % pp:
            continue
        for mode in ("none", "full"):
            update = {
                "pp": pp,
                "tp": 1,
                "layer_split": [num_layers // pp] * pp,
                "schedule": "1f1b",
                "recompute": mode,
            }
            found.append(base.model_copy(update=update))
    return found
