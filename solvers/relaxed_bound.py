r"""A lower bound on one run of ``pipeline_dp`` (one micro-batch count and schedule) before
it starts: the DP's problem with every stage at its floor and the resources priced.

Problem (``pipeline_dp``'s module docstring): stages s = 1..p over [b_s, b_{s+1}) with
options o_s, Σ_s u(o_s) <= R, minimise F = (m - 1) · max_s a_s + Σ_s f_s + max_s t_s. Here
every stage is taken at its floor: a_s, f_s >= c(o_s, b_s, b_{s+1}), where c is the
source's ``floor_table`` plus twice the least boundary transfer into the stage (unless it is
the first) and twice the least out of it (unless it is the last): a blocking transfer holds
both of its stages for the whole transfer, each way (``StageSource.edge_floors``).

Bound. Let P be any pipeline of the run, A* = max_s a_s its peak and G = A_0 < A_1 < ... <
A_n a grid with A_0 <= A* (``lowest_peak``: the prefix bound over all layers, which bounds
every pipeline's peak). For a price vector μ >= 0 (per resource), let

    D_μ(A) = min over partitions and options with every c <= A, and p in [min, max] stages,
             of Σ_s (c(o_s, s) + μ · u(o_s))  -  μ · R

(no resource constraint: it is priced instead). P itself is such a partition when A >= A*,
and Σ_s μ · u(o_s) <= μ · R, so Σ_s f_s >= Σ_s c >= D_μ(A) for every A >= A* (Lagrangian
weak duality); D_μ does not grow with A. With A_g <= A* < A_{g+1} (or A* >= A_n, then
g = n and A_{n+1} = ∞):

    F(P) >= (m - 1) A* + Σ_s f_s >= (m - 1) A_g + max_μ D_μ(A_{g+1})

so min_g of the right-hand side bounds every pipeline of the run (tails and the max with
zero dropped: t >= 0). Where no partition with every c <= A fits the resources at all, D is
infinite: for any direction ν >= 0, Σ_s u(o_s) <= R gives ν · Σ_s u(o_s) <= ν · R, so a least
ν · Σ u over the partitions above ν · R rules the cap out (the weights and each resource
alone are the directions tried). This is what lifts the peak above the prefix bound where a
stage may hold few replicas (b = B / m small): the GPUs cannot all be used at once.

The prices tried (any μ >= 0 is valid: the bound holds for each, so for their largest) are
multiples of the source's per-resource weights (``weights``: a GPU's price its share of the
cluster's compute), and each resource alone (``CLASS_PRICE_FACTORS``: all of one resource
priced at that many peaks, the others free). The second kind prices a scarce resource that a
direction proportional to compute cannot price alone: GPT-3 175B on 16,384 GPUs of four types
(batch 6144, plan 6,423.5 ms) has root bounds of 6,063.5 ms (m = 4, 1F1B) and 5,707.7 ms
(m = 6) with them, 5,405.6 and 5,413.9 ms without, and its 60 s solve ends at a proven gap of
2.4% instead of 3.1%. Richer sets were measured on Llama-2-70B on 48 GPUs of three types and
left out: each resource alone at 0.5 to 32 peaks raises no run's root bound there, a grid of
729 price vectors (each resource at 0 to 32 peaks) raises them by 2.5% at most for a hundred
times the tables. What keeps that bound below the optimum is the relaxation's fractional use
of the GPUs, which no price removes: its integer optimum at the same floors is 4% higher
(m = 64, 1F1B: 44,947 against 43,157 ms; the plan is 49,091 ms). Options of one
resource vector are merged (per (start, end) only the least floor counts). D_μ for every A
of the grid at once: per (start, end), the options sorted by c and the running minimum of
c + μ · u along them, read at the count of options with c <= A; then a shortest path over the
layers, with the stage count in the state only where it is bounded.

One class is also counted exactly (``_ExactTables``): its used count (in blocks) a state
of the shortest path, the others priced; at each cap the larger of that and D bounds the
run, and the row's free count of it selects the column of the completion floors. Llama-2-70B
on h100-a100-l4 (b256): root bounds of the m = 16/32/64 1F1B runs 42,575/42,612/43,158 ->
44,368/43,638/43,357 ms (the H100s exact), the 60 s solve's proven gap 3.77% -> 3.18%. (The
floors themselves were the larger part of the rest: with each stage's memory counted,
``autoplan.solve.hetero``'s ``_fitting_floors``, the same runs' root bounds are 45,502/45,356/
45,876 ms, and the relaxations the searches prune deeper stages with, at three and four
micro-batches in flight, brought the 60 s gap to 0.25%.)

The same tables over partitions of [0, i) bound what the stages in front of a partial
pipeline can add (``RunRelaxation.completion_floors``): the DP prunes its stages and labels
with it (``solvers.pipeline_dp``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CLASS_PRICE_FACTORS",
    "COARSE_STEP",
    "GRID_POINTS",
    "GRID_STEP",
    "PRICE_FACTORS",
    "RunRelaxation",
    "stage_floors",
]

GRID_STEP = 0.004
"""Relative step of the peak grid: the bound gives up at most (m - 1) × this × the peak."""

GRID_POINTS = 96

STAGE_CAP_KEPT = 8
"""The most stages a run may have is kept in the relaxation up to this many (1F1B: m)."""

COARSE_STEP = 8
"""The first grid tried where the caller has a target: every this many caps of the grid."""

COARSE_ROWS = 32
"""``completion_floors`` bounds at least this many rows on the coarse caps first (fewer: the
two passes' fixed costs are more than the work they save)."""

_CAPS_AT_ONCE = 8
"""Caps whose stage counts are searched in the first pass (``RunRelaxation``'s bound); each
further pass takes twice as many."""

PRICE_FACTORS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)
"""The prices tried, as multiples of ``weights`` scaled to the peak (module docstring)."""

