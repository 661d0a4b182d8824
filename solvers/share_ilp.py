r"""Uneven data-parallel shares across GPU classes: an integer program (HAP-style).

A single-stage plan replicates the whole model on ``n_k`` replicas of each class k. Each
iteration runs m micro-batches; a replica of class k takes b_k samples per micro-batch, so
that m · Σ_k n_k b_k = B (the global batch). A faster class takes a larger share.

Data: candidate micro-batch counts M (divisors of B); for each m ∈ M and class k the allowed
sizes b ∈ S_{m,k} (they fit in memory), with per-micro-batch time τ_k(b) and backward time
β_k(b); the gradient all-reduce time A and the optimizer step O (independent of the shares).

Variables: w_m ∈ {0,1} (m is chosen), x_{m,k,b} ∈ {0,1} (class k uses b under m),
T ≥ 0 (compute time of the iteration), E ≥ 0 (all-reduce time not hidden).

    minimise    T + E + O
    subject to  Σ_m w_m = 1                                     (one_micro_batch_count)
                Σ_b x_{m,k,b} = w_m                    ∀ m, k   (one_size_per_class)
                Σ_k n_k Σ_b b · x_{m,k,b} = (B / m) · w_m  ∀ m   (global_batch)
                T ≥ m · Σ_b τ_k(b) · x_{m,k,b}          ∀ m, k   (slowest_replica)
                E ≥ A − Σ_m Σ_b β_k(b) · x_{m,k,b}       ∀ k      (exposed_allreduce)

The all-reduce can hide behind the last backward of the replica that finishes it first
(the shortest backward), hence the per-class E constraints. Solved with CBC (HiGHS when
highspy is installed) under a time limit; the answer is re-checked against the constraints
and its objective recomputed from the chosen sizes.

Where the choices are few (``ENUMERATION_LIMIT`` size tuples over all m: a handful of classes
with up to ``MAX_SHARE_MICRO_BATCH`` sizes each), ``share_search`` enumerates them in process
instead: the last class's size is fixed by the batch, so it is Π_{k<n} |S_k| objectives per m,
well under a millisecond, where a CBC subprocess costs ~40 ms to start.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# PuLP is imported where the ILP is built: most share searches enumerate in process, and
# importing it costs a CLI solve ~30 ms of its start-up.
if TYPE_CHECKING:
    import pulp

__all__ = [
    "ENUMERATION_LIMIT",
    "ShareClass",
    "ShareProblem",
    "ShareSearch",
    "ShareSolution",
    "share_objective",
    "share_search",
    "solve_shares",
]

ENUMERATION_LIMIT = 200_000
"""Most size tuples ``share_search`` enumerates in process before it builds the ILP."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShareClass:
    """One class's replicas and, per allowed micro-batch size, (time, backward) in ms."""

    replicas: int
    sizes: dict[int, tuple[float, float]]


@dataclass(frozen=True)
class ShareProblem:
    """See the module docstring; ``micro_batch_counts`` are the candidate m."""

    global_batch: int
    micro_batch_counts: tuple[int, ...]
    classes: tuple[ShareClass, ...]
    allreduce_ms: float
    optimizer_ms: float


@dataclass(frozen=True)
class ShareSolution:
    """The chosen m and per-class micro-batch sizes, and the objective (ms)."""

    num_micro_batches: int
    sizes: tuple[int, ...]
    objective: float


def share_objective(problem: ShareProblem, m: int, sizes: tuple[int, ...]) -> float:
    """The objective of a given choice, computed directly (used to re-check the ILP)."""
    times = [c.sizes[b][0] for c, b in zip(problem.classes, sizes, strict=True)]
    backwards = [c.sizes[b][1] for c, b in zip(problem.classes, sizes, strict=True)]
    exposed = max(0.0, problem.allreduce_ms - min(backwards))
    return m * max(times) + exposed + problem.optimizer_ms


