"""Checkpoints of a run with ``torch.distributed.checkpoint`` (DCP): save every N steps,
resume, and resume into another plan of the same model.

What is saved, keyed by the parameter names of the whole model (every executor keeps them:
``model_stage``), so that the keys do not depend on the plan:

- ``model.<name>``: each stage's ``state_dict()`` entries (DTensors where tensor parallel or
  FSDP2 shard them; DCP stores their global shape and each rank's chunks);
- ``optim.<name>.<state>``: AdamW's ``step``, ``exp_avg`` and ``exp_avg_sq`` of every
  parameter, and its fp32 ``master`` copy where the weights are 16-bit, from whichever rank
  holds them (a replica's own optimizer, or the ZeRO-1 owner of that parameter). A weight tied
  across stages is saved under each of its names.
- The routed experts of a mixture-of-experts layer (``GroupedExperts``: one (experts, ·, ·)
  tensor of which expert parallelism keeps a block of rows per rank) are saved one key per
  expert, ``model.<name>.expert<j>`` and ``optim.<name>.<state>.expert<j>`` by the global expert
  index j, so that the keys are the same whatever block each rank holds (ep 1, 2, ...).
- ``loss_scale.*``: an fp16 run's dynamic loss scale (its value and step counters), the same
  on every rank.

Replicas save the same keys and DCP writes each once. Loading asks for this rank's keys under
*its* plan: DCP reads the chunks each tensor needs from whatever the saving ranks wrote, which
is the resharding (another pp split, dp, tp or ZeRO layout) that DCP exists for.

On disk: ``DIR/step-00000004/`` holds DCP's files and ``autoplan-checkpoint.json``
(``CheckpointInfo``). A checkpoint is written to ``DIR/.step-00000004.partial/`` first and
renamed to its step's name only when every rank has written and the info is in it: a folder
named ``step-*`` is complete, a crash mid-save leaves the last good one as it was, and an
existing step folder is never written over.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.optim import ZeroRedundancyOptimizer

from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.runtime.executor_protocol import Executor, Optimizer
from autoplan.runtime.mixed_precision import DynamicLossScale, MasterWeightAdamW
from autoplan.zoo.moe import GroupedExperts

__all__ = [
    "CHECKPOINT_FORMAT_VERSION",
    "INFO_NAME",
    "CheckpointConfig",
    "CheckpointInfo",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "step_dir",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT_VERSION = 1
INFO_NAME = "autoplan-checkpoint.json"
_PREFIX = "step-"


class CheckpointInfo(BaseModel):
    """What a checkpoint holds, written beside DCP's files; a resume checks it first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = Field(
        default=CHECKPOINT_FORMAT_VERSION, description="Version of this layout."
    )
    step: int = Field(ge=1, description="Training steps done when it was saved.")
    model: str = Field(description="The plan's model name.")
    dtype: str = Field(description="The weights' dtype (bf16, fp32, ...).")
    global_batch_size: int = Field(ge=1, description="Samples per step.")
    seq_len: int = Field(ge=1, description="Tokens per sample.")
    plan_summary: str = Field(description="The saving plan's shape (trainer.plan_summary).")
    world_size: int = Field(ge=1, description="Processes of the saving run.")
    seed: int = Field(description="Seed of the weights and of the data order.")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and when a run saves, and whether it starts from the latest checkpoint there."""

    directory: Path
    save_every_steps: int | None = None
    """Save after every this many steps (and after the last); None: after the last only."""
    resume: bool = False
    """Start from the latest complete checkpoint in ``directory`` (from scratch if none)."""

    def __post_init__(self) -> None:
        if self.save_every_steps is not None and self.save_every_steps < 1:
            raise InputError(f"--save-every must be >= 1 step; got {self.save_every_steps}")

    def saves_after(self, step: int, last: int) -> bool:
        """Whether the run saves once ``step`` steps are done (``last``: the run's final)."""
        every = self.save_every_steps
        return step == last or (every is not None and step % every == 0)


def step_dir(directory: Path, step: int) -> Path:
    """The folder of the checkpoint after ``step`` steps."""
    return directory / f"{_PREFIX}{step:08d}"


def latest_checkpoint(directory: Path) -> tuple[Path, CheckpointInfo] | None:
    """The complete checkpoint of the most steps in ``directory``, or None."""
    if not directory.is_dir():
        return None
    found = [
        path
        for path in directory.iterdir()
        if path.is_dir()
        and path.name.startswith(_PREFIX)
        and path.name[len(_PREFIX) :].isdigit()
        and (path / INFO_NAME).is_file()
    ]
    if not found:
        return None
    path = max(found, key=lambda p: int(p.name[len(_PREFIX) :]))
    return path, read_json_model(path / INFO_NAME, CheckpointInfo)


def check_compatible(info: CheckpointInfo, plan: Plan, path: Path) -> None:
    """Refuse a checkpoint of another model, dtype or batch (a plan may differ otherwise)."""
    ours = {
        "model": plan.inputs.model.name,
        "dtype": plan.inputs.dtype,
        "global batch": plan.inputs.global_batch_size,
        "sequence length": plan.inputs.seq_len,
    }
    theirs = {
        "model": info.model,
        "dtype": info.dtype,
        "global batch": info.global_batch_size,
        "sequence length": info.seq_len,
    }
    for what, value in ours.items():
        if theirs[what] != value:
            raise InputError(
                f"checkpoint {printable(str(path))} is of {what} {theirs[what]}; this plan's is "
                f"{value} (a checkpoint resumes into plans of the same model, dtype and batch)"
            )
    if info.format_version != CHECKPOINT_FORMAT_VERSION:
        raise InputError(
            f"checkpoint {printable(str(path))} has layout version {info.format_version}; this "
            f"autoplan reads version {CHECKPOINT_FORMAT_VERSION}"
        )


# The state -----------------------------------------------------------------------------


def _inner_adamw(optimizer: Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer that holds the states (AdamW over this rank's own parameters)."""
    inner: torch.optim.Optimizer
    if isinstance(optimizer, MasterWeightAdamW):
        inner = optimizer.inner
    elif isinstance(optimizer, ZeroRedundancyOptimizer):
        inner = optimizer.optim  # ZeRO-1: the AdamW of the parameters this rank owns
    else:
        inner = optimizer
    if not isinstance(inner, torch.optim.AdamW):
        raise InputError(
            f"checkpoints save AdamW states; this run's optimizer is {type(inner).__name__}"
        )
    return inner


def _owned(optimizer: Optimizer) -> Iterator[tuple[nn.Parameter, nn.Parameter]]:
    """(model parameter, the tensor its AdamW steps) of each parameter this rank updates: the
    parameter itself, or its fp32 master copy."""
    if isinstance(optimizer, MasterWeightAdamW):
        # masters[i] is the master of params[_owned[i]] (the ZeRO-1 share of this rank).
        for master, index in zip(optimizer.masters, optimizer._owned, strict=True):
            yield optimizer.params[index], master
        return
    for group in _inner_adamw(optimizer).param_groups:
        for param in group["params"]:
            yield param, param


def _names(model: nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return names


def _initialise_states(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh AdamW its states (to load into) without moving a weight: one step at
    learning rate 0 on zero gradients."""
    if optimizer.state:
        return
    learning_rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    for group, learning_rate in zip(optimizer.param_groups, learning_rates, strict=True):
        group["lr"] = learning_rate
        for param in group["params"]:
            param.grad = None


def _expert_rows(model: nn.Module) -> dict[str, tuple[int, int]]:
    """(first global expert, experts held) of each routed-expert parameter, by name."""
    rows: dict[str, tuple[int, int]] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, GroupedExperts):
            for name, _ in module.named_parameters(recurse=False):
                full = f"{prefix}.{name}" if prefix else name
                rows[full] = (module.first_expert, module.num_local_experts)
    return rows


def _put(
    state: dict[str, torch.Tensor],
    key: str,
    tensor: torch.Tensor,
    experts: tuple[int, int] | None,
    for_loading: bool,
) -> None:
    """``state[key] = tensor``, or one key per expert row of a routed-expert tensor: views to
    load into, copies to save (a view would save its whole storage)."""
    if experts is None or tensor.dim() == 0:
        state[key] = tensor
        return
    first, count = experts
    if tensor.shape[0] != count:
        raise RuntimeError(f"{key}: {tensor.shape[0]} expert rows, expected {count}")
    for row in range(count):
        state[f"{key}.expert{first + row}"] = tensor[row] if for_loading else tensor[row].clone()


def training_state(engine: Executor, *, for_loading: bool = False) -> dict[str, torch.Tensor]:
    """This rank's model and optimizer tensors by checkpoint key (module docstring); with
    ``for_loading`` a fresh optimizer's states are created first, to be loaded into."""
    if len(engine.optimizers) != len(engine.models):
        raise InputError("checkpoints need one optimizer per stage module (this executor has not)")
    state: dict[str, torch.Tensor] = {}
    for model, optimizer in zip(engine.models, engine.optimizers, strict=True):
        experts = _expert_rows(model)
        for name, tensor in model.state_dict().items():
            _put(state, f"model.{name}", tensor, experts.get(name), for_loading)
        inner = _inner_adamw(optimizer)
        if for_loading:
            _initialise_states(inner)
        names = _names(model)
        for param, stepped in _owned(optimizer):
            values = dict(inner.state[stepped])
            if stepped is not param:
                values["master"] = stepped.data
            for name in names[id(param)]:
                for key, value in values.items():
                    if isinstance(value, torch.Tensor):
                        # The step count is one per parameter; the rest is per expert row.
                        rows = None if key == "step" else experts.get(name)
                        _put(state, f"optim.{name}.{key}", value, rows, for_loading)
    return state


# Saving and loading ----------------------------------------------------------------------


_SCALE_FIELDS = ("value", "clean_steps", "skipped_steps")


def _scale_state(loss_scale: DynamicLossScale | None) -> dict[str, torch.Tensor]:
    if loss_scale is None:
        return {}
    return {
        f"loss_scale.{field}": torch.tensor(float(getattr(loss_scale, field)), dtype=torch.float64)
        for field in _SCALE_FIELDS
    }


def save_checkpoint(
    config: CheckpointConfig,
    step: int,
    engine: Executor,
    info: CheckpointInfo,
    loss_scale: DynamicLossScale | None = None,
) -> Path:
    """Save the state after ``step`` steps (collective: every rank calls it) to
    ``step_dir(config.directory, step)``; returns that folder."""
    final = step_dir(config.directory, step)
    partial = config.directory / f".{final.name}.partial"
    is_coordinator = dist.get_rank() == 0
    problem = ""
    if is_coordinator:
        if final.exists():
            problem = f"checkpoint {printable(str(final))} exists already; it is not written over"
        else:
            # A partial folder is what a crash mid-save left: never a good checkpoint.
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
    # Every rank learns of a refusal before any of them writes (one line, not a hang).
    verdict = [problem]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        raise InputError(verdict[0])
    dcp.save({**training_state(engine), **_scale_state(loss_scale)}, checkpoint_id=partial)
    if is_coordinator:
        write_json_model(partial / INFO_NAME, info)
        partial.rename(final)
        logger.info("saved step %d to %s", step, final)
    dist.barrier()  # the checkpoint is complete for every rank once any rank goes on
    return final


def load_checkpoint(
    path: Path, engine: Executor, loss_scale: DynamicLossScale | None = None
) -> None:
    """Load ``path`` into this rank's modules and optimizers (collective), resharded to this
    rank's plan, and an fp16 run's loss scale."""
    scale = _scale_state(loss_scale)
    state = {**training_state(engine, for_loading=True), **scale}
    try:
        dcp.load(state, checkpoint_id=path)
    except CheckpointException as error:
        # DCP gathers each rank's failure (a missing key, a shape that does not match): the
        # first one's message names the key.
        causes = [failure[0] for failure in error.failures.values()]
        first = (str(causes[0]) if causes else str(error)).strip().splitlines() or ["?"]
        raise InputError(
            f"checkpoint {printable(str(path))} does not fit this plan's model: {first[0][:300]}"
        ) from None
    if loss_scale is not None:
        loss_scale.value = float(scale["loss_scale.value"])
        loss_scale.clean_steps = int(scale["loss_scale.clean_steps"])
        loss_scale.skipped_steps = int(scale["loss_scale.skipped_steps"])
    logger.info("resumed from %s", path)


def resume_step(config: CheckpointConfig, plan: Plan) -> tuple[int, Path | None]:
    """The steps done at the checkpoint a run starts from (0, None when it starts afresh),
    decided by rank 0 and the same on every rank (collective). Without ``resume`` a folder
    that holds checkpoints already is refused: a run would mix its steps with theirs."""
    answer: list[tuple[int, str | None, str] | None] = [None]
    if dist.get_rank() == 0:
        latest = latest_checkpoint(config.directory)
        if latest is None:
            answer = [(0, None, "")]
        elif not config.resume:
            answer = [
                (
                    0,
                    None,
                    f"--checkpoint-dir {printable(str(config.directory))} holds checkpoints "
                    f"(the latest after {latest[1].step} steps): pass --resume to continue from "
                    "it, or give another folder",
                )
            ]
        else:
            try:
                check_compatible(latest[1], plan, latest[0])
                answer = [(latest[1].step, str(latest[0]), "")]
            except InputError as error:
                answer = [(0, None, str(error))]
    dist.broadcast_object_list(answer, src=0)
    decided = answer[0]
    if decided is None:  # rank 0 always answers: a broken process group would have raised
        raise RuntimeError("rank 0 sent no checkpoint decision")
    step, path, problem = decided
    if problem:
        raise InputError(problem)
    return step, None if path is None else Path(path)
