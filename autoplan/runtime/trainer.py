"""Train a plan: build this rank's stages, wrap them as the plan says, run the schedule.

The public entry point is :func:`train`. Per rank it

1. checks the launch against the plan (before touching any process group),
2. joins the default group (NCCL on CUDA, gloo on CPU) and builds the (pp, dp, tp) DeviceMesh,
3. builds the model from a fixed seed in the plan's dtype and keeps its stage(s)' layers,
4. applies tensor parallelism (DTensor, "tp" sub-mesh), activation recompute, and data
   parallelism over the "dp" sub-mesh (DDP, with ZeRO-1 when the plan says so; FSDP2 with
   tensor parallelism: see ``data_parallel``),
5. wraps each stage in a ``PipelineStage`` on the "pp" group and runs the plan's schedule
   (GPipe, 1F1B, Interleaved 1F1B) with the plan's micro-batches,
6. logs and reports each step's time, loss and peak memory.

Uneven data-parallel shares (pp = 1 only) scale replica r's loss by dp × its samples / global
batch, so that DDP's plain average of the replicas' gradients is the full-batch mean.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class
from torch.distributed.tensor import DTensor

from autoplan.errors import InputError
from autoplan.plan.schema import Plan
from autoplan.runtime.data import Batch, replica_rows, training_batches
from autoplan.runtime.data_parallel import make_optimizer, wrap_data_parallel
from autoplan.runtime.launch_check import LaunchEnv, check_launch
from autoplan.runtime.loss import loss_context, loss_function
from autoplan.runtime.memory import model_state_bytes, peak_memory_bytes
from autoplan.runtime.mesh import build_mesh, init_distributed
from autoplan.runtime.mixed_precision import MasterWeightAdamW
from autoplan.runtime.model_stage import build_stage_models, pipeline_layers
from autoplan.runtime.recompute import apply_recompute
from autoplan.runtime.report import RunReport, StepRecord
from autoplan.runtime.tensor_parallel import (
    apply_tensor_parallel,
    vocabulary_shard_rows,
    vocabulary_sizes,
)
from autoplan.runtime.tied_weights import TiedGradientSync
from autoplan.zoo import get_model_spec

__all__ = [
    "SCHEDULE_CLASSES",
    "GradientHook",
    "check_runnable",
    "plan_summary",
    "train",
]

logger = logging.getLogger(__name__)

GradientHook = Callable[[int, dict[str, torch.Tensor]], None]
"""Called on every rank after each step's backward, before the optimizer: (step, gradients of
this rank's stage parameters by name, tensor-parallel shards gathered to full tensors)."""

SCHEDULE_CLASSES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}


def plan_summary(plan: Plan) -> str:
    """The plan's knobs in one line, e.g. 'pp=2 dp=1 tp=1 m=4 mbs=[2] 1f1b layers=[3, 3]'."""
    par = plan.parallelism
    layers = [stage.layer_end - stage.layer_start for stage in plan.stages]
    virtual = f" v={par.virtual_stages_per_rank}" if par.virtual_stages_per_rank > 1 else ""
    return (
        f"pp={par.pipeline_degree} dp={par.data_parallel_degree} tp={par.tensor_parallel_degree}"
        f"{virtual} m={par.num_micro_batches} mbs={par.replica_micro_batch_sizes} "
        f"{par.schedule} layers={layers}" + (" zero1" if par.zero1 else "")
    )


def _meta_model(plan: Plan) -> nn.Module:
    with torch.device("meta"):  # shapes only: nothing is allocated
        return get_model_spec(plan.inputs.model.name).build()


