"""A cp group across GPU types in the cost model (autoplan.cost.context_span and the lockstep
ring of autoplan.cost.context_parallel): the ring worked by hand, equal counts against today's
cp costs, and uneven counts against the layer at the rank's token share."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.context_parallel import lockstep_ring, ring_attention_comm
from autoplan.cost.context_span import (
    ContextMember,
    ContextSpan,
    span_layer_costs,
    span_pass_ms,
)
from autoplan.cost.layers import layer_cost
from autoplan.cost.model import CostModel
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from tests.synthetic_profiles import gpu, make_cluster

ROOT = Path(__file__).resolve().parents[1]
FAST = gpu("Fast", 200.0, 80.0)
SLOW = gpu("Slow", 100.0, 80.0)


def test_lockstep_ring_by_hand() -> None:
    # 8 tokens split 6 : 2; K, V of 1e8 bytes a token; rank 0 -> 1 at 100 GB/s, 1 -> 0 at
    # 50 GB/s. Both ranks' whole cores take 8 ms forward, 16 ms backward.
    ring = lockstep_ring((6, 2), (8.0, 8.0), (16.0, 16.0), 1e8, [(100.0, 0.0), (50.0, 0.0)])
    # Forward step 0: rank 0 attends its own 6 tokens (8 · 6/8 = 6 ms) and sends them
    # (6e8 B at 100 GB/s = 6 ms); rank 1 attends 2 (2 ms), sends 2e8 B at 50 GB/s (4 ms): 6.
    # Step 1 (no send): rank 0 attends rank 1's 2 tokens (2 ms), rank 1 rank 0's 6 (6 ms): 6.
    assert ring.forward_ms == pytest.approx(12.0)
    # Backward step 0: rank 0 attends 12 ms, sends 1.2e9 B (12 ms); rank 1 4 ms, 4e8 B at
    # 50 GB/s (8 ms): 12. Step 1: 4 and 12 ms: 12. Last hop, each chunk's dK, dV home: rank 0
    # sends rank 1's 2e8 B (2 ms), rank 1 rank 0's 6e8 B at 50 GB/s (12 ms): 12.
    assert ring.backward_ms == pytest.approx(36.0)
    assert ring.buffer_bytes == pytest.approx(6e8)  # the larger chunk, in flight
    # A slower link back (20 GB/s): rank 1's forward send (10 ms) is step 0's slowest.
    slow = lockstep_ring((6, 2), (8.0, 8.0), (16.0, 16.0), 1e8, [(100.0, 0.0), (20.0, 0.0)])
    assert slow.forward_ms == pytest.approx(10.0 + 6.0)
    # Without a bandwidth the sends take no time: the steps are the attends alone.
    free = lockstep_ring((6, 2), (8.0, 8.0), (16.0, 16.0), 1e8, [(None, 0.0)] * 2)
    assert (free.forward_ms, free.backward_ms) == pytest.approx((12.0, 24.0))


def test_equal_counts_are_the_even_ring() -> None:
    # The even ring's hand case (test_context_parallel_cost): a 1 GB chunk at 100 GB/s, cp 4,
    # cores of 20 and 100 ms: 15 ms exposed forward, the 10 ms last hop backward.
    even = ring_attention_comm(1e9, 4, 20.0, 100.0, 100.0, 0.0)
    ring = lockstep_ring((4, 4, 4, 4), (20.0,) * 4, (100.0,) * 4, 1e9 / 4, [(100.0, 0.0)] * 4)
    assert ring.forward_ms == pytest.approx(20.0 + even.forward_ms)
    assert ring.backward_ms == pytest.approx(100.0 + even.backward_ms)
    assert ring.buffer_bytes == pytest.approx(even.buffer_bytes)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return read_json_model(ROOT / "profiles" / "gpt2-small.profile.json", Profile)


def _model(profile: Profile) -> CostModel:
    cluster = make_cluster([("f", FAST, 8, 1), ("s", SLOW, 8, 1)])
    return CostModel(profile, cluster, gpu_specs(cluster))


@pytest.mark.parametrize("tp", [1, 2])
def test_one_member_of_equal_counts_costs_as_the_cp_tables(profile: Profile, tp: int) -> None:
    model = _model(profile)
    cp, seq = 4, profile.seq_len
    (costs,) = span_layer_costs(model, ContextSpan((ContextMember(0, cp, seq // cp),), tp), 2)
    tables = model.tables(0, tp, 2, cp=cp)
    assert len(costs) == len(tables.alone) == len(profile.layers)
    for span_cost, today in zip(costs, tables.alone, strict=True):
        assert span_cost.forward_ms() == pytest.approx(today.forward_ms(), rel=1e-12)
        for mode in ("none", "selective", "full"):
            assert span_cost.backward_ms(mode) == pytest.approx(today.backward_ms(mode), rel=1e-12)
        assert span_cost.saved_bytes == pytest.approx(today.saved_bytes, rel=1e-12)
        assert span_cost.ring_buffer_bytes == pytest.approx(today.ring_buffer_bytes, rel=1e-12)
        assert span_cost.params_per_gpu == today.params_per_gpu


def test_uneven_ranks_compute_and_keep_their_tokens_share(profile: Profile) -> None:
    model = _model(profile)
    seq = profile.seq_len  # 1024: a Fast rank holds 640, a Slow rank 384
    span = ContextSpan((ContextMember(0, 1, 640), ContextMember(1, 1, 384)), 1)
    assert span.rank_tokens() == (640, 384) and span.cp == 2 and span.seq_len == seq
    fast, slow = span_layer_costs(model, span, 2)
    block = next(i for i, layer in enumerate(profile.layers) if layer.selective_recompute_flops)
    for member, costs, spec, tokens in ((0, fast, FAST, 640), (1, slow, SLOW, 384)):
        alone = layer_cost(
            profile.layers[block],
            model.classes[member].gpu,
            model.peak_tflops_of(spec.name),
            tp=1,
            micro_batch_size=2,
            profile_micro_batch_size=profile.micro_batch_size,
        )
        share = tokens / seq
        # Activations are the rank's tokens' (linear in them), weights are whole.
        assert costs[block].saved_bytes["none"] == pytest.approx(alone.saved_bytes["none"] * share)
        assert costs[block].params_per_gpu == alone.params_per_gpu
        assert costs[block].forward_compute_ms < alone.forward_compute_ms
        # Two ranks of one ring: both carry the larger (640-token) chunk's K, V in flight.
        assert costs[block].ring_buffer_bytes == fast[block].ring_buffer_bytes
    # The ranks meet at every ring: the group's pass is per layer its slowest member's.
    forward, backward = span_pass_ms((fast, slow), 0, len(fast), "none")
    assert forward == pytest.approx(
        sum(max(f.forward_ms(), s.forward_ms()) for f, s in zip(fast, slow, strict=True))
    )
    assert backward >= max(sum(c.backward_ms("none") for c in m) for m in (fast, slow)) - 1e-9
    # Speed-proportional tokens beat the even split on these two kinds (2 : 1 in peak).
    even = ContextSpan((ContextMember(0, 1, 512), ContextMember(1, 1, 512)), 1)
    even_forward, _ = span_pass_ms(span_layer_costs(model, even, 2), 0, len(fast), "none")
    assert forward < even_forward
    with pytest.raises(ValueError, match="span tokens sum to 1000"):
        span_layer_costs(model, ContextSpan((ContextMember(0, 2, 500),), 1), 2)
