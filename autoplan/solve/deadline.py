"""One deadline for a whole solve, shared out among its runs.

The search runs several times over (per context-parallel degree, per expert-parallel degree,
at block then sub-block grain, with sequence parallelism off then on); each run gets a share
of the time left, and every family inside it stops at the same instant. The deadline travels
as this object rather than as rewritten time limits, so no run can outlive the solve's limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Deadline"]

_LEAST_SHARE_S = 1e-3  # a run past the deadline still gets a moment to return what it holds


@dataclass(frozen=True)
class Deadline:
    """A ``time.monotonic()`` instant (``at``) and the seconds it was set for (``budget_s``)."""

    at: float
    budget_s: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The deadline ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds)

    def left_s(self) -> float:
        """Seconds left (negative once past)."""
        return self.at - time.monotonic()

    def share(self, parts: int) -> Deadline:
        """One of ``parts`` equal shares of the time left (the last share ends at ``at``)."""
        budget = max(self.left_s(), _LEAST_SHARE_S) / parts
        return Deadline(time.monotonic() + budget, budget)
