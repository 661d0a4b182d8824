"""Context parallelism in the cost model (autoplan.cost.context_parallel): each term worked by
hand: the causal load balance, the ring's exposed sends, a layer's chunk, the memory, the
gradient reduction over dp × cp, and the search's cp view against evaluate."""

from __future__ import annotations

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.comm import ring_allreduce_ms
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice, with_cp
from autoplan.cost.context_parallel import (
    causal_work_share,
    core_backward_share,
    kv_bytes,
    load_balanced_chunks,
    ring_attention_comm,
)
from autoplan.cost.layers import layer_cost
from autoplan.cost.model import CostModel
from autoplan.profile.profiler import profile_model
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

A = gpu("A", 100.0, 80.0)


def test_contiguous_causal_chunks_are_unbalanced_and_the_zigzag_is_even() -> None:
    # cp 2, contiguous: rank 0 has the half square of piece 0 (0.5 of 2 squares), rank 1 one
    # full square and a half (1.5 of 2).
    assert causal_work_share(2, 0, balanced=False) == pytest.approx(0.25)
    assert causal_work_share(2, 1, balanced=False) == pytest.approx(0.75)
    # cp 4 contiguous: (2r + 1)/16.
    assert [causal_work_share(4, r, balanced=False) for r in range(4)] == pytest.approx(
        [1 / 16, 3 / 16, 5 / 16, 7 / 16]
    )
    # Balanced: pieces r and 2c - 1 - r, 1/c each.
    assert load_balanced_chunks(4, 1) == (1, 6)
    assert [causal_work_share(4, r) for r in range(4)] == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError, match="rank 4 is not in a cp group of 4"):
        load_balanced_chunks(4, 4)


def test_ring_exposes_only_what_a_step_of_attention_does_not_hide() -> None:
    # K, V chunk 1 GB at 100 GB/s, no latency: 10 ms a forward send, 20 ms a backward send.
    ring = ring_attention_comm(1e9, 4, 20.0, 100.0, 100.0, 0.0)
    assert ring.steps == 3
    assert ring.forward_send_ms == pytest.approx(10.0)
    assert ring.backward_send_ms == pytest.approx(20.0)
    # Forward: a step of the core is 20 / 4 = 5 ms, so 3 × (10 − 5) = 15 ms exposed.
    assert ring.forward_ms == pytest.approx(15.0)
    # Backward: a step is 25 ms > 20 ms: all hidden, but for the last hop of dK, dV to their
    # owner (the chunk's bytes, 10 ms), which nothing overlaps.
    assert ring.backward_ms == pytest.approx(10.0)
    assert ring.buffer_bytes == 1e9
    # Latency adds once per send: 2 µs more per step, 3 steps.
    slow = ring_attention_comm(1e9, 4, 20.0, 100.0, 100.0, 2000.0)
    assert slow.forward_ms == pytest.approx(3 * (12.0 - 5.0))
    assert ring_attention_comm(1e9, 1, 20.0, 100.0, 100.0, 0.0).forward_ms == 0.0


def test_kv_and_core_backward_shares() -> None:
    assert kv_bytes(123, 1000) == 123.0
    assert kv_bytes(None, 1000) == 2000.0  # an older profile: MHA's K and V
    assert core_backward_share(10, 100) == pytest.approx(0.2)
    assert core_backward_share(60, 100) == 1.0


@pytest.fixture(scope="module")
def gpt2_block():
    return profile_model("gpt2-small", 1024, 2, "bf16").layers[1]


def test_profile_records_the_keys_and_values_the_core_receives(gpt2_block) -> None:
    # GPT-2 small: 12 heads of 64, 2 samples of 1024 tokens in bf16: K and V are
    # 2 × (2 · 1024 · 768 · 2) bytes.
    assert gpt2_block.attention_kv_bytes == 2 * (2 * 1024 * 768 * 2)
    # Four matmuls of 2·s²·h over the two samples: the core's forward is QKᵀ and PV.
    assert gpt2_block.selective_recompute_flops == 2 * (2 * 2 * 1024 * 1024 * 768)


def _cost(block, cp: int, mbs: int, bandwidth: float):
    return layer_cost(
        block,
        A,
        100.0,
        tp=1,
        micro_batch_size=mbs,
        profile_micro_batch_size=2,
        intra_node_bandwidth_gb_per_s=100.0,
        context_parallel=cp,
        cp_bandwidth_gb_per_s=bandwidth,
        cp_latency_us=0.0,
    )


