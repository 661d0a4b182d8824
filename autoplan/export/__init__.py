"""``export``: a plan as another launcher's own configuration (Megatron-LM, torchtitan, DeepSpeed).

Each target's module writes its launcher's arguments or config file from a plan and refuses,
in one line naming the part, a plan its launcher cannot run (``expressible`` holds the checks
every target shares: one (pp, dp, tp) grid of ranks). ``best_expressible`` re-solves within
what a target runs and reports what that restriction costs. Torch-free, like the solve path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoplan.errors import InputError
from autoplan.export import deepspeed, megatron, torchtitan
from autoplan.export.expressible import (
    ExportResult,
    NotExpressibleError,
    PlanShape,
    layer_kinds,
    plan_shape,
)
from autoplan.plan.schema import Plan
from autoplan.profile.schema import LayerKind
from autoplan.solve.options import SolveOptions

__all__ = [
    "EXPORTERS",
    "ExportResult",
    "Exporter",
    "NotExpressibleError",
    "PlanShape",
    "export_plan",
    "layer_kinds",
    "plan_shape",
]


@dataclass(frozen=True)
class Exporter:
    """One target: how it writes a plan, what file it writes, and which solves cover the plans
    it can run (for ``best_expressible``)."""

    name: str
    launcher: str
    file_kind: str
    export: Callable[[Plan, list[LayerKind] | None, str], ExportResult]
    restrictions: Callable[[int, SolveOptions], list[SolveOptions]]


EXPORTERS: dict[str, Exporter] = {
    megatron.TARGET: Exporter(
        megatron.TARGET,
        "Megatron-LM",
        "bash array of arguments",
        megatron.export_megatron,
        megatron.restrictions,
    ),
    torchtitan.TARGET: Exporter(
        torchtitan.TARGET,
        "torchtitan",
        "TOML job config sections",
        torchtitan.export_torchtitan,
        torchtitan.restrictions,
    ),
    deepspeed.TARGET: Exporter(
        deepspeed.TARGET,
        "DeepSpeed",
        "config JSON",
        deepspeed.export_deepspeed,
        deepspeed.restrictions,
    ),
}


def export_plan(
    plan: Plan, target: str, kinds: list[LayerKind] | None, source: str = "the plan"
) -> ExportResult:
    """``target``'s configuration for ``plan`` (``kinds``: each layer's kind, see
    ``layer_kinds``; ``source`` names the plan in the file's comments).

    Raises NotExpressibleError naming the part of the plan the target cannot run."""
    exporter = EXPORTERS.get(target)
    if exporter is None:
        raise InputError(f"unknown export target {target!r} (one of {', '.join(EXPORTERS)})")
    return exporter.export(plan, kinds, source)
