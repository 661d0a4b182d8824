"""The best plan a target launcher can run, and what that restriction costs.

Every target runs one (pp, dp, tp) grid (``expressible``): that is the solver's family of
uniform pipelines (``autoplan.solve.uniform``, exact; not the single-stage plans with uneven
shares that ``--space uniform`` adds). Within it each target pins what it needs (one
recompute mode for every stage; DeepSpeed: an even split, 1F1B, tp 1 when pipelined): its
``restrictions`` list the searches whose best plans together cover what it runs. Each
search's candidates are visited best first and the first one the target exports is its
answer; the fastest answer, or the plan itself when the target runs it and it is no slower,
is the best.

The original plan's pins are not carried over: the question is what the target can do on this
cluster with this profile and batch. The plan's own efficiency overrides and reserve are not
recorded in it, so the re-solve uses the catalog's; a ratio below 1 means the plan was pinned,
a baseline, cut short by its time limit, or solved with other overrides.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from autoplan.errors import AutoplanError, InfeasibleError
from autoplan.export import EXPORTERS, NotExpressibleError, export_plan
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.profile.schema import Profile
from autoplan.solve import cost_model
from autoplan.solve.emit import emit_plan
from autoplan.solve.options import SolveOptions
from autoplan.solve.uniform import uniform_search

__all__ = ["BestExpressible", "best_expressible"]

logger = logging.getLogger(__name__)


class BestExpressible(BaseModel):
    """The best plan a target runs beside the plan it replaces."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    plan: Plan = Field(description="The best plan the target runs (maybe the original).")
    is_original: bool = Field(description="The original plan was already the best of them.")
    original_ms: float = Field(gt=0, description="The original plan's predicted iteration.")
    iteration_ms: float = Field(gt=0, description="The chosen plan's predicted iteration.")
    solves: int = Field(ge=0, description="Restricted solves run.")
    timed_out: bool = Field(description="A solve stopped at its time limit (not proven best).")

    @property
    def ratio(self) -> float:
        """Iteration time of the chosen plan over the original's (> 1: the restriction costs)."""
        return self.iteration_ms / self.original_ms


def _solve_expressible(
    plan: Plan,
    profile: Profile,
    profile_sha256: str,
    target: str,
    options: SolveOptions,
) -> tuple[Plan | None, str | None, bool]:
    """The best plan of one restricted search that the target exports, why the best feasible
    candidate could not be exported when none could (None: none was feasible), and whether the
    search timed out."""
    cluster = plan.inputs.cluster
    batch = plan.inputs.global_batch_size
    model = cost_model(profile, cluster, options)
    result = uniform_search(model, batch, options)
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256=profile_sha256,
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=cluster,
        global_batch_size=batch,
        strategy="optimal",
        pinned=options.pinned(),
    )
    kinds = [layer.kind for layer in profile.layers]
    reason = None
    for candidate in result.candidates:
        if not candidate.cost.feasible:
            continue
        try:
            found = emit_plan(model, candidate.config, candidate.cost, inputs, [])
        except ValueError:  # does not fit the nodes: the solver's problem, not the target's
            continue
        try:
            export_plan(found, target, kinds)
        except NotExpressibleError as error:
            reason = reason or error.part
            continue
        return found, None, result.timed_out
    return None, reason, result.timed_out


def best_expressible(
    plan: Plan,
    profile: Profile,
    profile_sha256: str,
    target: str,
    time_limit_s: float = 60.0,
) -> BestExpressible:
    """The fastest plan ``target`` can run for the plan's profile, cluster and batch (module
    docstring), the plan itself included when the target runs it.

    ``profile`` must be the one the plan was solved from (the caller checks its SHA-256).
    Raises InfeasibleError when no plan the target runs fits."""
    exporter = EXPORTERS[target]
    kinds = [layer.kind for layer in profile.layers]
    best: Plan | None = None
    is_original = False
    try:
        export_plan(plan, target, kinds)
        best, is_original = plan, True
    except NotExpressibleError:
        pass
    base = SolveOptions(space="uniform", time_limit_s=time_limit_s)
    reasons: list[str] = []
    solves, timed_out = 0, False
    for options in exporter.restrictions(len(profile.layers), base):
        solves += 1
        try:
            found, reason, stopped = _solve_expressible(
                plan, profile, profile_sha256, target, options
            )
        except AutoplanError as error:  # this restriction leaves nothing feasible
            logger.info("restricted solve %s: %s", options.pinned(), error)
            reasons.append(str(error))
            continue
        timed_out = timed_out or stopped
        if reason is not None:
            reasons.append(reason)
        if found is None:
            continue
        if best is None or (found.prediction.iteration_time_ms < best.prediction.iteration_time_ms):
            best, is_original = found, False
    if best is None:
        why = reasons[0] if reasons else "none of them fits in memory on this cluster"
        raise InfeasibleError(f"no plan that {exporter.launcher} can run was found: {why}")
    if timed_out:
        logger.warning(
            "a restricted solve hit its time limit: the %s plan is the best found, not proven "
            "optimal",
            target,
        )
    return BestExpressible(
        target=target,
        plan=best,
        is_original=is_original,
        original_ms=plan.prediction.iteration_time_ms,
        iteration_ms=best.prediction.iteration_time_ms,
        solves=solves,
        timed_out=timed_out,
    )
