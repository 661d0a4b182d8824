"""The token split of a cp group across GPU types (autoplan.solve.context_span): the splits
listed by hand, and the best one against a brute force over every (t1, t2) pair of the
sequence (oracle), with known answers: equal GPU types split evenly, the faster type holds
more tokens, a type short of memory holds fewer."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.context_span import ContextMember, ContextSpan
from autoplan.cost.model import CostModel
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from autoplan.solve.context_span import best_split, price_split, token_splits
from tests.synthetic_profiles import gpu, make_cluster

ROOT = Path(__file__).resolve().parents[1]


def test_token_splits_by_hand() -> None:
    assert token_splits((1, 1), 16) == [(t, 16 - t) for t in range(2, 15, 2)]
    # t1 + 3·t2 = 16 with both even: t2 = 2 or 4.
    assert token_splits((1, 3), 16) == [(4, 4), (10, 2)]
    # Under SP with tp 4 each rank's chunk splits over its tp group: multiples of 4.
    assert token_splits((1, 1), 16, tp=4, sequence_parallel=True) == [(4, 12), (8, 8), (12, 4)]
    # tp 3: multiples of 6 (even and divisible by 3) that sum to 16: none.
    assert token_splits((1, 1), 16, tp=3, sequence_parallel=True) == []
    assert token_splits((1, 1), 18, tp=3, sequence_parallel=True) == [(6, 12), (12, 6)]


@pytest.fixture(scope="module")
def profile() -> Profile:
    return read_json_model(ROOT / "profiles" / "gpt2-small.profile.json", Profile)


def _model(profile: Profile, slow_tflops: float, slow_memory_gib: float = 80.0) -> CostModel:
    fast = gpu("Fast", 200.0, 80.0, bandwidth=2000.0)
    slow = gpu("Slow", slow_tflops, slow_memory_gib, bandwidth=2000.0 * slow_tflops / 200.0)
    cluster = make_cluster([("f", fast, 8, 1), ("s", slow, 8, 1)], inter_gb_per_s=100.0)
    return CostModel(profile, cluster, gpu_specs(cluster))


def _brute_force(model: CostModel, ranks: tuple[int, int], layers: tuple[int, int], flight: int):
    """Every pair (t1, t2) of the sequence, checked here, priced; the fastest (smaller t1 on
    ties)."""
    seq, (n1, n2) = model.profile.seq_len, ranks
    best = None
    for t1 in range(1, seq):
        for t2 in range(1, seq):
            if n1 * t1 + n2 * t2 != seq or t1 % 2 or t2 % 2:
                continue
            span = ContextSpan((ContextMember(0, n1, t1), ContextMember(1, n2, t2)), 1)
            found = price_split(model, span, 2, layers, flight)
            if found is not None and (best is None or found.work_ms < best.work_ms):
                best = found
    return best


@pytest.mark.parametrize(
    ("slow_tflops", "ranks"), [(200.0, (1, 1)), (100.0, (1, 1)), (50.0, (2, 1))]
)
def test_best_split_is_the_brute_forces(profile: Profile, slow_tflops: float, ranks) -> None:
    model = _model(profile, slow_tflops)
    layers = (0, len(profile.layers))
    found = best_split(model, ((0, ranks[0]), (1, ranks[1])), 1, 2, layers, 1)
    expected = _brute_force(model, ranks, layers, 1)
    assert found is not None and expected is not None
    assert found.span == expected.span and found.work_ms == expected.work_ms
    t1, t2 = found.span.members[0].tokens, found.span.members[1].tokens
    if slow_tflops == 200.0:
        assert (t1, t2) == (512, 512)  # two equal types: the even split
    else:
        assert t1 > t2  # the faster type holds more tokens
        # The split nearest to equal chunks is slower.
        t1, t2 = min(token_splits(ranks, 1024), key=lambda split: abs(split[0] - split[1]))
        even = ContextSpan((ContextMember(0, ranks[0], t1), ContextMember(1, ranks[1], t2)), 1)
        priced = price_split(model, even, 2, layers, 1)
        assert priced is not None and found.work_ms < priced.work_ms


def test_a_type_short_of_memory_holds_fewer_tokens(profile: Profile) -> None:
    # Equal speeds; Slow has so little memory that 8 micro-batches of half the sequence's
    # activations at no recompute do not fit it, while Fast's 80 GiB hold everything.
    layers = (0, len(profile.layers))
    roomy = best_split(_model(profile, 200.0), ((0, 1), (1, 1)), 1, 2, layers, 8, ("none",))
    assert roomy is not None and roomy.span.rank_tokens() == (512, 512)
    tight_model = _model(profile, 200.0, slow_memory_gib=2.6)
    tight = best_split(tight_model, ((0, 1), (1, 1)), 1, 2, layers, 8, ("none",))
    assert tight is not None
    t1, t2 = tight.span.rank_tokens()
    assert t2 < 512 < t1
    assert tight.peak_bytes[1] <= tight_model.usable_bytes(1)
    # One more token pair on Slow would not fit: the split is memory's, not speed's.
    over = ContextSpan((ContextMember(0, 1, t1 - 2), ContextMember(1, 1, t2 + 2)), 1)
    assert price_split(tight_model, over, 2, layers, 8, ("none",)) is None
    assert best_split(_model(profile, 200.0, 0.1), ((0, 1), (1, 1)), 1, 2, layers, 8) is None
