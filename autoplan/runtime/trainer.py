"""Train a plan: check it, set up this rank's executor, run the steps, report.

The public entry point is :func:`train`. Per rank it

1. checks the launch against the plan and the plan itself (``check_runnable``), and on CUDA
   that this rank's GPU is the plan's type for it (``device_check``), before any process group;
2. joins the default group (NCCL on CUDA, gloo on CPU);
3. sets up an executor over the modules of the parallelize step (``parallelize``):
   ``mesh_executor`` for a uniform plan (one (pp, dp, tp) DeviceMesh, torch's pipelining),
   ``groups_executor`` for any other (per-stage process groups and the runtime's own stage
   transfers, driven by the same per-rank action lists the simulator plays),
   ``async_executor`` for async_pb;
4. runs each step (forward, backward and gradient sync, then the optimizers), and logs and
   reports its time, loss and peak memory;
5. with a ``CheckpointConfig``, starts from the latest checkpoint and saves every N steps
   (``checkpoint``); with a ``TokenSource``, reads its replicas' samples of a token file
   (``token_data``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.errors import InputError
from autoplan.plan.schema import Plan
from autoplan.runtime.check import check_runnable
from autoplan.runtime.checkpoint import (
    CheckpointConfig,
    CheckpointInfo,
    load_checkpoint,
    resume_step,
    save_checkpoint,
)
from autoplan.runtime.data import Batch, training_batches
from autoplan.runtime.device_check import check_device
from autoplan.runtime.executor_protocol import Executor, RankSetup
from autoplan.runtime.launch_check import LaunchEnv, check_launch
from autoplan.runtime.memory import model_state_bytes, peak_memory_bytes
from autoplan.runtime.mixed_precision import DynamicLossScale, MasterWeightAdamW
from autoplan.runtime.report import RunReport, StepRecord, predicted_memory_of_rank
from autoplan.runtime.token_data import TokenSource, open_token_batches
from autoplan.runtime.world import init_distributed, local_device
from autoplan.zoo.dtypes import set_matmul_precision

__all__ = [
    "ExecutorChoice",
    "GradientHook",
    "check_runnable",
    "plan_summary",
    "select_executor",
    "train",
]

logger = logging.getLogger(__name__)

GradientHook = Callable[[int, dict[str, torch.Tensor]], None]
"""Called on every rank after each step's backward, before the optimizer: (step, gradients of
this rank's stage parameters by name, tensor-parallel shards gathered to full tensors)."""

ExecutorChoice = Literal["auto", "mesh", "groups"]


def plan_summary(plan: Plan) -> str:
    """The plan's knobs in one line: 'pp=2 dp=1 tp=1 m=4 mbs=[2] 1f1b layers=[3, 3]' for a
    uniform plan; else each stage's replicas as tp×share, e.g. 'stages=[1×1+1×1 | 2×2]'."""
    par = plan.parallelism
    layers = [stage.layer_end - stage.layer_start for stage in plan.stages]
    virtual = f" v={par.virtual_stages_per_rank}" if par.virtual_stages_per_rank > 1 else ""
    zero1 = [stage.index for stage in plan.stages if stage.zero1]
    uniform = plan.uniform_shape()
    if uniform is not None:
        shape = f"dp={uniform[0]} tp={uniform[1]}{virtual} m={par.num_micro_batches} "
        shape += f"mbs={plan.stages[0].shares}"
        zero = " zero1" if zero1 and len(zero1) == len(plan.stages) else ""
    else:
        replicas = " | ".join(
            "+".join(f"{r.tensor_parallel_degree}×{r.micro_batch_size}" for r in stage.replicas)
            for stage in plan.stages
        )
        shape = f"{virtual.strip()} m={par.num_micro_batches} mbs={par.micro_batch_size} "
        shape = shape.strip() + f" stages=[{replicas}]"
        zero = ""
    if zero1 and not zero:
        zero = f" zero1={zero1}"
    return f"pp={par.pipeline_degree} {shape} {par.schedule} layers={layers}{zero}"


def select_executor(plan: Plan, choice: ExecutorChoice = "auto") -> Literal["mesh", "groups"]:
    """Under 'auto', the executor the plan is priced for where it records one, else 'mesh'
    for a plan one DeviceMesh holds and 'groups' for any other; an explicit choice is kept
    ('mesh' refused for a plan one DeviceMesh cannot hold)."""
    # Expert parallelism runs on the groups executor's per-stage groups only.
    experts = any(stage.expert_parallel_degree > 1 for stage in plan.stages)
    if choice == "mesh" and experts:
        raise InputError("the mesh executor runs no expert parallelism: use the groups executor")
    # Context parallelism runs on the mesh executor only (its (pp, dp, cp, tp) mesh).
    context = any(r.context_parallel_degree > 1 for s in plan.stages for r in s.replicas)
    if context and (choice == "groups" or plan.mesh_shape() is None or experts):
        raise InputError(
            "context parallelism runs on the mesh executor: every stage needs the same dp "
            "replicas of cp × tp GPUs on ranks in (pp, dp, cp, tp) order, without experts"
        )
    if choice == "auto":
        # The executor the plan is priced for (``Parallelism.executor``); context parallelism
        # runs on the mesh only, where its all-reduce hides: never slower than priced.
        recorded = plan.parallelism.executor
        if recorded == "groups" and not context:
            return "groups"
        return "mesh" if plan.runs_on_mesh() else "groups"
    if choice == "mesh" and plan.mesh_shape() is None:
        raise InputError(
            "the mesh executor needs every stage to have the same replicas (dp, tp, shares) on "
            "ranks in (pp, dp, tp) order; this plan's differ: use the groups executor"
        )
    if choice not in ("mesh", "groups"):
        raise InputError(f"executor must be 'auto', 'mesh' or 'groups'; got {choice!r}")
    return choice


