"""Context parallelism as a searched knob: one run per cp degree, on the cost model's view
(the runs are driven by ``autoplan.solve.portfolio``).

A cp degree c turns every replica of a plan into c tp groups, each running a chunk of every
sample's sequence (``autoplan.cost.context_parallel``). The search needs no new dimension
for it: on ``CostModel.with_context_parallel(c)`` a device class counts cp groups of c GPUs of
one node as its GPUs, and costs every group at cp c, so the same search (uniform,
shared-stage and heterogeneous families, sequence parallelism on and off) runs over plans whose
replicas are tp × c GPUs inside a node (cp within a node first, where the ring's sends are on
NVLink). Its configurations come back with ``cp = c`` on their groups and are costed again by
the model itself (``evaluate``, the figure the plan reports); the best over the degrees is the
best of the space with the knob in it. In the run at cp 1, the heterogeneous family also
chooses cp per stage (``autoplan.solve.stage_degrees``); the uniform and shared-stage families
keep one cp for every stage.

Degrees searched: 1 and the powers of two up to ``MAX_CONTEXT_PARALLEL`` that divide some
class's GPUs per node and whose 2·c load-balanced chunks divide the sequence, for a model with
an attention core. Sequences shorter than ``SolveOptions.cp_min_seq_len`` are searched at cp 1
only unless cp is pinned: there a chunk's attention is too short to hide the ring's sends and a
sample's activations rarely bind, and each degree costs one more search.
"""

from __future__ import annotations

from autoplan.solve.stage_degrees import MAX_CONTEXT_PARALLEL, cp_choices

__all__ = ["MAX_CONTEXT_PARALLEL", "cp_choices"]
