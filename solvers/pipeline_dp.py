r"""Exact dynamic programming over pipelines whose stages draw on limited resources.

Problem. Cover layers 0..L-1 with p >= 1 contiguous, non-empty stages in pipeline order;
stage s covers [b_s, b_{s+1}) with an *option* o_s from a finite set. Option o uses a resource
vector u(o) ∈ ℕ^K (GPUs of each device class) and Σ_s u(o_s) <= R componentwise. A stage
costs (a_s, f_s, t_s, e_s) = cost(o_s, b_s, b_{s+1}, q_s, κ_{s+1}): steady-state time per
micro-batch, fill-and-drain time, tail, and e_s, what its boundary transfer adds to the *next*
stage's a and f (a blocking transfer holds both sides of the link); it depends on the stage's
position from the end q_s = p - s (memory in flight under 1F1B) and on the *link key*
κ_{s+1} of the next stage (what the boundary transfer to it costs); the stage's own key κ_s
comes with its cost. Cost may be infeasible (None). With a_{s+1} and f_{s+1} taken with
e_s added, minimise

    F = (m - 1) · max_s a_s + Σ_s f_s + max_s t_s

(the 1F1B / GPipe iteration time with m micro-batches plus the slowest tail), with p <= P.

Method: label setting from the last stage to the first. A label at layer i is a partial
pipeline covering [i, L): (M, S, U) = (max a, Σ f, max t) so far, A = a of its first stage
(before the stage in front of it adds its e), its stage count q, the resources it uses, and
the key of its first stage. Prepending a stage with (a, f, t, e) gives (max(M, A + e, a), S +
f + e, max(U, t)) and A = a. F is nondecreasing in M, S and U, and what the stages before i
can add depends only on (i, q, resources used, key) (e too: it is a function of the prepended
stage and the key), and no more for a key that ``key_covers`` another (a partial order of the
source's: a cheaper link for every sender); so a label b is dominated, and dropped, when
another a at the same i, with b's key or one covering it, has q and every resource <= b's
and S_a + (m - 1) max((M_a - M_b)^+, (A_a - A_b)^+) + (U_a - U_b)^+ <= S_b (``_dominates``:
a larger max may be paid for by a smaller sum; with M, A, S, U all <= it is the plain Pareto
rule). Labels at i are final
once every label at j > i has been extended, so positions are processed from L down to 1; the
answer is the best F among labels at 0.

Pruning (exact: never drops a label that could beat the bound u, the best F found so far or
given): ``floor_table(j)[o, i]`` is a lower bound on a_s and f_s of option o on [i, j), and
``prefix_table(R')[o, i]`` a lower bound on the max and, times ``fill_ratio``, on the sum
that stages covering [0, i) add with resources R' left, and ``send_floor(j, κ)[o]`` on half
of what the stage's boundary transfer to a label of key κ adds to its own a and f and to the
label's (2s); a stage whose (m - 1) · max(M, A + 2s, floor + 2s, prefix) + S + 2s + floor + 2s
+ prefix × fill + U >= u is skipped. These bounds are evaluated for every (option, start) of
a label at once, with numpy, on the options that fit in the resources it leaves (the others
cannot precede it); only the survivors are costed, each option from its shortest
surviving stage to its longest: a cost of None at i promises None at every smaller i (memory only
grows with more layers), which ends that option. With a ``CompletionBound`` (the run's
relaxation, ``solvers.relaxed_bound``), the same test is made again with its bound on what
the stages covering [0, i) add in place of the prefix bound, before costing and on each new
label.

Deterministic: options and starts are visited in a fixed order, ties keep the first label
found, and final labels are ranked by (F, insertion order).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from solvers.partition_dp import pipeline_objective

__all__ = [
    "CompletionBound",
    "PipelineLabel",
    "StageCostResult",
    "StageSource",
    "best_pipelines",
]


@dataclass(frozen=True)
class StageCostResult:
    """What one stage costs: (a, f, t), its own link key and an opaque description; and what
    its boundary transfer adds to the next stage's a and f (module docstring)."""

    steady_ms: float
    fill_ms: float
    tail_ms: float
    key: Hashable
    payload: object
    next_added_ms: float = 0.0