def _engine(
    plan: Plan,
    env: LaunchEnv,
    seed: int,
    learning_rate: float,
    choice: ExecutorChoice,
    loss_scale: DynamicLossScale | None,
) -> Executor:
    entry = check_launch(plan, env)
    check_runnable(plan)
    asynchronous = plan.parallelism.schedule == "async_pb"
    kind = "groups" if asynchronous else select_executor(plan, choice)
    device = local_device(env)
    check_device(plan, entry, device)
    init_distributed(env, device)
    setup = RankSetup(plan, entry, device, seed, learning_rate, loss_scale)
    if asynchronous:  # no flush, a step per micro-batch: its own executor
        if loss_scale is not None:
            raise InputError(
                "async_pb steps momentum SGD per micro-batch and has no loss scaling: "
                "train it in bf16 or fp32, not fp16"
            )
        from autoplan.runtime.async_executor import AsyncExecutor

        return AsyncExecutor(setup)  # type: ignore[return-value]
    if kind == "mesh":
        from autoplan.runtime.mesh_executor import MeshExecutor

        return MeshExecutor(setup)
    from autoplan.runtime.groups_executor import GroupsExecutor

    return GroupsExecutor(setup)


def _scaled_step(engine: Executor, loss_scale: DynamicLossScale, share: float, step: int) -> float:
    """The optimizers' step of an fp16 plan: skipped on every rank when a gradient of any rank
    is not finite, else with the gradients divided by the loss scale in fp32; the scale then
    moves. Returns this rank's loss part without the scale."""
    scale = loss_scale.value
    finite = loss_scale.check(engine.models, engine.device)
    if finite:
        for optimizer in engine.optimizers:
            if isinstance(optimizer, MasterWeightAdamW):
                optimizer.grad_scale = scale
                optimizer.step()
            else:  # fp32 parameters of an fp16 plan: unscale their gradients here
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        if param.grad is not None:
                            param.grad.div_(scale)
                optimizer.step()
    elif not dist.is_initialized() or dist.get_rank() == 0:
        logger.warning("step %d skipped: gradients not finite at loss scale %g", step, scale)
    loss_scale.update(finite)
    return share / scale


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
    executor: ExecutorChoice = "auto",
    data: TokenSource | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> RunReport:
    """Train ``plan`` until ``steps`` steps are done, in this process (one rank of the plan's
    launch).

    ``batches`` yields (inputs, targets) *global* batches, the same on every rank (for example
    a loader seeded alike everywhere): inputs are the model's input (token ids of shape
    ``(global_batch_size, seq_len)`` for the zoo; a tensor or a tuple of tensors), targets the
    loss's (next-token ids; None for a factory model's sum loss). Each replica trains on its own
    rows. ``data`` instead names a token file, of which each rank reads its replicas' rows
    (``token_data``; order seeded by ``seed + 1``). Without either, seeded synthetic data is
    used (``training_batches``, seed ``seed + 1``). The model is initialised from ``seed`` on
    every rank, and trained with AdamW at ``learning_rate``. ``on_gradients`` sees each step's
    gradients before the update. ``executor`` picks the mesh or groups executor ('auto': mesh
    for uniform plans); ``environ`` replaces ``os.environ`` as the source of torchrun's
    variables.

    ``checkpoint`` saves the model and optimizer states with DCP every N steps and after the
    last, and with ``resume`` starts from the latest checkpoint in its folder, which any plan
    of the same model, dtype and batch may have written: ``steps`` then counts from the start
    of training, and the data goes on from the checkpoint's step (a ``batches`` iterable is
    advanced past the steps done).

    Returns the run report (the same on every rank). The default process group is created if
    absent and left for the caller to destroy.
    """
    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}")
    if batches is not None and data is not None:
        raise InputError("give train() batches or a token file (data), not both")
    env = LaunchEnv.from_environ(environ).in_plan(plan)
    # The plan was costed for this matmul precision (tf32: TF32 tensor cores for fp32 matmuls).
    set_matmul_precision(plan.inputs.dtype)
    # The file and the options are checked before any process group forms.
    if data is not None:
        open_token_batches(plan, data, seed + 1, env.rank)
    if checkpoint is not None and plan.parallelism.schedule == "async_pb":
        raise InputError(
            "schedule async_pb keeps no step states to checkpoint (its optimizer updates per "
            "micro-batch); run it without --checkpoint-dir"
        )
    # fp16's range needs the loss scaled (autoplan.runtime.mixed_precision); bf16's does not.
    loss_scale = DynamicLossScale() if plan.inputs.dtype == "fp16" else None
    engine = _engine(plan, env, seed, learning_rate, executor, loss_scale)
    global_batch = plan.inputs.global_batch_size
    start = 0
    if checkpoint is not None:
        start, resume_from = resume_step(checkpoint, plan)
        if resume_from is not None:
            load_checkpoint(resume_from, engine, loss_scale)
        if start >= steps:
            raise InputError(
                f"the checkpoint is at step {start} already; --steps {steps} counts from the "
                "start of training: give more steps"
            )
    source: Iterator[tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]]
    if data is not None:
        source = open_token_batches(plan, data, seed + 1, env.rank, start)
    else:
        given = batches if batches is not None else training_batches(plan, seed + 1)
        source = itertools.islice(given, start, None)  # the steps done read theirs already
    if engine.name == "async":
        return _train_async(plan, engine, steps, source, on_gradients)
    records: list[StepRecord] = []
    for step in range(start, steps):
        try:
            inputs, targets = _as_batch(next(source), step, global_batch)
        except StopIteration:
            raise InputError(f"the data ran out after {step} of {steps} steps") from None
        for optimizer in engine.optimizers:
            optimizer.zero_grad(set_to_none=True)
        _synchronize(engine.device)
        started = time.perf_counter()
        share = engine.run(inputs, targets)
        _synchronize(engine.device)
        backward_done = time.perf_counter()
        if on_gradients is not None:
            on_gradients(step, _gradients(engine.models))
        optimizer_started = time.perf_counter()
        if loss_scale is None:
            for optimizer in engine.optimizers:
                optimizer.step()
        else:
            share = _scaled_step(engine, loss_scale, share, step)
        _synchronize(engine.device)
        schedule_s = backward_done - started
        optimizer_s = time.perf_counter() - optimizer_started

        # The ranks' loss parts add up to the global batch's mean loss. (Tensors live on the
        # device: NCCL reduces only device tensors.)
        loss_share = torch.tensor([share], dtype=torch.float64, device=engine.device)
        slowest = torch.tensor(
            [schedule_s + optimizer_s, peak_memory_bytes(engine.device), schedule_s, optimizer_s],
            dtype=torch.float64,
            device=engine.device,
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
        if checkpoint is not None and checkpoint.saves_after(step + 1, steps):
            info = _checkpoint_info(plan, step + 1, seed)
            save_checkpoint(checkpoint, step + 1, engine, info, loss_scale)
    states = model_state_bytes(engine.models, engine.optimizers, engine.data_parallel_modules)
    return _report(plan, engine, records, states)


def _checkpoint_info(plan: Plan, step: int, seed: int) -> CheckpointInfo:
    return CheckpointInfo(
        step=step,
        model=plan.inputs.model.name,
        dtype=plan.inputs.dtype,
        global_batch_size=plan.inputs.global_batch_size,
        seq_len=plan.inputs.seq_len,
        plan_summary=plan_summary(plan),
        world_size=plan.world_size,
        seed=seed,
    )


def _train_async(
    plan: Plan,
    engine: Executor,
    steps: int,
    source: Iterator[object],
    on_gradients: GradientHook | None,
) -> RunReport:
    """The async_pb plan's steps as one stream without a flush (``async_executor``)."""
    if on_gradients is not None:
        raise InputError("schedule async_pb steps per micro-batch: it has no step gradients")
    global_batch = plan.inputs.global_batch_size
    batches: list[Batch] = []
    for step in range(steps):
        try:
            batches.append(_as_batch(next(source), step, global_batch))
        except StopIteration:
            raise InputError(f"the data ran out after {step} of {steps} steps") from None
    records = engine.train(batches)  # type: ignore[attr-defined]
    return _report(plan, engine, records, engine.model_state_bytes())  # type: ignore[attr-defined]


def _report(
    plan: Plan, engine: Executor, records: list[StepRecord], model_states_bytes: int
) -> RunReport:
    device = engine.device
    mine = torch.tensor(
        [peak_memory_bytes(device), model_states_bytes], dtype=torch.float64, device=device
    )
    per_rank = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(per_rank, mine)
    timed = records[1:] if len(records) > 1 else records
    mean_ms = sum(r.time_ms for r in timed) / len(timed)
    tokens = plan.inputs.global_batch_size * plan.inputs.seq_len
    estimates = [predicted_memory_of_rank(plan, rank) for rank in range(plan.world_size)]
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
        predicted_peak_memory_per_rank_bytes=[e.total_bytes if e else 0 for e in estimates],
        predicted_model_state_per_rank_bytes=[
            e.weights_bytes + e.gradients_bytes + e.optimizer_bytes if e else 0 for e in estimates
        ],
        measured_tokens_per_s=tokens / (mean_ms / 1000) if mean_ms > 0 else 0.0,
        predicted_tokens_per_s=plan.prediction.tokens_per_s,
        executor=engine.name,  # type: ignore[arg-type]
    )