def check_runnable(plan: Plan) -> None:
    """Refuse, before any process starts work, what the runtime would reject later or run
    wrongly: an unknown model or one of another layer count, a tp degree its heads cannot
    split into, stage layouts and schedules that torch's pipelining does not take.

    A tp degree that does not divide the vocabulary is not refused: the embedding and head
    are then split unevenly (logged here; see ``tensor_parallel``)."""
    par = plan.parallelism
    spec = get_model_spec(plan.inputs.model.name)
    model = _meta_model(plan)
    num_layers = len(pipeline_layers(model))
    if num_layers != plan.inputs.model.num_layers:
        raise InputError(
            f"model '{spec.name}' has {num_layers} layers; the plan was made for "
            f"{plan.inputs.model.num_layers}"
        )
    divisor = spec.tensor_parallel_divisor
    if divisor is not None and divisor % par.tensor_parallel_degree:
        raise InputError(
            f"tensor parallel degree {par.tensor_parallel_degree} does not divide "
            f"{plan.inputs.model.name}'s heads, kv heads and MLP width (their gcd is {divisor})"
        )
    tp = par.tensor_parallel_degree
    for size in sorted(vocabulary_sizes(model)) if tp > 1 else []:
        if size % tp:
            logger.info(
                "tensor parallel degree %d does not divide %s's vocabulary of %d: its token "
                "embedding and head are split unevenly, %s rows per tp rank",
                tp,
                plan.inputs.model.name,
                size,
                "/".join(str(rows) for rows in vocabulary_shard_rows(size, tp)),
            )
    m, stages = par.num_micro_batches, par.num_stages
    previous_end = 0
    for position, stage in enumerate(plan.stages):
        if stage.index != position:
            raise InputError(f"stage {position} of the plan has index {stage.index}")
        if stage.layer_start != previous_end or stage.layer_end <= stage.layer_start:
            raise InputError(
                f"stage {stage.index} holds layers [{stage.layer_start}, {stage.layer_end}); "
                f"stages must be non-empty and follow on (it should start at {previous_end})"
            )
        # torch's pipelining places stage s on pipeline rank s % pp (the plan's convention).
        if stage.pipeline_rank != stage.index % par.pipeline_degree:
            raise InputError(
                f"stage {stage.index} is on pipeline rank {stage.pipeline_rank}; with pp = "
                f"{par.pipeline_degree} it must be on {stage.index % par.pipeline_degree}"
            )
        previous_end = stage.layer_end
    if par.schedule == "1f1b" and m < par.pipeline_degree:
        raise InputError(f"1F1B needs micro-batches ({m}) >= pipeline stages ({stages})")
    if par.schedule == "interleaved_1f1b":
        rounds = max(1, m // par.pipeline_degree)
        if m % rounds:
            raise InputError(
                f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of "
                f"{rounds} = max(1, micro-batches // pp {par.pipeline_degree})"
            )


@dataclass
class _RankSetup:
    entry_dp_index: int
    is_first: bool
    is_last: bool
    models: list[nn.Module]  # unwrapped stage modules, for gradient names
    schedule: object
    optimizer: torch.optim.Optimizer | MasterWeightAdamW
    tied: TiedGradientSync
    device: torch.device
    split_vocabulary: bool


def _setup(plan: Plan, env: LaunchEnv, seed: int, learning_rate: float) -> _RankSetup:
    entry = check_launch(plan, env)
    check_runnable(plan)
    par = plan.parallelism
    device = init_distributed(env)
    mesh = build_mesh(plan, device, entry)

    my_stages = [s for s in plan.stages if s.pipeline_rank == entry.pipeline_rank]
    my_stages.sort(key=lambda stage: stage.index)
    models, tied = build_stage_models(plan, my_stages, seed)
    tied_sync = TiedGradientSync(
        plan,
        tied,
        {stage.index: model for stage, model in zip(my_stages, models, strict=True)},
        entry,
    )
    spec = get_model_spec(plan.inputs.model.name)
    # The logits are split by vocabulary when tp is (see tensor_parallel): a model without a
    # recognised head gets a plain output, which the loss takes either way.
    split_vocabulary = par.tensor_parallel_degree > 1

    pipeline_stages = []
    for stage, model in zip(my_stages, models, strict=True):
        if par.tensor_parallel_degree > 1:
            apply_tensor_parallel(model, mesh["tp"], spec.tensor_parallel_divisor)
        apply_recompute(model, stage.recompute)
        model.to(device)
        module = wrap_data_parallel(
            model,
            mesh["dp"],
            device,
            shard=par.tensor_parallel_degree > 1,
            pipelined=par.num_stages > 1,
        )
        pipeline_stages.append(
            PipelineStage(module, stage.index, par.num_stages, device, group=mesh["pp"].get_group())
        )

    dp_samples = par.replica_micro_batch_sizes[entry.dp_index] * par.num_micro_batches
    loss_weight = par.data_parallel_degree * dp_samples / plan.inputs.global_batch_size
    schedule_class = get_schedule_class(SCHEDULE_CLASSES[par.schedule])
    loss_fn = loss_function(spec.loss, loss_weight)
    if par.schedule == "interleaved_1f1b":
        schedule = schedule_class(pipeline_stages, par.num_micro_batches, loss_fn=loss_fn)
    else:
        schedule = schedule_class(pipeline_stages[0], par.num_micro_batches, loss_fn=loss_fn)

    params = [p for model in models for p in model.parameters()]
    optimizer = make_optimizer(params, mesh["dp"], par.zero1, learning_rate)
    return _RankSetup(
        entry_dp_index=entry.dp_index,
        is_first=any(stage.index == 0 for stage in my_stages),
        is_last=any(stage.index == par.num_stages - 1 for stage in my_stages),
        models=models,
        schedule=schedule,
        optimizer=optimizer,
        tied=tied_sync,
        device=device,
        split_vocabulary=split_vocabulary,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gradients(models: list[nn.Module]) -> dict[str, torch.Tensor]:
    gathered: dict[str, torch.Tensor] = {}
    for model in models:
        for name, param in model.named_parameters():
            grad = param.grad
            if grad is None:
                continue
            if isinstance(grad, DTensor):
                grad = grad.full_tensor()  # a collective: every tp rank calls it in this order
            gathered[name] = grad.detach().cpu().clone()
    return gathered


def _predicted_peak_memory_bytes(plan: Plan) -> int:
    return max((estimate.total_bytes for estimate in plan.prediction.memory), default=0)


def _as_batch(item: object, step: int, global_batch: int) -> Batch:
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise InputError(f"batch {step} is not an (inputs, targets) pair")
    inputs, targets = item
    tensors = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if targets is None:
        targets = torch.zeros(global_batch)  # a loss without targets; the schedule splits it
    for tensor in (*tensors, targets):
        if tensor.dim() == 0 or tensor.shape[0] != global_batch:
            raise InputError(
                f"batch {step} has a tensor of shape {tuple(tensor.shape)}; the plan's global "
                f"batch is {global_batch} samples (the first dimension)"
            )
    return tensors, targets


def train(
    plan: Plan,
    steps: int,
    batches: Iterable[tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]]
    | None = None,
    *,
    seed: int = 0,
    learning_rate: float = 1e-3,
    on_gradients: GradientHook | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunReport:
    """Train ``plan`` for ``steps`` steps in this process (one rank of the plan's launch).

    ``batches`` yields (inputs, targets) *global* batches, the same on every rank (for example
    a loader seeded alike everywhere): inputs are the model's input (token ids of shape
    ``(global_batch_size, seq_len)`` for the zoo; a tensor or a tuple of tensors), targets the
    loss's (next-token ids; None for a factory model's sum loss). Each replica trains on its own
    rows. Without ``batches``, seeded synthetic data is used (``training_batches``, seed
    ``seed + 1``). The model is initialised from ``seed`` on every rank, and trained with
    AdamW at ``learning_rate``. ``on_gradients`` sees each step's gradients before the update.

    Returns the run report (the same on every rank). The default process group is created if
    absent and left for the caller to destroy.
    """
    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}")
    env = LaunchEnv.from_environ(environ)
    setup = _setup(plan, env, seed, learning_rate)
    par = plan.parallelism
    global_batch = plan.inputs.global_batch_size
    source = iter(batches if batches is not None else training_batches(plan, seed + 1))
    rows = replica_rows(plan, setup.entry_dp_index)
    records: list[StepRecord] = []
    for step in range(steps):
        try:
            inputs, targets = _as_batch(next(source), step, global_batch)
        except StopIteration:
            raise InputError(f"the data ran out after {step} of {steps} steps") from None
        args = tuple(t[rows].to(setup.device) for t in inputs) if setup.is_first else ()
        target = targets[rows].to(setup.device) if setup.is_last else None
        losses: list[torch.Tensor] = []

        setup.optimizer.zero_grad(set_to_none=True)
        _synchronize(setup.device)
        started = time.perf_counter()
        # loss_parallel (vocabulary-split logits) must cover the loss's forward and backward,
        # both of which run inside the schedule's step.
        with loss_context(setup.split_vocabulary):
            setup.schedule.step(*args, target=target, losses=losses)  # type: ignore[attr-defined]
        setup.tied.synchronize()
        _synchronize(setup.device)
        backward_done = time.perf_counter()
        if on_gradients is not None:
            on_gradients(step, _gradients(setup.models))
        optimizer_started = time.perf_counter()
        setup.optimizer.step()
        _synchronize(setup.device)
        schedule_s = backward_done - started
        optimizer_s = time.perf_counter() - optimizer_started

        # Each last-stage replica holds weighted micro-batch losses w_r × mean; their sum over
        # replicas and micro-batches divided by dp × m is the global batch's mean loss.
        # (Tensors live on the device: NCCL reduces only device tensors.)
        share = 0.0
        if setup.is_last and plan.rank_map[dist.get_rank()].tp_index == 0:
            total = sum(float(value.detach().double().sum()) for value in losses)
            share = total / (par.data_parallel_degree * par.num_micro_batches)
        loss_share = torch.tensor([share], dtype=torch.float64, device=setup.device)
        slowest = torch.tensor(
            [schedule_s + optimizer_s, peak_memory_bytes(setup.device), schedule_s, optimizer_s],
            dtype=torch.float64,
            device=setup.device,
        )
        dist.all_reduce(loss_share)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        loss_share, slowest = loss_share.cpu(), slowest.cpu()
        record = StepRecord(
            step=step,
            time_ms=float(slowest[0]) * 1000,
            loss=float(loss_share[0]),
            peak_memory_bytes=int(slowest[1]),
            schedule_time_ms=float(slowest[2]) * 1000,
            optimizer_time_ms=float(slowest[3]) * 1000,
        )
        records.append(record)
        if dist.get_rank() == 0:
            logger.info(
                "step %d: %.1f ms, loss %.6f, peak memory %.1f MiB",
                step,
                record.time_ms,
                record.loss,
                record.peak_memory_bytes / 2**20,
            )
    states = model_state_bytes(setup.models, setup.optimizer)
    return _report(plan, setup.device, records, states)


def _report(
    plan: Plan, device: torch.device, records: list[StepRecord], model_states_bytes: int
) -> RunReport:
    mine = torch.tensor(
        [peak_memory_bytes(device), model_states_bytes], dtype=torch.float64, device=device
    )
    per_rank = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, mine)
    timed = records[1:] if len(records) > 1 else records
    mean_ms = sum(r.time_ms for r in timed) / len(timed)
    tokens = plan.inputs.global_batch_size * plan.inputs.seq_len
    return RunReport(
        plan_summary=plan_summary(plan),
        model=plan.inputs.model.name,
        world_size=dist.get_world_size(),
        backend=dist.get_backend(),
        device_type=device.type,
        global_batch_size=plan.inputs.global_batch_size,
        seq_len=plan.inputs.seq_len,
        steps=records,
        memory_measure="cuda_max_allocated" if device.type == "cuda" else "cpu_max_rss",
        measured_step_time_ms=mean_ms,
        measured_optimizer_time_ms=sum(r.optimizer_time_ms for r in timed) / len(timed),
        predicted_optimizer_time_ms=plan.prediction.breakdown.optimizer_ms,
        predicted_iteration_time_ms=plan.prediction.iteration_time_ms,
        measured_peak_memory_bytes=max(int(t[0]) for t in per_rank),
        predicted_peak_memory_bytes=_predicted_peak_memory_bytes(plan),
        peak_memory_per_rank_bytes=[int(t[0]) for t in per_rank],
        measured_model_state_bytes=max(int(t[1]) for t in per_rank),
        predicted_model_state_bytes=max(
            (
                m.weights_bytes + m.gradients_bytes + m.optimizer_bytes
                for m in plan.prediction.memory
            ),
            default=0,
        ),
        model_state_per_rank_bytes=[int(t[1]) for t in per_rank],
        measured_tokens_per_s=tokens / (mean_ms / 1000) if mean_ms > 0 else 0.0,
        predicted_tokens_per_s=plan.prediction.tokens_per_s,
    )
