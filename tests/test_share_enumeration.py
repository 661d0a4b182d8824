"""The in-process share enumeration (``solvers.share_ilp._enumerate``, vectorised) against a
plain loop over every size tuple: the same choice, ties included (integer times make many),
and the same objective to the bit."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.share_ilp import ShareClass, ShareProblem, _enumerate, share_objective


def _loop(problem: ShareProblem):
    """Every (m, sizes) in lexicographic order; the least (objective, m, sizes)."""
    best = None
    last = problem.classes[-1]
    for m in sorted(problem.micro_batch_counts):
        if problem.global_batch % m:
            continue
        for head in itertools.product(*(sorted(c.sizes) for c in problem.classes[:-1])):
            left = problem.global_batch // m - sum(
                c.replicas * b for c, b in zip(problem.classes[:-1], head, strict=True)
            )
            if left <= 0 or left % last.replicas or left // last.replicas not in last.sizes:
                continue
            sizes = (*head, left // last.replicas)
            found = (share_objective(problem, m, sizes), m, sizes)
            if best is None or found < best:
                best = found
    return best


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 3),
            st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4)), min_size=0, max_size=6),
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([4, 6, 8, 12, 24]),
    st.integers(0, 12),
)
def test_the_vectorised_enumeration_is_the_loop(classes, batch, allreduce) -> None:
    problem = ShareProblem(
        global_batch=batch,
        micro_batch_counts=(1, 2, 3, 4, 6, 8, 12, 24),
        classes=tuple(
            ShareClass(n, {b: (float(t * b), float(t * b) / 2) for b, t in sizes})
            for n, sizes in classes
        ),
        allreduce_ms=float(allreduce),
        optimizer_ms=0.5,
    )
    found = _enumerate(problem)
    expected = _loop(problem)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found.objective, found.num_micro_batches, found.sizes) == expected
