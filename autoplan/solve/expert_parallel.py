"""Expert parallelism as a searched knob: one run per ep degree, merged (the runs are driven
by ``autoplan.solve.portfolio``).

Like sequence parallelism (``autoplan.solve.sequence_parallel``), ep changes every layer's
costs (its MoE layers' all-to-alls and expert memory: ``autoplan.cost.expert_parallel``), so
the search runs once per degree e on a view of the cost model costing every stage at e
(``CostModel.with_expert_parallel``), whose space holds only replica groups of a multiple of
e replicas (the uniform, heterogeneous and shared-stage searches read ``expert_parallel``),
and the candidates are merged: the best of the runs is the best of the space with ep in it.
In the run at ep 1, the heterogeneous family chooses ep per stage (``autoplan.solve.
stage_degrees``: each stage its own degree); the uniform and shared-stage families keep one
degree per plan.

Degrees searched: 1 and every divisor of the gcd of the MoE layers' expert counts up to the
cluster's GPUs (a dense model: 1 only); pinned, that degree. ep > 1 runs with ZeRO level 1
(its optimizer states sharded over the replicas of one expert index), or 0 where pinned so:
ZeRO-1 never costs time and saves memory, and the cost model does not compose ZeRO-2/3 with
ep (``autoplan.cost.expert_parallel``). A plan's
stages carry the degree (``StageChoice.ep``), and its cost is ``CostModel.evaluate`` of that
config on the plain model, which the view's figures equal.
"""

from __future__ import annotations

import dataclasses

from autoplan.cost.config import PlanConfig
from autoplan.solve.stage_degrees import expert_degrees

__all__ = ["expert_degrees", "with_expert_degree"]


def with_expert_degree(config: PlanConfig, ep: int) -> PlanConfig:
    """``config`` with every stage at expert-parallel degree ``ep``."""
    if ep == 1:
        return config
    return dataclasses.replace(
        config, stages=tuple(dataclasses.replace(stage, ep=ep) for stage in config.stages)
    )
