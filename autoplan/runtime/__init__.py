"""Run a plan under torchrun: ``python -m autoplan.runtime plan.json --steps N --report PATH``.

The only part of autoplan that imports ``torch.distributed``. Public API: :func:`train` (one
rank's training, with an optional data source and gradient hook) and :class:`RunReport`.
Every executor gets its stage modules from one parallelize step (``parallelize``: tensor,
sequence, context and expert parallelism, recompute, offload, then DDP/FSDP2, in one order).
Uniform plans (one (dp, tp) for every stage) run on PyTorch's own engine (``mesh_executor``:
DeviceMesh, pipelining schedules); any other version-2 plan on per-stage process groups with
the runtime's own stage transfers (``groups_executor``), driven by the same per-rank action
lists as the simulator (``autoplan.schedule``); async_pb plans as a stream without a flush
(``async_executor``).
``train`` is imported on first use, so reading a report (``autoplan.runtime.report``) or
checking a launch (``autoplan.runtime.launch_check``) does not load torch.
"""

from typing import Any

from autoplan.runtime.report import RunReport, StepRecord

__all__ = ["GradientHook", "RunReport", "StepRecord", "plan_summary", "train"]


def __getattr__(name: str) -> Any:
    if name in {"GradientHook", "plan_summary", "train"}:
        from autoplan.runtime import trainer as train_module

        return getattr(train_module, name)
    raise AttributeError(f"module 'autoplan.runtime' has no attribute {name!r}")
