"""Whether host memory is what leaves no plan: activation offload parks saved activations in
the node's RAM (``autoplan.cost.offload``), and where nothing else fits the device, a plan may
exist that only the GPUs' shares of host memory refuse.

The check searches again with host memory unbounded (``CostModel.without_host_limit``): if
that finds a plan, host memory binds, and the message names it with the numbers of that plan's
first host-memory violation. It runs only when no plan was found and the cause is not proven
otherwise (the last resort, "nothing fits in memory"), so a solve that succeeds never pays it.
"""

from __future__ import annotations

from collections.abc import Callable

from autoplan.cost.model import CostModel
from autoplan.solve.diagnose import Diagnosis
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import SearchResult

__all__ = ["host_memory_diagnosis"]

Searcher = Callable[[CostModel, int, SolveOptions], SearchResult]


def host_memory_diagnosis(
    model: CostModel, batch: int, options: SolveOptions, search: Searcher
) -> Diagnosis | None:
    """A diagnosis naming host memory when lifting its bound (and nothing else) makes
    ``search`` find a plan; None when offload is pinned off or host memory is not the cause."""
    if options.offload is False:
        return None
    lifted = search(model.without_host_limit(), batch, options)
    found = [c for c in lifted.candidates if c.cost.feasible]
    if not found:
        return None
    # The plan the unbounded search prefers, costed with the real bound: its host violation.
    cost = model.evaluate(found[0].config)
    host = [v for v in cost.violations if "host memory" in v]
    if not host:  # cannot happen: the bound is the only difference between the two models
        return None
    return Diagnosis(
        "offloaded activations exceed host memory",
        "no configuration fits in device memory without parking more offloaded activations "
        f"than host memory holds: in the best plan that host memory would allow "
        f"({found[0].config.summary()}), {host[0]}",
    )
