"""Sequence parallelism as a searched knob: per stage in the uniform and heterogeneous
families, per plan in the shared single-stage one.

The model does not let SP be assumed free: it divides the replicated part of every block's
time and memory by t and turns each all-reduce into a reduce-scatter and an all-gather (the
same ring volume and latency steps), but it adds the all-gathers that re-make the
column-split linears' inputs for backward and those at the ends of each stage's run of
blocks (``autoplan.cost.sequence_parallel``): a stage can be slower with it, or fit only
with it. And it is local to a stage: the boundary transfer between two stages is the whole
activation either way, so one stage's setting changes no other stage's cost
(``CostModel.evaluate`` costs each stage with its own, ``StageChoice.sequence_parallel``).

Formulation (``sequence_parallel_runs``): with SP not pinned, two runs of the search, on a
view of the cost model with SP off and one with it on (``CostModel.with_sequence_parallel``,
``autoplan.solve.portfolio``):

- the shared single-stage family (one stage: its SP is the plan's) runs in both, SP for the
  whole plan; the SP-on run's searches tp > 1 only (a tp-1 plan is the same plan with SP
  off, the first run's);
- the uniform family runs once, in the SP-off run, and chooses SP per stage
  (``autoplan.solve.uniform``'s ``per_stage_sp``): a uniform plan's stages share (dp, tp)
  and each stage's setting is local, so each stage with tp is costed both ways and the
  partition DP keeps both where neither is no worse in time and tail (the faster setting
  can have the longer tail: its docstring says why), exact over the per-stage choice; its
  bounds read each layer's least figures over SP off and on. Its interleaved candidates
  keep SP for the whole plan, both settings tried (their ranks' stages share memory);
- the heterogeneous family runs once, in the SP-off run, and chooses SP per stage: its
  source joins to each view's options those with tp > 1 of the same view with SP on, each
  (allocation, cp, ep, SP) an option of its own (``autoplan.solve.stage_degrees``). Since SP
  is local to a stage, the DP stays exact over the per-stage choice, plans mixing SP and
  non-SP stages included (a memory-tight class that needs it beside a latency-bound class
  where its all-gathers cost), and where one setting everywhere is best it finds that. Its
  bounds hold because the prefix bound's ω_k(l) (and what the DP and the root bound take
  from the base source: the fill ratio, the relaxation's prices) is the least over SP off
  and on, and each option's floors are its own view's.

So the space searched is the union of the runs' spaces, and the certificate the least of
their floors. A plan without tp > 1 anywhere is the same plan either way and is kept with SP
off; a configuration is said one way (``canonical_sequence_parallel``: plan-wide where every
tp > 1 stage runs it), so equal plans found by both runs compare equal. Where the setting
cannot differ (tp pinned to 1, no layer splits) there is only the SP-off run. Pinned off
(``--no-sp``): that run alone, no SP options. Pinned on (``--sp``): the search runs once per
tp > 1 the cluster allows, with that tp pinned and SP for the whole plan (so a plan mixing
tp 1 and tp > 1 stages is not among those it considers). A mixture-of-experts model runs
without SP (the runtime's router does not take a sequence-sharded stream).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.config import PlanConfig
from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import tp_choices

__all__ = ["SequenceParallelRun", "has_tensor_parallel", "sequence_parallel_runs"]


def has_tensor_parallel(config: PlanConfig) -> bool:
    """Whether some group of ``config`` runs tensor parallel (SP means something)."""
    return any(group.tp > 1 for stage in config.stages for group in stage.groups)


@dataclass(frozen=True)
class SequenceParallelRun:
    """One run of the search for SP (module docstring).

    ``sequence_parallel``: the view's setting, for the whole plan; ``options``: the run's;
    ``tensor_parallel_only``: its uniform and shared families search tp > 1 only;
    ``heterogeneous`` and ``uniform``: those families run (the SP-on run's are the SP-off
    run's, which choose per stage); ``per_stage``: its uniform and heterogeneous families
    choose SP per stage."""

    sequence_parallel: bool
    options: SolveOptions
    tensor_parallel_only: bool = False
    heterogeneous: bool = True
    per_stage: bool = False
    uniform: bool = True


def sequence_parallel_runs(model: CostModel, options: SolveOptions) -> list[SequenceParallelRun]:
    """The searches to run on ``model`` (module docstring)."""
    if expert_counts(model.profile):
        if options.sequence_parallel:
            raise InputError(
                "--sp: sequence parallelism is not run on mixture-of-experts models; use --no-sp"
            )
        return [SequenceParallelRun(False, options)]
    if options.sequence_parallel is False:
        return [SequenceParallelRun(False, options)]
    if options.sequence_parallel:
        # Pinned on: only plans with tp > 1 mean it; one run per such tp.
        return [
            SequenceParallelRun(True, options.model_copy(update={"tp": t}))
            for t in tp_choices(model, options)
            if t > 1
        ]
    splittable = any(layer.tensor_parallel is not None for layer in model.profile.layers)
    if options.tp == 1 or not splittable:
        return [SequenceParallelRun(False, options)]
    return [
        SequenceParallelRun(False, options, per_stage=True),
        SequenceParallelRun(
            True, options, tensor_parallel_only=True, heterogeneous=False, uniform=False
        ),
    ]