@pytest.mark.parametrize("cp", [2, 4])
def test_a_cp_rank_computes_one_chunk_and_adds_its_ring(gpt2_block, cp: int) -> None:
    # A rank of cp c at 4 samples runs the FLOPs and keeps the activations of 4 / c samples
    # (the profile was traced at 2 samples).
    ranked = _cost(gpt2_block, cp, 4, 1e-3)
    chunk = layer_cost(
        gpt2_block.model_copy(update={"measured": []}),
        A,
        100.0,
        tp=1,
        micro_batch_size=4 // cp,
        profile_micro_batch_size=2,
    )
    assert ranked.forward_compute_ms == pytest.approx(chunk.forward_compute_ms)
    assert ranked.backward_compute_ms == pytest.approx(chunk.backward_compute_ms)
    assert ranked.saved_bytes == pytest.approx(chunk.saved_bytes)
    assert ranked.params_per_gpu == chunk.params_per_gpu  # weights are whole on every cp rank
    # The ring at 1 MB/s: each send is the chunk's K, V (4 samples' K, V over c), far slower
    # than the core, so (c − 1) × (send − core step) is exposed per pass.
    chunk_kv = gpt2_block.attention_kv_bytes * 2 / cp
    send = chunk_kv / 1e6 * 1e3
    core = chunk.forward_compute_ms * gpt2_block.selective_recompute_flops
    core /= gpt2_block.forward_flops
    assert ranked.forward_tp_comm_ms == pytest.approx((cp - 1) * (send - core / cp))
    core_b = chunk.backward_compute_ms * core_backward_share(
        gpt2_block.selective_recompute_flops, gpt2_block.backward_flops
    )
    assert ranked.backward_tp_comm_ms == pytest.approx((cp - 1) * (2 * send - core_b / cp) + send)
    assert ranked.ring_buffer_bytes == pytest.approx(chunk_kv)
    # At NVLink speeds the ring hides behind the core, all but backward's last hop.
    fast = _cost(gpt2_block, cp, 4, 900.0)
    assert fast.forward_tp_comm_ms == 0.0
    assert fast.backward_tp_comm_ms == pytest.approx(chunk_kv / 900e9 * 1e3)


def _model(gpus_per_node: int = 8) -> CostModel:
    layers = [
        layer(i, flops=10**12, params=10**8, saved=10**9, output=10**7, tp_divides=4)
        for i in range(4)
    ]
    profile = make_profile(layers, seq_len=4096, mbs=1)
    cluster = make_cluster([("a", A, gpus_per_node, 2)])
    return CostModel(profile, cluster, gpu_specs(cluster))


def _config(cp: int, replicas: int = 2, zero: int = 0) -> PlanConfig:
    group = ReplicaGroup(0, 1, replicas, 1, "none", cp=cp)
    return PlanConfig(4, "1f1b", 1, (StageChoice(0, 4, (group,), zero),))


def test_plan_memory_and_gradient_reduction_with_cp() -> None:
    model = _model()
    plain, ring = model.evaluate(_config(1)), model.evaluate(_config(2))
    # Saved activations: the chunk's, half (1 micro-batch in flight at pp 1).
    assert ring.memory[0].activations_bytes == pytest.approx(plain.memory[0].activations_bytes / 2)
    assert ring.memory[0].weights_bytes == plain.memory[0].weights_bytes
    # The gradient all-reduce runs over 2 replicas × 2 cp ranks = 4 GPUs of one node.
    params = 4 * 10**8
    assert ring.dp_allreduce_ms == pytest.approx(ring_allreduce_ms(params * 2, 4, 100.0, 5.0))
    assert plain.dp_allreduce_ms == pytest.approx(ring_allreduce_ms(params * 2, 2, 100.0, 5.0))
    # ZeRO-1 shards Adam's states over the 4 ranks (12 bytes a parameter in bf16).
    sharded = model.evaluate(_config(2, zero=1))
    assert sharded.memory[0].optimizer_bytes == pytest.approx(params * 12 / 4)
    # Compute per micro-batch halves too (each rank runs half the tokens).
    assert ring.stages[0].groups[0].compute_ms < 0.6 * plain.stages[0].groups[0].compute_ms


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_the_searchs_cp_view_costs_a_plan_as_evaluate_does(zero: int) -> None:
    """The search runs on ``with_context_parallel(c)`` with groups at cp 1; the plan it
    returns has its groups at cp c. Both must cost the same."""
    model = _model()
    view = model.with_context_parallel(2)
    assert view.classes[0].gpus_per_node == 4 and view.classes[0].num_nodes == 2
    seen = view.evaluate(_config(1, replicas=4, zero=zero))
    real = model.evaluate(with_cp(_config(1, replicas=4, zero=zero), 2))
    assert seen.iteration_ms == pytest.approx(real.iteration_ms)
    assert seen.dp_allreduce_ms == pytest.approx(real.dp_allreduce_ms)
    for a, b in zip(seen.memory, real.memory, strict=True):
        assert a.total_bytes == pytest.approx(b.total_bytes)
    # A class whose nodes cp does not divide offers no cp groups in the view.
    assert _model(gpus_per_node=6).with_context_parallel(4).classes[0].num_nodes == 0