class CompletionBound(Protocol):
    """A bound on what the stages in front of partial pipelines add
    (``solvers.relaxed_bound.RunRelaxation``)."""

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
        covering [start, L) with (M, S, U) and ``free[row]`` resources left (M, S with
        what the stage in front adds to its first stage's a, as far as known); a row whose
        bound reaches ``limit`` may have any value that does."""
        ...


class StageSource(Protocol):
    """The problem's options and costs (module docstring)."""

    def options(self) -> Sequence[tuple[int, ...]]:
        """The resource vector u(o) of each option, indexed by option."""
        ...

    def floor_table(self, j: int) -> np.ndarray:
        """``out[o, i]`` for i < j: a lower bound on a and f of option o on [i, j),
        nonincreasing in i."""
        ...

    def fill_ratio(self, free: np.ndarray, usable: np.ndarray) -> np.ndarray:
        """``out[o]`` >= 1: ``prefix_table(free)[o] × out[o]`` is a lower bound on Σ f of
        stages covering [0, i) with ``free[o]`` resources left, each one of the options where
        ``usable`` is true."""
        ...

    def send_floor(self, j: int, next_key: Hashable | None) -> np.ndarray:
        """``out[o]``: a lower bound on half of what option o's boundary transfer at j to a
        stage of key ``next_key`` adds to the stage's a and f, and on half its e (a blocking
        transfer each way); zeros when ``next_key`` is None."""
        ...

    def prefix_table(self, free: np.ndarray) -> np.ndarray:
        """``out[r, i]``: a lower bound on max a, and on Σ f, of stages covering [0, i) with
        ``free[r]`` resources left (row by row: the DP asks for the rows of the options that
        fit, of labels, ...); 0 at i = 0, nondecreasing in i, inf where nothing can cover
        the layers."""
        ...

    def cost(
        self, option: int, i: int, j: int, position: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        """The stage's cost, or None when it does not fit (then None for every smaller i)."""
        ...

    def key_covers(self, low: Hashable, high: Hashable) -> bool:
        """Whether every stage placed before a label of key ``low`` costs no more (a, f, t
        and e alike) than before one of key ``high`` (``_Fronts``); ``low == high`` at
        least."""
        ...


@dataclass
class PipelineLabel:
    """A partial pipeline covering [start, L) (module docstring)."""

    max_stage: float
    sum_stage: float
    max_tail: float
    stages: int
    used: tuple[int, ...]
    key: Hashable | None
    start: int
    payload: object
    previous: PipelineLabel | None
    order: int
    first_stage: float = 0.0  # a of its first stage, without what the stage before adds

    def objective(self, m: int) -> float:
        return pipeline_objective(self.max_stage, self.sum_stage, self.max_tail, m)

    def chain(self) -> list[PipelineLabel]:
        """The labels of its stages in pipeline order (first stage first)."""
        out = []
        label: PipelineLabel | None = self
        while label is not None and label.previous is not None:
            out.append(label)
            label = label.previous
        return out


def _dominates(a: PipelineLabel, b: PipelineLabel, m: int) -> bool:
    """Whether every completion of ``b`` costs at least the same completion of ``a``: with
    the stages before them adding (X, Y, Z) to (M, S, U), F_a - F_b = (m - 1)(max(M_a, X) -
    max(M_b, X)) + S_a - S_b + max(U_a, Z) - max(U_b, Z) <= (m - 1)(M_a - M_b)^+ + S_a - S_b
    + (U_a - U_b)^+, so a's larger max may be paid for by a smaller sum. The stages before
    cost no more after a when a has no more stages (less in flight) and no more GPUs used."""
    if a.stages > b.stages or any(x > y for x, y in zip(a.used, b.used, strict=True)):
        return False
    # The stage before adds the same e to both first stages: max(M_a, A_a + e, X) -
    # max(M_b, A_b + e, X) <= max((M_a - M_b)^+, (A_a - A_b)^+).
    peak = max(a.max_stage - b.max_stage, a.first_stage - b.first_stage, 0.0)
    excess = (m - 1) * peak + max(0.0, a.max_tail - b.max_tail)
    return a.sum_stage + excess <= b.sum_stage


_Entry = tuple[float, float, float, float, int, tuple[int, ...], int, PipelineLabel]
"""A kept label's dominance figures: (S, M, A, U, stages, used, insertion number, label)."""


class _Front:
    """The labels kept at one position, by link key, each key's sorted by their sum S
    (``insert``). A new label is compared only with the labels of the keys that cover its
    own or that its own covers (``_Keys.related``: a few of the ~20 keys at a position), and
    of those, for being dominated, only with the labels of no larger S (a bisection), and
    for dominating, only with those of no smaller S: the rest cannot pass the test (its
    excess is never negative). One Python pass over those: a front holds a few dozen to a
    few hundred labels, where a numpy pass per test paid its per-call overhead a dozen times
    per insert (~48 µs) and per-pair calls of ``_dominates`` were 70% of a large search.
    The test is the same, term by term in the same order."""

    def __init__(self, resources: int, keys: _Keys) -> None:
        self.keys = keys
        # key id -> (the sums, ascending; the entries in that order)
        self.groups: dict[int, tuple[list[float], list[_Entry]]] = {}
        self.inserted = 0

    def insert(self, new: PipelineLabel, m: int) -> bool:
        """Keep ``new`` unless a kept label dominates it (``_dominates``); drop the kept
        labels it dominates. Across link keys too: a label whose key ``covers`` another's
        (every stage in front of it costs no more) dominates by the same rule, since what the
        stages before add only grows with their costs."""
        keys = self.keys
        kid = keys.index(new.key)
        covering = keys.rows_covering[kid]  # [x]: key x equals or covers new's
        covered = keys.rows_covered[kid]  # [x]: new's key equals or covers key x
        related = keys.related[kid]
        total, peak_new, first_new, tail_new = (
            new.sum_stage,
            new.max_stage,
            new.first_stage,
            new.max_tail,
        )
        stages, used = new.stages, new.used
        slope = m - 1
        groups = self.groups
        # A kept label dominates new only if its sum is no larger (the excess is >= 0) and
        # its key equals or covers new's.
        for x in related:
            group = groups.get(x)
            if group is None or not covering[x]:
                continue
            sums, entries = group
            for index in range(bisect.bisect_right(sums, total)):
                s, peak, first, tail, count, own, _order, _label = entries[index]
                if count <= stages and all(map(operator.le, own, used)):
                    excess = slope * max(max(peak - peak_new, first - first_new), 0.0)
                    excess += max(0.0, tail - tail_new)
                    if s + excess <= total:
                        return False
        for x in related:
            group = groups.get(x)
            if group is None or not covered[x]:
                continue
            sums, entries = group
            dropped = []
            for index in range(bisect.bisect_left(sums, total), len(sums)):
                s, peak, first, tail, count, own, _order, _label = entries[index]
                if stages <= count and all(map(operator.le, used, own)):
                    excess = slope * max(max(peak_new - peak, first_new - first), 0.0)
                    excess += max(0.0, tail_new - tail)
                    if total + excess <= s:
                        dropped.append(index)
            if dropped:
                for index in reversed(dropped):
                    del sums[index]
                    del entries[index]
        group = groups.get(kid)
        if group is None:
            group = groups[kid] = ([], [])
        sums, entries = group
        at = bisect.bisect_right(sums, total)
        sums.insert(at, total)
        entries.insert(at, (total, peak_new, first_new, tail_new, stages, used, self.inserted, new))
        self.inserted += 1
        return True

    def by_key(self) -> dict[Hashable, list[PipelineLabel]]:
        """The kept labels by key, each key's in insertion order (keys in the order of
        their first kept label)."""
        kept = sorted(
            (entry for _sums, entries in self.groups.values() for entry in entries),
            key=lambda entry: entry[6],
        )
        out: dict[Hashable, list[PipelineLabel]] = {}
        for entry in kept:
            label = entry[7]
            out.setdefault(label.key, []).append(label)
        return out


class _Keys:
    """The link keys met in one search, numbered, with the source's ``key_covers`` between
    every two of them as rows of booleans (``rows_covering[k][x]``: key x equals or covers
    key k; ``rows_covered[k][x]``: key k equals or covers key x)."""

    def __init__(self, covers: Callable[[Hashable, Hashable], bool]) -> None:
        self.covers = covers
        self.keys: list[Hashable] = []
        self.ids: dict[Hashable, int] = {}
        self.rows_covering: list[list[bool]] = []
        self.rows_covered: list[list[bool]] = []
        # [k]: the keys that equal, cover or are covered by key k, ascending
        self.related: list[list[int]] = []

    def index(self, key: Hashable) -> int:
        found = self.ids.get(key)
        if found is not None:
            return found
        found = len(self.keys)
        self.keys.append(key)
        self.ids[key] = found
        covering: list[bool] = []
        covered: list[bool] = []
        for other, known in enumerate(self.keys):
            # [other, found]: known covers key; [found, other]: key covers known.
            low = known == key or bool(self.covers(known, key))
            high = known == key or bool(self.covers(key, known))
            covering.append(low)
            covered.append(high)
            if other < found:
                self.rows_covered[other].append(low)
                self.rows_covering[other].append(high)
                if low or high:
                    self.related[other].append(found)
        self.rows_covering.append(covering)
        self.rows_covered.append(covered)
        self.related.append([x for x in range(found + 1) if covering[x] or covered[x]])
        return found


def _narrowed(
    by_key: dict[Hashable, list[PipelineLabel]],
    beam: int,
    source: StageSource,
    capacity: np.ndarray,
    j: int,
    m: int,
) -> dict[Hashable, list[PipelineLabel]]:
    """The ``beam`` labels at position j of least estimated F (ties by insertion order)."""
    labels = [label for key in sorted(by_key, key=repr) for label in by_key[key]]
    if len(labels) <= beam:
        return by_key
    free = capacity[None, :] - np.array([label.used for label in labels], dtype=np.int64)
    rest = source.prefix_table(free)[:, j]
    estimate = [
        pipeline_objective(max(label.max_stage, pre), label.sum_stage + pre, label.max_tail, m)
        for label, pre in zip(labels, rest.tolist(), strict=True)
    ]
    chosen = sorted(range(len(labels)), key=lambda x: (estimate[x], labels[x].order))[:beam]
    kept: dict[Hashable, list[PipelineLabel]] = {}
    for x in sorted(chosen):
        kept.setdefault(labels[x].key, []).append(labels[x])
    return kept


@dataclass
class _Stats:
    labels: int = 0
    costed: int = 0
    timed_out: bool = False
    # No pipeline the search did not return is below this (``best_pipelines``).
    floor_ms: float = math.inf


def _open_floor(
    labels: list[PipelineLabel],
    source: StageSource,
    capacity: np.ndarray,
    uses: np.ndarray,
    m: int,
) -> float:
    """The least F any completion of ``labels`` can reach: each label's own (M, S, U) with
    the prefix bound of what it leaves uncovered, [0, start) with its free resources, added
    to its max and, times the fill ratio, to its sum (``StageSource.prefix_table``,
    ``fill_ratio``); inf for no labels."""
    if not labels:
        return math.inf
    free = capacity[None, :] - np.array([label.used for label in labels], dtype=np.int64)
    table = source.prefix_table(free)
    rest = table[np.arange(len(labels)), [label.start for label in labels]]
    # Per label, the ratio over the options that fit in its free resources: once per distinct
    # free vector (many labels share one; a search cut late leaves 100k+ labels open).
    rows, which = np.unique(free, axis=0, return_inverse=True)
    per_row = [
        float(source.fill_ratio(row[None, :], np.all(uses <= row, axis=1))[0]) for row in rows
    ]
    ratios = [per_row[x] for x in np.asarray(which).reshape(-1).tolist()]
    return min(
        pipeline_objective(
            max(label.max_stage, pre), label.sum_stage + pre * ratio, label.max_tail, m
        )
        for label, pre, ratio in zip(labels, rest.tolist(), ratios, strict=True)
    )


LEFT_TABLES = 4096
"""Most resource vectors ``best_pipelines`` keeps the tables of what a label leaves for."""


class _Left(NamedTuple):
    """What a label leaving some resources offers the stages in front (``_left_tables``)."""

    rows: np.ndarray  # the options that fit in them, ascending
    prefix: np.ndarray  # [row, i]: the prefix bound of the stages before each, every start
    fill: np.ndarray  # [row, i]: that times their fill ratio


def _left_tables(source: StageSource, uses: np.ndarray, free: np.ndarray) -> _Left:
    """For a label leaving ``free`` resources: which options fit in them, and for those the
    prefix bound of the stages before each (every start) with what it leaves, and that
    times their fill ratio. They depend on the resources alone, and the labels at every
    position share a few hundred resource vectors: computed once per vector. Only the
    options that fit (~a quarter on Llama-2-70B's 48 GPUs) are kept: the DP's bounds are
    computed on their rows alone."""
    fits = np.all(uses <= free, axis=1)
    rows = np.flatnonzero(fits)
    if not len(rows):
        return _Left(rows, np.zeros((0, 0)), np.zeros((0, 0)))
    # Row by row, on the rows that fit alone (the tables are per row).
    after = free - uses[rows]
    prefix = source.prefix_table(after)
    fill = prefix * source.fill_ratio(after, fits)[:, None]
    return _Left(rows, prefix, fill)


def best_pipelines(
    num_layers: int,
    num_micro_batches: int,
    resources: tuple[int, ...],
    source: StageSource,
    *,
    max_stages: int,
    exact_stages: int | None = None,
    min_stages: int = 1,
    upper_bound: float = math.inf,
    keep: int = 1,
    splits: Iterable[int] | None = None,
    deadline: float | None = None,
    beam: int | None = None,
    completion: CompletionBound | None = None,
    deeper: Sequence[CompletionBound] = (),
) -> tuple[list[PipelineLabel], _Stats]:
    """Up to ``keep`` complete pipelines, best first: the first is optimal among pipelines
    with F < ``upper_bound`` (none when none beats it), the others the best the search
    completed on its way.

    ``max_stages`` caps p; ``exact_stages`` pins it; ``min_stages`` is the least p accepted
    (GPipe plans with more stages than micro-batches use it). ``splits``, if given, pins the
    stage boundaries (the cut points between stages). Past ``deadline`` (a
    ``time.monotonic()`` value) the search stops with what it has completed and says so in
    its stats (``timed_out``): the pipelines returned are then not proven optimal.

    ``beam`` makes it a heuristic: at each position only the ``beam`` labels of least
    estimated F (their own plus the prefix bound of what is left) are extended. Quick, and its
    best is a good incumbent for the exact search that follows (a tighter ``upper_bound``
    prunes far more); never the final answer.

    ``completion``, if given, bounds what the stages in front of a partial pipeline add
    (``CompletionBound``): a stage whose label would reach the bound pruned against is not
    costed, and a new label that does is not kept. ``deeper[q - 1]``, if given, takes its
    place in front of a stage placed before q >= 1 others (the last for every q past the
    list): a caller's bound that holds only there (stages deeper in a 1F1B pipeline hold more
    micro-batches in flight, so more memory: ``autoplan.solve.hetero``)."""
    m = num_micro_batches
    options = source.options()
    covers = getattr(source, "key_covers", None) or (lambda low, high: False)
    stats = _Stats()
    cap = max_stages if exact_stages is None else min(max_stages, exact_stages)
    allowed_cuts = None if splits is None else set(splits) | {0, num_layers}
    keys = _Keys(covers)
    fronts: dict[int, _Front] = {}
    counter = 0
    root = PipelineLabel(0.0, 0.0, 0.0, 0, (0,) * len(resources), None, num_layers, None, None, 0)
    fronts[num_layers] = _Front(len(resources), keys)
    fronts[num_layers].insert(root, m)
    finals: list[PipelineLabel] = []
    bound = upper_bound

    def threshold() -> float:
        # Pruning against the best F found keeps the best exact; the runners-up kept are the
        # best other pipelines the search completed, not necessarily the global 2nd..k-th.
        return min(bound, finals[0].objective(m)) if finals else bound

    uses = np.array(options, dtype=np.int64).reshape(len(options), len(resources))
    capacity = np.array(resources, dtype=np.int64)
    # Per resources used: what a label leaves to the stages in front (``_left_tables``).
    left: dict[tuple[int, ...], _Left] = {}
    for j in range(num_layers, 0, -1):
        front = fronts.pop(j, None)
        if front is None:
            continue
        by_key = front.by_key()
        floors = source.floor_table(j)  # (options, j)
        starts = np.arange(j)
        # Stage-count rules per start: the first stage (i = 0) needs >= min_stages stages,
        # the others leave room for one more stage before the cap.
        cuts_ok = np.ones(j, dtype=bool)
        if allowed_cuts is not None:
            cuts_ok = np.isin(starts, sorted(allowed_cuts))
        # Per stage count of the label: the starts its stage may take (``cuts_ok`` and the
        # rules above).
        allowed: dict[int, np.ndarray] = {}
        if beam is not None:
            by_key = _narrowed(by_key, beam, source, capacity, j, m)
        for next_key in sorted(by_key, key=repr):
            # Per resources used: the transfers and floors of the stages of labels of this key
            # (the same for every such label).
            stage_of: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
            for label in by_key[next_key]:
                if deadline is not None and time.monotonic() > deadline:
                    # Every pipeline not found goes through a label not yet extended: here
                    # or at a position still ahead (the rest were pruned against the bound,
                    # or dominated by one kept).
                    stats.timed_out = True
                    open_labels = [x for labels in by_key.values() for x in labels]
                    for ahead in fronts.values():
                        open_labels += [x for labels in ahead.by_key().values() for x in labels]
                    open_floor = _open_floor(open_labels, source, capacity, uses, m)
                    stats.floor_ms = min(threshold(), open_floor) if beam is None else 0.0
                    return finals, stats
                if label.stages >= cap:
                    continue
                limit = threshold()
                if label.objective(m) >= limit:
                    continue
                position = label.stages + 1
                free = capacity - np.array(label.used, dtype=np.int64)
                tables = left.get(label.used)
                if tables is None:
                    tables = _left_tables(source, uses, free)
                    if len(left) < LEFT_TABLES:
                        left[label.used] = tables
                # The stage's options: those that fit in what this label leaves (rows of
                # ``tables``); the stages before it are options that fit in what it leaves.
                fit = tables.rows
                if not len(fit):
                    continue
                prefix = tables.prefix[:, :j]
                fill = tables.fill[:, :j]
                stage_ok = allowed.get(position)
                if stage_ok is None:
                    stage_ok = cuts_ok & np.where(
                        starts == 0, position >= min_stages, position < cap
                    )
                    allowed[position] = stage_ok
                # The stage's own transfers, and the same added to the label's first stage
                # (the root label has none after it).
                found = stage_of.get(label.used) if label.stages else None
                if found is None:
                    sends = 2 * source.send_floor(j, next_key)[fit] if label.stages else np.zeros(1)
                    found = (sends, floors[fit] + sends[:, None])
                    if label.stages:
                        stage_of[label.used] = found
                sends, stage = found
                head = label.first_stage + sends[:, None]
                peak = np.maximum(np.maximum(np.maximum(label.max_stage, head), stage), prefix)
                if m > 1:
                    reach = (m - 1) * peak + label.sum_stage + sends[:, None] + stage + fill
                    reach += label.max_tail
                else:
                    with np.errstate(invalid="ignore"):  # 0 × inf: no candidate
                        reach = (m - 1) * peak + label.sum_stage + sends[:, None] + stage + fill
                        reach += label.max_tail
                # (A NaN, from 0 × inf at m = 1, is no candidate: NaN < limit is false.)
                # The candidate stages, (row, start) row by row, starts ascending.
                rows, cols = np.nonzero(stage_ok[None, :] & (reach < limit))
                in_front = completion
                if deeper and label.stages:
                    in_front = deeper[min(label.stages, len(deeper)) - 1]
                if in_front is not None and len(rows):
                    # The same figures as ``reach``, with the relaxation's bound on what
                    # the stages before add in place of the prefix bound.
                    sent = np.broadcast_to(sends, (len(fit),))[rows]
                    heads = label.first_stage + sent
                    own = stage[rows, cols]
                    floor = in_front.completion_floors(
                        cols,
                        np.maximum(np.maximum(label.max_stage, heads), own),
                        label.sum_stage + sent + own,
                        np.full(len(rows), label.max_tail),
                        free[None, :] - uses[fit[rows]],
                        limit,
                    )
                    kept = ~(floor >= limit)
                    rows, cols = rows[kept], cols[kept]
                pending: list[PipelineLabel] = []
                for row, cells in itertools.groupby(
                    zip(rows.tolist(), cols.tolist(), strict=True), key=operator.itemgetter(0)
                ):
                    option = int(fit[row])
                    use = options[option]
                    for i in [cell[1] for cell in cells][::-1]:
                        if reach[row, i] >= threshold():
                            continue
                        stats.costed += 1
                        result = source.cost(option, i, j, position, next_key)
                        if result is None:
                            break
                        pre = float(prefix[row, i])
                        pre_fill = float(fill[row, i])
                        added = result.next_added_ms if label.stages else 0.0
                        new = PipelineLabel(
                            max(label.max_stage, label.first_stage + added, result.steady_ms),
                            label.sum_stage + result.fill_ms + added,
                            max(label.max_tail, result.tail_ms),
                            position,
                            tuple(u + x for u, x in zip(label.used, use, strict=True)),
                            result.key,
                            i,
                            result.payload,
                            label,
                            0,
                            result.steady_ms,
                        )
                        if (
                            pipeline_objective(
                                max(new.max_stage, pre), new.sum_stage + pre_fill, new.max_tail, m
                            )
                            >= threshold()
                        ):
                            continue
                        if i > 0:
                            pending.append(new)
                            continue
                        counter += 1
                        new.order = counter
                        if exact_stages is not None and position != exact_stages:
                            continue
                        finals.append(new)
                        finals.sort(key=lambda x: (x.objective(m), x.order))
                        del finals[keep:]
                if pending and in_front is not None:
                    # The new labels' own figures against what the stages before can add,
                    # all of this label's at once (in front of the same stage as above).
                    floor = in_front.completion_floors(
                        np.array([x.start for x in pending]),
                        np.array([x.max_stage for x in pending]),
                        np.array([x.sum_stage for x in pending]),
                        np.array([x.max_tail for x in pending]),
                        capacity[None, :] - np.array([x.used for x in pending], dtype=np.int64),
                        threshold(),
                    )
                    limit = threshold()
                    pending = [x for x, f in zip(pending, floor.tolist(), strict=True) if f < limit]
                for new in pending:
                    counter += 1
                    new.order = counter
                    if new.start not in fronts:
                        fronts[new.start] = _Front(len(resources), keys)
                    if fronts[new.start].insert(new, m):
                        stats.labels += 1
                pending = []
    # The beam drops labels unbounded: no floor is claimed.
    stats.floor_ms = threshold() if beam is None else 0.0
    return finals, stats