class _ShareModel:
    """The PuLP model, one method per constraint family."""

    def __init__(self, problem: ShareProblem) -> None:
        import pulp

        self.p = problem
        self.lp = pulp.LpProblem("uneven_shares", pulp.LpMinimize)
        self.counts = [
            m
            for m in problem.micro_batch_counts
            if problem.global_batch % m == 0
            and all(
                any(b * c.replicas <= problem.global_batch // m for b in c.sizes)
                for c in problem.classes
            )
        ]
        self.w = {m: pulp.LpVariable(f"w_{m}", cat=pulp.LpBinary) for m in self.counts}
        self.x = {
            (m, k, b): pulp.LpVariable(f"x_{m}_{k}_{b}", cat=pulp.LpBinary)
            for m in self.counts
            for k, c in enumerate(problem.classes)
            for b in sorted(c.sizes)
            if b * c.replicas <= problem.global_batch // m
        }
        self.t = pulp.LpVariable("T", lowBound=0)
        self.e = pulp.LpVariable("E", lowBound=0)
        self.lp += self.t + self.e + problem.optimizer_ms, "iteration_time"

    def _sizes(self, m: int, k: int) -> list[int]:
        return [b for (mm, kk, b) in self.x if mm == m and kk == k]

    def add_one_micro_batch_count_constraints(self) -> None:
        import pulp

        self.lp += pulp.lpSum(self.w.values()) == 1, "one_micro_batch_count"

    def add_one_size_per_class_constraints(self) -> None:
        import pulp

        for m in self.counts:
            for k in range(len(self.p.classes)):
                self.lp += (
                    pulp.lpSum(self.x[m, k, b] for b in self._sizes(m, k)) == self.w[m],
                    f"one_size_per_class_m{m}_k{k}",
                )

    def add_global_batch_constraints(self) -> None:
        import pulp

        for m in self.counts:
            self.lp += (
                pulp.lpSum(
                    c.replicas * b * self.x[m, k, b]
                    for k, c in enumerate(self.p.classes)
                    for b in self._sizes(m, k)
                )
                == (self.p.global_batch // m) * self.w[m],
                f"global_batch_m{m}",
            )

    def add_slowest_replica_constraints(self) -> None:
        import pulp

        for m in self.counts:
            for k, c in enumerate(self.p.classes):
                self.lp += (
                    self.t
                    >= pulp.lpSum(m * c.sizes[b][0] * self.x[m, k, b] for b in self._sizes(m, k)),
                    f"slowest_replica_m{m}_k{k}",
                )

    def add_exposed_allreduce_constraints(self) -> None:
        import pulp

        for k, c in enumerate(self.p.classes):
            self.lp += (
                self.e
                >= self.p.allreduce_ms
                - pulp.lpSum(
                    c.sizes[b][1] * self.x[m, k, b] for m in self.counts for b in self._sizes(m, k)
                ),
                f"exposed_allreduce_k{k}",
            )

    def solve(self, time_limit_s: float) -> ShareSearch:
        import pulp

        if not self.counts:
            return ShareSearch(None, True)
        self.add_one_micro_batch_count_constraints()
        self.add_one_size_per_class_constraints()
        self.add_global_batch_constraints()
        self.add_slowest_replica_constraints()
        self.add_exposed_allreduce_constraints()
        solver = _solver(time_limit_s)
        status = self.lp.solve(solver)
        if status != pulp.LpStatusOptimal:
            logger.info("share ILP: %s", pulp.LpStatus[status])
            # Infeasible is a proof that nothing covers the batch; anything else (the time
            # limit) proves nothing.
            return ShareSearch(None, status == pulp.LpStatusInfeasible)
        return ShareSearch(self._checked_solution(), True)

    def _checked_solution(self) -> ShareSolution:
        import pulp

        chosen_m = [m for m in self.counts if (self.w[m].value() or 0) > 0.5]
        if len(chosen_m) != 1:
            raise RuntimeError(f"share ILP chose {len(chosen_m)} micro-batch counts")
        m = chosen_m[0]
        sizes = []
        for k in range(len(self.p.classes)):
            picked = [b for b in self._sizes(m, k) if (self.x[m, k, b].value() or 0) > 0.5]
            if len(picked) != 1:
                raise RuntimeError(f"share ILP chose {len(picked)} sizes for class {k}")
            sizes.append(picked[0])
        total = m * sum(c.replicas * b for c, b in zip(self.p.classes, sizes, strict=True))
        if total != self.p.global_batch:
            raise RuntimeError(f"share ILP covers {total} samples, not {self.p.global_batch}")
        objective = share_objective(self.p, m, tuple(sizes))
        reported = pulp.value(self.lp.objective)
        if abs(objective - reported) > 1e-6 * max(1.0, abs(objective)):
            raise RuntimeError(f"share ILP objective {reported} != recomputed {objective}")
        return ShareSolution(num_micro_batches=m, sizes=tuple(sizes), objective=objective)


def _solver(time_limit_s: float) -> pulp.LpSolver:
    import pulp

    if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s)


@dataclass(frozen=True)
class ShareSearch:
    """The best choice (None: none found) and whether it is proven: the optimum, or a proof
    that no choice covers the batch."""

    solution: ShareSolution | None
    proven: bool


def _tuples(problem: ShareProblem) -> int:
    count = 0
    for m in problem.micro_batch_counts:
        if problem.global_batch % m == 0:
            count += math.prod(len(c.sizes) for c in problem.classes[:-1])
    return count


def _enumerate(problem: ShareProblem) -> ShareSolution | None:
    """Every size tuple (the last class's size follows from the batch); the least objective,
    ties to the smaller m and sizes.

    Vectorised per m over the tuples in lexicographic order (numpy's first minimum is then
    the smallest tuple among the least), with the objective's operations in
    ``share_objective``'s order, so the values and the choice are those of a loop over
    ``itertools.product``."""
    best: tuple[float, int, tuple[int, ...]] | None = None
    if any(not c.sizes for c in problem.classes):
        return None  # a class with no size that fits: no tuple
    head_classes = problem.classes[:-1]
    last = problem.classes[-1]
    # The last class's figures by size (nan where it has none): looked up by the size left.
    top = max(last.sizes)
    last_time = np.full(top + 1, np.nan)
    last_backward = np.full(top + 1, np.nan)
    for size, (time, backward) in last.sizes.items():
        last_time[size], last_backward[size] = time, backward
    sizes = [np.array(sorted(c.sizes), dtype=np.int64) for c in head_classes]
    grids = np.meshgrid(*sizes, indexing="ij") if sizes else []
    heads = [grid.ravel() for grid in grids]
    times = [
        np.array([c.sizes[int(x)][0] for x in column])
        for c, column in zip(head_classes, heads, strict=True)
    ]
    backwards = [
        np.array([c.sizes[int(x)][1] for x in column])
        for c, column in zip(head_classes, heads, strict=True)
    ]
    taken = sum(
        (c.replicas * column for c, column in zip(head_classes, heads, strict=True)),
        np.zeros(1, dtype=np.int64),
    )
    for m in sorted(problem.micro_batch_counts):
        if problem.global_batch % m:
            continue
        left = problem.global_batch // m - taken
        share, rest = np.divmod(left, last.replicas)
        ok = (left > 0) & (rest == 0) & (share <= top)
        index = np.where(ok, share, 0)
        ok &= ~np.isnan(last_time[index])
        if not ok.any():
            continue
        slowest = last_time[index]
        for column in times:
            slowest = np.maximum(column, slowest)
        shortest = last_backward[index]
        for column in backwards:
            shortest = np.minimum(column, shortest)
        value = (
            m * slowest + np.maximum(0.0, problem.allreduce_ms - shortest) + problem.optimizer_ms
        )
        value = np.where(ok, value, np.inf)
        at = int(np.argmin(value))
        found = (
            float(value[at]),
            m,
            (*(int(column[at]) for column in heads), int(share[at])),
        )
        if best is None or found < best:
            best = found
    if best is None:
        return None
    return ShareSolution(num_micro_batches=best[1], sizes=best[2], objective=best[0])


def share_search(problem: ShareProblem, time_limit_s: float = 10.0) -> ShareSearch:
    """The best m and per-class sizes: enumerated in process where the tuples are few
    (module docstring), else the ILP under ``time_limit_s``."""
    if problem.classes and _tuples(problem) <= ENUMERATION_LIMIT:
        return ShareSearch(_enumerate(problem), True)
    return _ShareModel(problem).solve(time_limit_s)


def solve_shares(problem: ShareProblem, time_limit_s: float = 10.0) -> ShareSolution | None:
    """The best m and per-class micro-batch sizes, or None if no choice covers the batch
    (or the ILP's time limit came first)."""
    return share_search(problem, time_limit_s).solution
