"""What a running search has found so far, for a progress line (``autoplan solve``).

The families report each plan they find (``report_found``) and the solve reports the bound it
holds from the start (``report_bound``: the work bound of ``autoplan.solve.certificate``, valid
at any moment); a caller that wants to watch opens ``watching`` around the solve and is told of
every change. Without a watcher the reports cost one context-variable lookup. The figures are
the families' own (a view's pipeline objective before the plan is costed again): a progress
line, not the certificate, which the plan records once the search ends.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["SearchProgress", "report_bound", "report_found", "watching"]


@dataclass
class SearchProgress:
    """The best time found, the bound held, and since when the search runs."""

    on_change: Callable[[SearchProgress], None]
    started: float = field(default_factory=time.monotonic)
    incumbent_ms: float = math.inf
    bound_ms: float = 0.0

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def gap(self) -> float | None:
        """(incumbent - bound) / incumbent, None before a plan or a bound."""
        if math.isinf(self.incumbent_ms) or self.bound_ms <= 0:
            return None
        return max(0.0, (self.incumbent_ms - self.bound_ms) / self.incumbent_ms)


_WATCHER: ContextVar[SearchProgress | None] = ContextVar("autoplan_search_progress", default=None)


@contextlib.contextmanager
def watching(on_change: Callable[[SearchProgress], None]) -> Iterator[SearchProgress]:
    """Call ``on_change`` with the search's progress whenever a plan or a bound improves."""
    progress = SearchProgress(on_change)
    token = _WATCHER.set(progress)
    try:
        yield progress
    finally:
        _WATCHER.reset(token)


def report_found(iteration_ms: float) -> None:
    """A family found a plan of this time."""
    progress = _WATCHER.get()
    if progress is not None and iteration_ms < progress.incumbent_ms:
        progress.incumbent_ms = iteration_ms
        progress.on_change(progress)


def report_bound(bound_ms: float) -> None:
    """No plan of the space is faster than this."""
    progress = _WATCHER.get()
    if progress is not None and math.isfinite(bound_ms) and bound_ms > progress.bound_ms:
        progress.bound_ms = bound_ms
        progress.on_change(progress)
