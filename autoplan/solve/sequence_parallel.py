"""Sequence parallelism as a searched per-plan knob.

The model does not let SP be assumed free: it divides the replicated part of every block's
time and memory by t and turns each all-reduce into a reduce-scatter and an all-gather (the
same ring volume and latency steps), but it adds the all-gathers that re-make the
column-split linears' inputs for backward and those at the ends of each stage's run of
blocks (``autoplan.cost.sequence_parallel``): a plan can be slower with it. So the search is
run once per setting (``sequence_parallel_runs``), on a view of the cost model for each
(``CostModel.with_sequence_parallel``), and the candidates merged
(``autoplan.solve.portfolio``): the best of the two runs
is the best of the space with the knob in it. A plan without tp > 1 anywhere is the same
plan either way and is kept with SP off (the validator rejects SP without tp). The second run
is skipped where it cannot differ: the tp is pinned to 1 or no layer splits; where it runs, its
uniform and shared families search only tp > 1 (theirs are one-tp plans: the tp-1 ones are the
first run's, already held; the heterogeneous family mixes tp 1 and tp > 1 stages, so it searches
all). Both runs' quick families (uniform, shared) come first, and each run's heterogeneous
family prunes against the best plan held by then (of either setting), so it explores only what
can beat it. Pinned on, the search runs once per tp > 1 the cluster allows, with that tp
pinned (so a heterogeneous plan mixing tp 1 and tp > 1 stages is not among those it
considers).
"""

from __future__ import annotations

from autoplan.cost.config import PlanConfig
from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import tp_choices

__all__ = ["has_tensor_parallel", "sequence_parallel_runs"]


def has_tensor_parallel(config: PlanConfig) -> bool:
    """Whether some group of ``config`` runs tensor parallel (SP means something)."""
    return any(group.tp > 1 for stage in config.stages for group in stage.groups)


def sequence_parallel_runs(
    model: CostModel, options: SolveOptions
) -> list[tuple[bool, SolveOptions]]:
    """The searches to run on ``model``: (SP setting, options of that run). A
    mixture-of-experts model runs without SP (the runtime's router does not take a
    sequence-sharded stream)."""
    if expert_counts(model.profile):
        if options.sequence_parallel:
            raise InputError(
                "--sp: sequence parallelism is not run on mixture-of-experts models; use --no-sp"
            )
        return [(False, options)]
    if options.sequence_parallel is False:
        return [(False, options)]
    if options.sequence_parallel:
        # Pinned on: only plans with tp > 1 mean it; one run per such tp.
        return [
            (True, options.model_copy(update={"tp": t}))
            for t in tp_choices(model, options)
            if t > 1
        ]
    splittable = any(layer.tensor_parallel is not None for layer in model.profile.layers)
    if options.tp == 1 or not splittable:
        return [(False, options)]
    return [(False, options), (True, options)]