CLASS_PRICE_FACTORS = (1.5,)
"""The prices tried on each resource alone, as peaks per whole resource (module docstring).
One factor: each row adds its share to the tables and their time (1 and 2 together: +58%
relaxation time on GPT-3 175B on 1,024 GPUs, against +25% for 1.5 alone, which bounds the
16,384-GPU runs as well or better)."""


def stage_floors(
    num_layers: int,
    floor_tables: Sequence[np.ndarray],
    edges: Sequence[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """``out[o, i, j]``: the floor c of option o on [i, j) (module docstring), inf where
    j <= i. ``floor_tables[j - 1]`` is the source's ``floor_table(j)``; ``edges[j]`` its
    ``edge_floors(j)`` (least one-way transfer out of a stage ending at j, into one starting
    at j, per option)."""
    options = floor_tables[0].shape[0]
    out = np.full((options, num_layers + 1, num_layers + 1), math.inf)
    for j in range(1, num_layers + 1):
        out[:, :j, j] = floor_tables[j - 1]
        if j < num_layers:
            out[:, :j, j] += 2.0 * edges[j][0][:, None]  # out of a stage ending at j
    for i in range(1, num_layers):
        out[:, i, i + 1 :] += 2.0 * edges[i][1][:, None]  # into a stage starting at i
    return out


class RunRelaxation:
    """The relaxation of one run (module docstring): its bound on every pipeline of the run
    (``bound``), and what stages covering [0, i) can least add to a partial pipeline
    (``completion_floor``).

    ``uses[o]`` the resources of option o, ``floors`` from ``stage_floors``, ``weights`` per
    resource (the prices' direction), ``lowest_peak`` a lower bound on every pipeline's peak
    a (> 0); ``min_stages`` and ``max_stages`` the run's stage counts. ``like``: the
    relaxation computed before (another schedule's run of the same micro-batch count, say);
    where its inputs are these, its tables per grid are reused (only the stage counts
    differ). It hands them over either way: one set of tables is kept, the latest."""

    def __init__(
        self,
        num_layers: int,
        num_micro_batches: int,
        resources: tuple[int, ...],
        uses: np.ndarray,
        floors: np.ndarray,
        weights: np.ndarray,
        lowest_peak: float,
        *,
        min_stages: int = 1,
        max_stages: int | None = None,
        target: float = math.inf,
        like: RunRelaxation | None = None,
    ) -> None:
        m = self.m = num_micro_batches
        n = num_layers
        self.bound = 0.0
        self.grid: np.ndarray = np.zeros(0)
        self.prefix = np.zeros((0, 0, n + 1))  # [price, grid, i]
        self.prices = np.zeros((0, len(resources)))
        self.needs = np.zeros((0, 0, n + 1))
        self.directions = np.zeros((0, len(resources)))
        self._run: _Run | None = None
        # completion_floors' tables per step of caps (``_caps``)
        self._caps_by_step: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # ``_least``'s answers per (start, free resources), per step of caps (``_Minima``)
        self._minima: dict[int, _Minima] = {}
        self._resources = np.asarray(resources, dtype=np.int64)
        if uses.shape[0] == 0:
            self.bound = math.inf
            return
        most = n if max_stages is None else min(max_stages, n)
        if min_stages > most:
            self.bound = math.inf
            return
        if not math.isfinite(lowest_peak) or lowest_peak <= 0:
            return
        inputs = (n, m, tuple(resources), uses, floors, weights, lowest_peak)
        run = None if like is None else like._run
        if like is not None:
            like._run = None
        if run is None or not run.same_inputs(inputs):
            run = _Run(*inputs)
        self._run = run
        least, capped = min_stages, most if most <= STAGE_CAP_KEPT else n
        grid = lowest_peak * (1.0 + GRID_STEP) ** np.arange(GRID_POINTS)
        grid = np.append(grid, math.inf)  # A_{n+1}: no cap
        if math.isfinite(target):
            # First on every COARSE_STEP-th cap of the grid: each of its intervals holds
            # several of the grid's, and each of their terms is at least that interval's
            # term (A_g no lower, D no higher at a higher cap), so its bound is no higher
            # than the grid's. Where it already reaches ``target`` it is the bound (the
            # caller prunes the run on either), without the completion tables.
            # Prices alone (the exact class's tables cost more than the rest: made only for
            # a run this leaves below the target).
            coarse = run.bound(
                np.append(grid[:-1:COARSE_STEP], math.inf), least, capped, exact=False
            )
            if coarse >= target:
                self.bound = coarse
                return
        self.bound = run.bound(grid, least, capped)
        tables = run.tables(grid)
        self.grid = grid
        self.prefix = run.prefix(grid)  # [price, g, i]: D over [0, i) at cap A_g, unpriced R
        self.prices = run.prices
        self.needs = tables.needs  # [direction, g, i]: least ν · Σ u over [0, i) at A_g
        self.directions = run.directions

    def completion_floors(
        self,
        starts: np.ndarray,
        max_stages: np.ndarray,
        sum_stages: np.ndarray,
        max_tails: np.ndarray,
        free: np.ndarray,
        limit: float = math.inf,
    ) -> np.ndarray:
        """Per row, a lower bound on F of every pipeline that completes a partial one
        covering [start, L) with (M, S, U) and ``free[row]`` resources left: with A' the
        peak of the stages before it and A_g <= A' < A_{g+1}, F >= (m - 1) max(M, A_g) + S
        + U + D_μ[0, start)(A_{g+1}) - μ · free, D over partitions of [0, start) priced as
        in the run's bound (where A' < A_0 the g = 0 term is no larger: the whole
        pipeline's peak is at least A_0, and D only shrinks as A grows). The least over g
        of the largest over the prices.

        With a finite ``limit`` (what the caller prunes at), a row whose bound reaches it
        may come back with a lower value that still does: every row is first bounded on
        every ``COARSE_STEP``-th cap of the grid (each coarse interval's term is at most
        the terms of the grid's intervals inside it: A_g no lower, D and the caps where the
        stages before are short no higher at a higher cap, exactly so in floating point,
        as the tables are running minima and sums of them), and only the rows that bound
        leaves below ``limit`` are bounded on the whole grid. The rows pruned are the
        same; most of the work (the [row, price, cap] arrays) is an eighth."""
        m = self.m
        exact: np.ndarray = (m - 1) * max_stages + sum_stages + max_tails
        if not len(self.grid):
            return exact
        if math.isinf(limit) or len(starts) < COARSE_ROWS or len(self.grid) <= 2 * COARSE_STEP:
            least = self._least(starts, max_stages, free, 1)
        else:
            least = self._least(starts, max_stages, free, COARSE_STEP)
            close = np.flatnonzero(np.maximum(least + sum_stages + max_tails, exact) < limit)
            if len(close):
                least[close] = self._least(starts[close], max_stages[close], free[close], 1)
        out = least + sum_stages + max_tails
        result: np.ndarray = np.where(starts == 0, exact, np.maximum(out, exact))
        return result

    def _caps(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tables ``_least`` reads on every ``step``-th cap of the grid (and the last,
        uncapped): per start i, D over [0, i) at each interval's upper cap [i, price, k] and
        the least uses [i, direction, k]; each interval's lower cap [k]. Made once per
        step, laid out by start so that a call gathers its rows in one take."""
        found = self._caps_by_step.get(step)
        if found is None:
            size = len(self.grid)
            points = np.append(np.arange(0, size - 1, step), size - 1)
            upper = points[1:]
            found = (
                np.ascontiguousarray(self.prefix[:, upper].transpose(2, 0, 1)),
                np.ascontiguousarray(self.needs[:, upper].transpose(2, 0, 1)),
                self.grid[points[:-1]],
            )
            self._caps_by_step[step] = found
        return found

    def _least(
        self, starts: np.ndarray, max_stages: np.ndarray, free: np.ndarray, step: int
    ) -> np.ndarray:
        """Per row, the least over the intervals [A_lower, A_upper) of the caps of ``step``
        (``_caps``: consecutive caps of the grid, or every ``COARSE_STEP``-th) of (m - 1)
        max(M, A_lower) + D[0, start)(A_upper) - μ · free (``completion_floors``).

        A search asks for the same few (start, free) over and over (Llama-2-70B on 48 GPUs:
        8.2 M rows in 27 k calls, 92 k distinct), with another M each time: per (start,
        free) the figures that do not depend on M are kept (``_Minima``) and each row reads
        two of them. The same figures as ``_least_direct``, bitwise."""
        minima = self._minima.get(step)
        if minima is None:
            minima = _Minima(self._resources, self.prefix.shape[2] - 1, self.m)
            self._minima[step] = minima
        return minima.least(self, starts, max_stages, free, step)

    def _least_direct(
        self, starts: np.ndarray, max_stages: np.ndarray, free: np.ndarray, step: int
    ) -> np.ndarray:
        """``_least`` computed in full for every row."""
        best = self._best(starts, free, step)
        lower = self._caps(step)[2]
        peaks = np.maximum(lower[None, :], max_stages[:, None])
        with np.errstate(invalid="ignore"):
            totals = (self.m - 1) * peaks + best
        if self.m == 1:
            totals[np.isnan(totals)] = math.inf  # 0 × inf: no candidate
        least: np.ndarray = totals.min(axis=1)
        return least

    def _best(self, starts: np.ndarray, free: np.ndarray, step: int) -> np.ndarray:
        """[row, k]: D over [0, start) at the k-th interval's upper cap of ``step`` less the
        free resources' price (the largest over the prices, at least 0), inf where the
        stages before cannot fit in what is free."""
        prefix, needs, _lower = self._caps(step)
        # [row, price, k]: D over [0, start) at the upper cap less the free resources' price.
        best: np.ndarray = (prefix[starts] - (free @ self.prices.T)[:, :, None]).max(axis=1)
        np.maximum(best, 0.0, out=best)
        # Caps at which the stages before cannot fit in what is free (the run's bound's test).
        have = (free @ self.directions.T) * (1 + 1e-9) + 1e-9
        exact = self._run.exact_tables(self.grid) if self._run is not None else None
        if exact is not None:
            np.maximum(best, exact.completion(starts, free, self._caps_points(step)), out=best)
        best[(needs[starts] > have[:, :, None]).any(axis=1)] = math.inf
        return best

    def _caps_points(self, step: int) -> np.ndarray:
        """The grid indices of the upper caps of ``step``'s intervals (``_caps``)."""
        size = len(self.grid)
        return np.append(np.arange(0, size - 1, step), size - 1)[1:]


MINIMA_FIGURES = 1 << 21
"""Most figures one ``_Minima`` keeps (16 MB); past it, rows not kept are computed each time."""

DENSE_KEYS = 1 << 20
"""Most (start, free) keys a ``_Minima`` indexes in an array (8 MB) rather than a dict."""


class _Minima:
    """``RunRelaxation._least``'s figures per (start, free resources) on one step of caps.

    With best[k] = max(D[0, start)(A_{k+1}) - μ · free, 0) (``RunRelaxation._best``) and
    the intervals' lower caps ascending, a row of peak M takes (m - 1) max(A_k, M) + best[k]
    at each k: (m - 1) M + best[k] where A_k < M, (m - 1) A_k + best[k] where not. So with
    k0 the count of A_k < M, its least is the smaller of (m - 1) M + min_{k < k0} best[k] and
    min_{k >= k0} ((m - 1) A_k + best[k]): rounding is monotone, so adding (m - 1) M to the
    least best is the least of the sums, bitwise. Kept per (start, free): the running minima
    of best from the first cap (``low``) and of (m - 1) A_k + best[k] from the last
    (``high``)."""

    def __init__(self, resources: np.ndarray, num_layers: int, m: int) -> None:
        self.m = m
        self.starts = num_layers + 1
        # (start, free) as one integer: free in mixed radix of the resources + 1 (a row out
        # of range, or a key space past int64, is computed in full).
        radix = resources + 1
        self.radix = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]]).astype(np.int64)
        space = float(np.prod(radix.astype(np.float64))) * self.starts
        self.usable = space < 2.0**62
        self.resources = resources
        # Where the key space is small (Llama-2-70B on 48 GPUs: 83 × 17³), each key's row
        # in an array, read in one take; else in a dict, a lookup per row.
        self.dense: np.ndarray | None = None
        if space <= DENSE_KEYS:
            self.dense = np.full(int(space), -1, dtype=np.int64)
        self.ids: dict[int, int] = {}
        self.low = np.zeros((0, 0))
        self.high = np.zeros((0, 0))
        self.count = 0

    def least(
        self,
        relaxation: RunRelaxation,
        starts: np.ndarray,
        max_stages: np.ndarray,
        free: np.ndarray,
        step: int,
    ) -> np.ndarray:
        """``RunRelaxation._least`` of these rows (the class docstring)."""
        rows = len(starts)
        if (
            not rows
            or not self.usable
            or self.m == 1
            or (free < 0).any()
            or (free > self.resources).any()
        ):
            return relaxation._least_direct(starts, max_stages, free, step)
        codes = (free @ self.radix) * self.starts + starts
        if self.dense is not None:
            ids = self.dense[codes]
        else:
            found = self.ids
            ids = np.array([found.get(code, -1) for code in codes.tolist()], dtype=np.int64)
        missing = np.flatnonzero(ids < 0)
        low, high = self.low, self.high
        width = len(relaxation._caps(step)[2])
        if len(missing):
            unique, first, inverse = np.unique(
                codes[missing], return_index=True, return_inverse=True
            )
            rows_new = missing[first]
            lower = relaxation._caps(step)[2]
            best = relaxation._best(starts[rows_new], free[rows_new], step)
            new_low = np.minimum.accumulate(best, axis=1)
            terms = (self.m - 1) * lower[None, :] + best
            new_high = np.minimum.accumulate(terms[:, ::-1], axis=1)[:, ::-1]
            if (self.count + len(unique)) * width <= MINIMA_FIGURES:
                new_ids = self._keep(unique, new_low, new_high)
                low, high = self.low, self.high
            else:
                # Read from the kept figures and these together (these not kept).
                new_ids = self.count + np.arange(len(unique))
                low = np.concatenate([self.low[: self.count].reshape(-1, width), new_low])
                high = np.concatenate([self.high[: self.count].reshape(-1, width), new_high])
            ids[missing] = new_ids[np.asarray(inverse).reshape(-1)]
        k0 = np.searchsorted(relaxation._caps(step)[2], max_stages, "left")
        below = (self.m - 1) * max_stages + low[ids, np.maximum(k0 - 1, 0)]
        below[k0 == 0] = math.inf
        above = high[ids, np.minimum(k0, width - 1)]
        above[k0 >= width] = math.inf
        least: np.ndarray = np.minimum(below, above)
        return least

    def _keep(self, codes: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """Keep the figures of ``codes`` (new rows of ``low`` and ``high``); their rows."""
        need = self.count + len(codes)
        if need > len(self.low):
            size = max(need, 2 * len(self.low), 64)
            for name in ("low", "high"):
                old = getattr(self, name)
                grown = np.empty((size, low.shape[1]))
                if self.count:
                    grown[: self.count] = old[: self.count]
                setattr(self, name, grown)
        self.low[self.count : need] = low
        self.high[self.count : need] = high
        ids = np.arange(self.count, need)
        if self.dense is not None:
            self.dense[codes] = ids
        else:
            self.ids.update(zip(codes.tolist(), ids.tolist(), strict=True))
        self.count = need
        return ids


@dataclass
class _GridTables:
    """A run's tables on one grid of caps (``_Run.tables``)."""

    cost: np.ndarray  # [price, cell, g]: least c + μ · u of stage cell (i, j) at A_g (_cells)
    needs: np.ndarray  # [direction, g, i]: least ν · Σ u over [0, i) at A_g
    short: np.ndarray  # [g]: no partition of stages at most A_g fits the resources
    loose: np.ndarray  # [price, g]: the least Σ c + μ · u, any stage count
    # [price, g, i]: D over [0, i) at cap A_g, unpriced R; made when first read
    # (``_Run.prefix``): only the completion tables read it, never the coarse grid's bound.
    prefix: np.ndarray | None = None


class _Run:
    """What ``RunRelaxation`` computes from its inputs: the tables of each grid of caps
    (``tables``, kept per grid) and the bound on a grid for a range of stage counts
    (``bound``); one per inputs, shared by relaxations of the same (``like``)."""

    def __init__(
        self,
        n: int,
        m: int,
        resources: tuple[int, ...],
        uses: np.ndarray,
        floors: np.ndarray,
        weights: np.ndarray,
        lowest_peak: float,
    ) -> None:
        self.inputs = (n, m, resources, uses, floors, weights, lowest_peak)
        self.n, self.m = n, m
        # Options of one resource vector: only the least floor of each (start, end) counts.
        uses, group = np.unique(uses, axis=0, return_inverse=True)
        group = np.asarray(group).reshape(-1)
        by_group = np.argsort(group, kind="stable")
        starts = np.flatnonzero(np.diff(group[by_group], prepend=-1))
        # Only the cells of a stage, i < j, are ever read (the shortest paths and prefixes):
        # gathered in one pass, the options already in their groups' order.
        starts_at, ends_at = np.triu_indices(n + 1, k=1)
        square = (n + 1) * (n + 1)
        at = by_group[:, None] * square + (starts_at * (n + 1) + ends_at)[None, :]
        stages = np.take(floors.reshape(-1), at)
        if len(starts) < len(stages):  # some group holds several options
            # Each group's k-th option against the least so far, for every group at once:
            # a minimum is exact in any order, and a reduceat over the first axis is several
            # times slower than these few whole-row minimums.
            sizes = np.diff(np.append(starts, len(stages)))
            least_of = stages[starts]
            for k in range(1, int(sizes.max())):
                rows = np.flatnonzero(sizes > k)
                least_of[rows] = np.minimum(least_of[rows], stages[starts[rows] + k])
            stages = least_of
        self.stages = stages  # (groups, stage cells): each resource vector's least floor
        self.order = np.argsort(stages, axis=0, kind="stable")
        self.flat = np.take_along_axis(stages, self.order, axis=0)  # (options, stage cells)
        self.resources = np.asarray(resources, dtype=np.float64)
        self.uses = uses.astype(np.float64)
        capacity = float(self.resources @ weights)
        self.scale = lowest_peak / capacity if capacity > 0 else 0.0
        # Each resource alone: all of it priced at a few peaks, the others free (none where
        # the run has none of it: no option then uses it).
        alone = np.zeros((len(resources), len(resources)))
        have = self.resources > 0
        alone[have, have] = lowest_peak / self.resources[have]
        self.prices = np.array(
            [factor * self.scale * weights for factor in PRICE_FACTORS]
            + [factor * row for row in alone[have] for factor in CLASS_PRICE_FACTORS]
        )
        # Where no partition of stages at most A_g fits the resources, D is infinite: for a
        # direction ν >= 0, the least ν · Σ u over the partitions above ν · R proves it.
        self.directions = np.vstack([weights[None, :], np.eye(len(resources))])
        self._tables: dict[bytes, _GridTables] = {}
        self._minima: tuple[np.ndarray, np.ndarray] | None = None
        self.exact = _exact_class(uses, np.asarray(resources, dtype=np.int64), weights)
        self._exact: dict[bytes, _ExactTables] = {}

    def same_inputs(self, inputs: tuple[object, ...]) -> bool:
        """Whether ``inputs`` are this run's (arrays compared by value)."""
        mine = self.inputs
        # The same array object (the twin runs of one source) is equal without a pass over it.
        return all(
            a is b or (np.array_equal(a, np.asarray(b)) if isinstance(a, np.ndarray) else a == b)
            for a, b in zip(mine, inputs, strict=True)
        )

    def tables(self, grid: np.ndarray) -> _GridTables:
        """The tables on ``grid`` (A_0 first, inf last), computed once per grid."""
        key = grid.tobytes()
        found = self._tables.get(key)
        if found is None:
            found = self._grid_tables(grid)
            self._tables[key] = found
        return found

    def _grid_tables(self, grid: np.ndarray) -> _GridTables:
        n, flat = self.n, self.flat
        cells = flat.shape[1]
        size = len(grid)
        # counts[cell, g]: options of floor <= A_g on cell (i, j). One search of every floor
        # in the grid (the first A_g >= c) and a running count, not a search per cell.
        first = np.searchsorted(grid, flat, "left")  # (options, cells)
        seen = np.bincount(
            (np.arange(cells) * (size + 1) + first).reshape(-1), minlength=cells * (size + 1)
        )
        counts = np.cumsum(seen.reshape(cells, size + 1)[:, :size], axis=1)
        # Where in a row k of [cell, inf; running minima] each (cell, g) reads: its cell's
        # entry ``counts`` (0, the inf of no option). Only the stage cells (i < j), packed
        # (``_cells``), with the caps innermost: the shortest paths read a start's cells for
        # every cap at once, contiguous (as [g, i, j] squares, strided and half of them an inf
        # never read, the gathers and the paths took twice the time).
        at = np.arange(cells)[:, None] * (len(flat) + 1) + counts

        def capped_costs(padded: np.ndarray) -> np.ndarray:
            """[k, cell, g]: per row k of ``padded`` (``_running_minima``), the least over
            the options of floor <= A_g on the stage cell (inf where none)."""
            taken: np.ndarray = np.take(padded.reshape(len(padded), -1), at, axis=1)
            return taken

        priced, needed = self._running_minima()
        # Every price's table in one array (the shortest paths run once over all of them).
        cost = capped_costs(priced)
        need = capped_costs(needed)
        needs = np.ascontiguousarray(_prefixes(need, n).transpose(0, 2, 1))
        have = self.directions @ self.resources
        short = np.any(needs[:, :, n] > have[:, None] * (1 + 1e-9) + 1e-9, axis=0)
        loose = _shortest(cost, n, 1, n)
        return _GridTables(cost, needs, short, loose)

    def prefix(self, grid: np.ndarray) -> np.ndarray:
        """The prefix table of ``grid`` (``_GridTables.prefix``), made once."""
        tables = self.tables(grid)
        if tables.prefix is None:
            tables.prefix = np.ascontiguousarray(_prefixes(tables.cost, self.n).transpose(0, 2, 1))
        return tables.prefix

    def _running_minima(self) -> tuple[np.ndarray, np.ndarray]:
        """([price, cell, 1 + option], [direction, cell, 1 + option]): per stage cell, the
        least c + μ · u, and the least ν · u, over the first options by floor (``order``);
        entry 0 the inf of none. What a cap A_g reads is the entry of the options with floor
        <= A_g (``_grid_tables``): the same for every grid, so made once per run, laid out by
        cell so that a cell's reads at every cap fall in one short row."""
        if self._minima is None:
            flat = self.flat

            def running(values: list[np.ndarray]) -> np.ndarray:
                padded = np.empty((len(values), len(flat) + 1, flat.shape[1]))
                padded[:, 0] = math.inf
                for row, value in enumerate(values):
                    padded[row, 1:] = value
                # The running minimum one option at a time: numpy's accumulate along an axis
                # runs several times slower than these few whole-row minimums.
                for k in range(2, len(flat) + 1):
                    np.minimum(padded[:, k - 1], padded[:, k], out=padded[:, k])
                return np.ascontiguousarray(padded.transpose(0, 2, 1))

            self._minima = (
                running(
                    [flat + (self.uses @ mu)[self.order].reshape(flat.shape) for mu in self.prices]
                ),
                running([(self.uses @ d)[self.order].reshape(flat.shape) for d in self.directions]),
            )
        return self._minima

    def exact_tables(self, grid: np.ndarray) -> _ExactTables | None:
        """The exact class's tables on ``grid`` (``_ExactTables``), made once per grid;
        None where no class is kept exact (``_exact_class``)."""
        if self.exact is None:
            return None
        # The whole grid on every EXACT_STEP-th cap, a coarse one (a run's first bound,
        # ``COARSE_STEP``) on each: the same caps, so one table serves both.
        step = EXACT_STEP if len(grid) > GRID_POINTS // 2 else 1
        points = np.append(np.arange(0, len(grid) - 1, step), len(grid) - 1)
        key = grid[points].tobytes()
        found = self._exact.get(key)
        if found is None:
            found = _exact_tables(self, grid[points])
            self._exact[key] = found
        return found.on(grid, points)

    def exact_bound(self, grid: np.ndarray) -> np.ndarray | None:
        """[g]: the exact class's D at each cap A_g of ``grid`` (stages uncounted), or
        None (``exact_tables``)."""
        tables = self.exact_tables(grid)
        return None if tables is None else tables.whole

    def bound(self, grid: np.ndarray, least: int, capped: int, *, exact: bool = True) -> float:
        """min over g of (m - 1) A_g + max_μ D_μ(A_{g+1}) on ``grid`` (A_0 first, inf last:
        the last interval [A_n, ∞) read at the uncapped column), over partitions of least
        to ``capped`` stages (``capped`` >= n: no cap); with ``exact``, D at each cap the
        larger of it and the exact class's (``exact_bound``)."""
        n, m = self.n, self.m
        tables = self.tables(grid)
        size = len(grid)
        priced = (self.prices @ self.resources)[:, None]

        def totals(values: np.ndarray, caps: np.ndarray) -> np.ndarray:
            """(m - 1) A_g + D(A_{g + 1}) for the caps g + 1 of ``values`` ([price, cap]:
            the least Σ c + μ · u at each price), D inf where the resources rule it out."""
            best = np.maximum((values - priced).max(axis=0), 0.0)
            if exact_of is not None:
                best = np.maximum(best, np.take(exact_of, caps))
            best = np.where(np.take(tables.short, caps), math.inf, best)
            with np.errstate(invalid="ignore"):
                out = (m - 1) * grid[caps - 1] + best
            return np.where(np.isnan(out), math.inf, out)

        # The stage counts cost most; without them (any count: a partition of fewer
        # stages, or more, is also one here) the same sums are taken in the same order, so
        # each cap's total is at most its counted one: only the caps whose uncounted total
        # is below the best counted total found are counted, in the order of that total, a
        # few at a time. The minimum is the one all would give.
        exact_of = self.exact_bound(grid) if exact else None
        caps = np.arange(1, size)
        loose = totals(tables.loose[:, caps], caps)
        if least <= 1 and capped >= n:
            return float(loose.min())
        bound = math.inf
        pending = caps[np.argsort(loose, kind="stable")]
        at_once = _CAPS_AT_ONCE
        while len(pending) and loose[pending[0] - 1] < bound:
            batch, pending = pending[:at_once], pending[at_once:]
            values = _shortest(tables.cost[:, :, batch], n, least, capped)
            bound = min(bound, float(totals(values, batch).min()))
            # Twice the caps next time: a pass's cost is mostly its fixed loop over the
            # layers, and a cap counted in any batch gives the same total.
            at_once *= 2
        return bound


def _cells(n: int) -> np.ndarray:
    """Where each start's cells begin in a packed row of stage cells: the cells (i, j),
    0 <= i < j <= n, in ``np.triu_indices(n + 1, k=1)``'s order (by start, then end), so
    that start i's ends i + 1..n are the n - i cells from ``_cells(n)[i]``."""
    return np.concatenate([[0], np.cumsum(np.arange(n, 0, -1))])


def _prefixes(cost: np.ndarray, n: int) -> np.ndarray:
    """[k, i, g]: per row k and cap g of ``cost`` ([k, cell, g], cells packed as ``_cells``
    says), the least Σ cost over partitions of [0, i), for every i."""
    rows, _, caps = cost.shape
    first = _cells(n)
    best = np.full((rows, n + 1, caps), math.inf)
    best[:, 0] = 0.0
    sums = np.empty((rows, n, caps))  # one buffer for every start's sums
    # Pushed forward from each i once it is final, along the cells of start i (contiguous):
    # the same sums best[i] + cost[i, j], and a minimum is exact in any order, so the same
    # figures as pulling each j's column.
    for i in range(n):
        ahead = best[:, i + 1 :]
        total = sums[:, : n - i]
        np.add(best[:, i, None], cost[:, first[i] : first[i + 1]], out=total)
        np.minimum(ahead, total, out=ahead)
    return best


def _shortest(cost: np.ndarray, n: int, least: int, most: int) -> np.ndarray:
    """[k, g]: per row k and cap g of ``cost`` ([k, cell, g], cells packed as ``_cells``
    says), the least Σ cost over partitions of [0, n) into least..most stages (``most`` >=
    n: no cap)."""
    rows, _, caps = cost.shape
    first = _cells(n)
    if least <= 1 and most >= n:
        best = np.full((rows, n + 1, caps), math.inf)
        best[:, n] = 0.0
        sums = np.empty((rows, n, caps))  # one buffer for every start's sums
        for i in range(n - 1, -1, -1):
            total = sums[:, : n - i]
            np.add(cost[:, first[i] : first[i + 1]], best[:, i + 1 :], out=total)
            total.min(axis=1, out=best[:, i])
        whole: np.ndarray = best[:, 0]
        return whole
    if most >= n and n - least <= least:
        return _shortest_by_slack(cost, n, n - least)
    # by[k, i, q, g]: q stages covering [i, n); with no cap, q counts up to ``least`` only
    # (the last state is "least or more": a stage more keeps it there).
    top = most if most < n else least
    by = np.full((rows, n + 1, top + 1, caps), math.inf)
    by[:, n, 0] = 0.0
    for i in range(n - 1, -1, -1):
        ahead = (cost[:, first[i] : first[i + 1], None] + by[:, i + 1 :]).min(axis=1)
        by[:, i, 1:] = ahead[:, :-1]  # ahead: (k, top + 1, g)
        if most >= n:
            by[:, i, top] = np.minimum(by[:, i, top], ahead[:, top])
    counted: np.ndarray = by[:, 0, least : top + 1].min(axis=1)
    return counted


def _shortest_by_slack(cost: np.ndarray, n: int, slack: int) -> np.ndarray:
    """``_shortest`` with at least n - ``slack`` stages and no cap, counted by the layers
    the stages hold beyond one each (Σ (j - i - 1) <= slack): fewer states where the least
    count is close to n (GPipe runs of many micro-batches). The same sums in the same order
    (a stage's cost plus the best behind it) over the same partitions: the same minimum."""
    rows, _, caps = cost.shape
    first = _cells(n)
    # by[k, i, r, g]: partitions of [i, n) whose stages hold r layers beyond one each.
    by = np.full((rows, n + 1, slack + 1, caps), math.inf)
    by[:, n, 0] = 0.0
    for i in range(n - 1, -1, -1):
        for extra in range(min(slack, n - i - 1) + 1):
            j = i + 1 + extra
            np.minimum(
                by[:, i, extra:],
                cost[:, first[i] + extra, None] + by[:, j, : slack + 1 - extra],
                out=by[:, i, extra:],
            )
    counted: np.ndarray = by[:, 0].min(axis=1)
    return counted


EXACT_STATES = 17
"""Most states (used counts of the exact class, in its blocks) the exact tables keep: a class
whose count in blocks is larger is not kept exact (``_exact_class``)."""

EXACT_WORK = 96
"""Most (state, stage size) pairs the exact tables' paths step through per stage cell (Σ over
the block counts c an option of the class takes of the states - c it may add to): a class
whose options take many sizes is not kept exact. Llama-2-70B's H100s (0..16 GPUs, stages of
1, 2, 4, 8, 16): 54; GPT-3 175B's 256 H100s in blocks of 16, stages of 1..16 blocks: 136,
whose tables cost its proven 1,536-sample solve 20% more time than the search saved."""

EXACT_STEP = COARSE_STEP
"""The exact class's tables are made on every this many caps of the grid (and its last), the
coarse grid's caps: a cap reads the next of them at or above it (E does not grow with the
cap: still a bound). Every 4th cap instead: Llama-2-70B on h100-a100-l4's 60 s solve no
better, the tables three times the time."""


def _exact_class(uses: np.ndarray, resources: np.ndarray, weights: np.ndarray) -> int | None:
    """The resource kept exact in the relaxation (``_ExactTables``): of those whose count
    in blocks (the gcd of what its options take) needs at most ``EXACT_STATES`` states and
    whose paths' work is at most ``EXACT_WORK``, the one of most compute (count × weight):
    its GPUs are the ones a priced relaxation spends fractionally the most (Llama-2-70B on
    16 H100 + 16 A100 + 16 L4: the H100s). None where there is none, or a single resource
    (its price alone already bounds it)."""
    if len(resources) < 2:
        return None
    best, chosen = 0.0, None
    for k in range(len(resources)):
        taken = uses[:, k][uses[:, k] > 0]
        if not len(taken) or resources[k] <= 0:
            continue
        block = int(np.gcd.reduce(taken.astype(np.int64)))
        states = int(resources[k]) // block + 1
        counts = np.unique(taken) // block
        # The paths' work: a stage of c blocks from each of the states - c counts below.
        if states > EXACT_STATES or int((states - counts[counts < states]).sum()) > EXACT_WORK:
            continue
        share = float(resources[k] * weights[k])
        if share > best:
            best, chosen = share, k
    return chosen


@dataclass
class _ExactTables:
    """One class k counted exactly, the others priced: with μ >= 0 zero on k, and f blocks
    of k free,

        E_μ[0, i)(A, f) = min over partitions of [0, i) and options with every c <= A and
                          Σ_s u_k(o_s) <= f of Σ_s (c(o_s, s) + μ · u(o_s))

    A pipeline P of peak A* <= A within the resources is such a partition of [0, n) with
    f = R_k, and Σ_s μ · u <= μ · R: Σ_s f_s >= E_μ(A, R_k) - μ · R, the same weak duality
    as the priced D, with k's count kept instead of priced (μ_k = 0 is no loss: with
    Σ u_k <= f counted, μ_k (Σ u_k - f) <= 0). So the run's bound takes at each cap the
    larger of D and this. The stages in front of a partial pipeline with ``free`` left use
    at most free_k of k (in blocks: at most floor(free_k / block)), so its completion floor
    reads E at [0, start) and that count, less μ · free. Stage counts are not kept here
    (fewer constraints: still a bound).

    Made as a shortest path over the layers whose state is the blocks of k used so far (0
    to R_k / block, ``EXACT_STATES`` at most), on every ``EXACT_STEP``-th cap."""

    prefix: np.ndarray  # [i, f, price, point]: E over [0, i) with at most f blocks of k
    prices: np.ndarray  # [price, resource]: the run's prices with k's zeroed, distinct
    at: np.ndarray  # [g]: the point (of ``prefix``) each cap of the grid reads
    whole: np.ndarray  # [g]: max over prices of E[0, n)(A_g, R_k) - μ · R
    exact: int  # k
    block: int  # GPUs of k in one block

    def on(self, grid: np.ndarray, points: np.ndarray) -> _ExactTables:
        """These tables (made on ``grid[points]``) read from every cap of ``grid``: each
        cap at the next point at or above it."""
        at = np.searchsorted(points, np.arange(len(grid)), "left")
        return _ExactTables(self.prefix, self.prices, at, self.whole[at], self.exact, self.block)

    def completion(self, starts: np.ndarray, free: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """[row, cap]: max over prices of E[0, start)(A_cap, free_k) - μ · free, at the grid
        caps ``caps``; -inf where free_k is outside the table (no figure)."""
        states = self.prefix.shape[1]
        blocks = free[:, self.exact] // self.block
        inside = (blocks >= 0) & (blocks < states)
        taken = self.prefix[starts, np.clip(blocks, 0, states - 1)][:, :, self.at[caps]]
        out: np.ndarray = (taken - (free @ self.prices.T)[:, :, None]).max(axis=1)
        out[~inside] = -math.inf
        return out


def _exact_tables(run: _Run, grid: np.ndarray) -> _ExactTables:
    """``_ExactTables`` of ``run``'s exact class on the caps ``grid`` (inf last)."""
    k = run.exact
    assert k is not None
    n = run.n
    taken = run.uses[:, k]
    block = int(np.gcd.reduce(taken[taken > 0].astype(np.int64)))
    states = int(run.resources[k]) // block + 1
    prices = run.prices.copy()
    prices[:, k] = 0.0
    prices = np.unique(prices, axis=0)
    caps = grid
    first = _cells(n)
    best = np.full((n + 1, states, len(prices), len(caps)), math.inf)
    best[0, 0] = 0.0
    by_block: list[tuple[int, np.ndarray]] = []
    for used in np.unique(taken):
        count = int(used) // block
        if count >= states:
            continue
        rows = np.flatnonzero(taken == used)
        by_block.append((count, _capped(run.stages[rows], run.uses[rows] @ prices.T, caps)))
    for i in range(n):
        here = best[i]  # [f, price, point]
        for count, cost in by_block:
            # [end, f, price, point]: from f blocks at i, a stage of ``count`` blocks to end.
            stage = cost[first[i] : first[i + 1]][:, None]
            ahead = best[i + 1 :, count:]
            np.minimum(ahead, stage + here[None, : states - count], out=ahead)
    prefix = np.minimum.accumulate(best, axis=1)
    whole_at = (prefix[n, states - 1] - (prices @ run.resources)[:, None]).max(axis=0)
    every = np.arange(len(caps))
    return _ExactTables(prefix, prices, every, whole_at, k, block)


def _capped(stages: np.ndarray, priced: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """[cell, price, cap]: per stage cell, the least c + μ · u over the options of
    ``stages`` ([option, cell]: c) with c <= cap, inf where none; ``priced`` [option,
    price]: μ · u of each option."""
    order = np.argsort(stages, axis=0, kind="stable")
    flat = np.take_along_axis(stages, order, axis=0)  # (options, cells)
    options, cells = flat.shape
    padded = np.empty((options + 1, cells, priced.shape[1]))
    padded[0] = math.inf
    padded[1:] = flat[:, :, None] + priced[order]
    np.minimum.accumulate(padded, axis=0, out=padded)
    # counts[cell, cap]: options of floor <= cap on the cell.
    counts = (flat[:, :, None] <= caps[None, None, :]).sum(axis=0)
    taken: np.ndarray = padded[counts, np.arange(cells)[:, None]]  # [cell, cap, price]
    return np.ascontiguousarray(taken.transpose(0, 2, 1))
