"""Context parallelism (ring attention): what a cp group of degree c does to one layer's costs.

Each of the c ranks of a cp group holds a chunk of every sample's sequence (s / c tokens) and
runs every layer on its chunk; only attention needs the other chunks' keys and values, which
travel around the ring (Liu et al. 2023, "Ring Attention"; torch's
``torch.distributed.tensor.experimental.context_parallel``, Megatron-LM's
``--context-parallel-size``). Per layer with an attention core (a layer whose profile has
``selective_recompute_flops > 0``: the core is what selective recompute redoes), per rank:

- **Compute.** Everything outside the core is per token: 1/c of the layer. The core is
  s/c queries against all s keys: 1/c of its FLOPs. With a causal mask, contiguous chunks
  would give rank r (2r + 1)/c² of the masked work (the last rank almost twice the mean);
  the sequence is instead cut into 2c pieces and rank r takes pieces r and 2c − 1 − r
  (``load_balanced_chunks``), which gives every rank exactly 1/c (``causal_work_share``).
  So a rank's FLOPs and activation bytes are those of a micro-batch c times smaller (the
  cost model scales by 1/c); the weights it reads per pass do not shrink.
- **Ring.** The core runs in c steps; at each of the first c − 1 the rank sends the K and V
  chunk it holds to the next rank while it attends to it (forward), and the K, V chunk with
  its accumulated dK, dV (twice the bytes) in backward. A step's send overlaps that step's
  share of the core (1/c of the rank's core time): exposed per pass = (c − 1) ·
  max(0, send − core / c) (``ring_attention_comm``). Backward ends with one more hop that
  nothing overlaps: each chunk's dK, dV (the K, V chunk's bytes) back to its owner (as torch's
  ring and ``autoplan.runtime.context_parallel`` do). The send is one point-to-point message,
  α + S / β, on the intra-node link when the tp·c GPUs of a replica share a node.
- **Memory.** Saved activations are the chunk's (1/c); the ring holds one K, V chunk in
  flight besides the one in use (``RingComm.buffer_bytes``, a transient).
- **Gradients.** The c ranks hold the same weights and compute gradients of different tokens:
  the gradient reduction runs over dp · c ranks, and ZeRO shards over them too (as FSDP's
  ``dp_shard × cp`` mesh in torchtitan, Megatron-LM's data-parallel-with-cp group).

Uneven chunks (a cp group across two GPU types, ``autoplan.cost.context_span``): rank r holds
t_r of the s tokens in two mirrored pieces, so its compute and activations are t_r / s of the
layer's, and its core's step against rank q's chunk is t_q / s of its core (t_r · t_q / 2
query-key pairs, the diagonal step included). The ring runs in lockstep: every rank sends at
step k the chunk it holds (rank r − k's, t_{r−k} tokens), and the step lasts as long as the
slowest rank's max(send, attend) (``lockstep_ring``); with equal counts it is the ring above.

Key and value bytes come from the profile (``LayerProfile.attention_kv_bytes``: the K and V
the core receives); profiles written before it was recorded use 2 × the layer's output
(multi-head attention's K and V; an upper bound under grouped-query attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.cost.comm import p2p_ms

__all__ = [
    "LockstepRing",
    "RingComm",
    "causal_work_share",
    "core_backward_share",
    "kv_bytes",
    "load_balanced_chunks",
    "lockstep_ring",
    "ring_attention_comm",
]

# torch's flop formula for SDPA's backward counts four matmuls against forward's two
# (torch.utils.flop_counter.sdpa_backward_flop_count), so the core's backward is 2× forward.
CORE_BACKWARD_OVER_FORWARD = 2.0


def load_balanced_chunks(cp: int, rank: int) -> tuple[int, int]:
    """The two of 2·cp equal pieces of the sequence rank ``rank`` holds under a causal mask:
    ``rank`` and ``2·cp − 1 − rank`` (the head of the sequence with its tail)."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is not in a cp group of {cp}")
    return rank, 2 * cp - 1 - rank


def causal_work_share(cp: int, rank: int, *, balanced: bool = True) -> float:
    """Rank ``rank``'s fraction of a causal attention core's unmasked work (query-key pairs).

    Counted in pieces of the sequence: with n pieces the causal core has n²/2 unit squares
    (each piece attends fully to the pieces before it and half to itself). Contiguous chunks
    (n = c): rank r holds r full squares and a half, (2r + 1)/c² of the whole. Load-balanced
    (n = 2c, ``load_balanced_chunks``): pieces r and 2c − 1 − r hold r + 1/2 and
    2c − 1 − r + 1/2 squares, 2c in all of the 2c² there are: 1/c for every rank.
    """
    pieces = load_balanced_chunks(cp, rank) if balanced else (rank,)
    total = (2 * cp if balanced else cp) ** 2 / 2
    return sum(piece + 0.5 for piece in pieces) / total


def kv_bytes(attention_kv_bytes: int | None, output_activation_bytes: int) -> float:
    """The layer's K and V bytes for the whole micro-batch profiled (module docstring)."""
    if attention_kv_bytes is not None:
        return float(attention_kv_bytes)
    return 2.0 * output_activation_bytes


def core_backward_share(core_forward_flops: float, backward_flops: float) -> float:
    """Fraction of a layer's backward that is its attention core's backward."""
    if backward_flops <= 0:
        return 0.0
    return min(1.0, CORE_BACKWARD_OVER_FORWARD * core_forward_flops / backward_flops)


@dataclass(frozen=True)
class RingComm:
    """One layer's ring on one rank, per micro-batch: the sends and what they expose."""

    steps: int  # sends per pass: c − 1
    forward_send_ms: float  # one forward step's send (K, V chunk)
    backward_send_ms: float  # one backward step's send (K, V and dK, dV)
    forward_ms: float  # exposed in forward: steps · max(0, send − core step)
    backward_ms: float  # exposed in backward, the last hop of dK, dV included
    buffer_bytes: float  # the chunk in flight beside the one in use (transient)


def ring_attention_comm(
    chunk_kv_bytes: float,
    cp: int,
    core_forward_ms: float,
    core_backward_ms: float,
    bandwidth_gb_per_s: float | None,
    latency_us: float,
) -> RingComm:
    """The ring of one layer on one rank (module docstring): ``chunk_kv_bytes`` is the K and V
    of one rank's chunk (what one forward step sends), ``core_*_ms`` the rank's whole core time
    per pass (all c steps). Times are zero without a bandwidth (counted all the same)."""
    if cp <= 1:
        return RingComm(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    steps = cp - 1
    forward_send = backward_send = 0.0
    if bandwidth_gb_per_s is not None:
        forward_send = p2p_ms(chunk_kv_bytes, bandwidth_gb_per_s, latency_us)
        backward_send = p2p_ms(2 * chunk_kv_bytes, bandwidth_gb_per_s, latency_us)
    return RingComm(
        steps=steps,
        forward_send_ms=forward_send,
        backward_send_ms=backward_send,
        forward_ms=steps * max(0.0, forward_send - core_forward_ms / cp),
        # + the last hop: each chunk's dK, dV (as many bytes as the chunk) to its owner.
        backward_ms=steps * max(0.0, backward_send - core_backward_ms / cp) + forward_send,
        buffer_bytes=chunk_kv_bytes,
    )


@dataclass(frozen=True)
class LockstepRing:
    """One layer's ring over a cp group of uneven chunks, per micro-batch: how long its
    attention phase lasts, the same on every rank (the ring's steps are its barriers)."""

    forward_ms: float  # the forward core's c steps, each its slowest rank's max(send, attend)
    backward_ms: float  # the same in backward (K, V with dK, dV), + the last hop of dK, dV
    buffer_bytes: float  # the largest chunk in flight beside the one in use (transient)


def lockstep_ring(
    tokens: Sequence[int],
    core_forward_ms: Sequence[float],
    core_backward_ms: Sequence[float],
    kv_bytes_per_token: float,
    hops: Sequence[tuple[float | None, float]],
) -> LockstepRing:
    """The ring of one layer over cp ranks holding ``tokens`` (module docstring):
    ``core_*_ms[r]`` rank r's whole core per pass (all its steps), ``kv_bytes_per_token``
    the K and V of one token of every sample of the micro-batch on one tp rank, ``hops[r]``
    the (bandwidth GB/s or None, latency us) of rank r's send to rank r + 1 (no time without
    a bandwidth). At step k rank r attends to rank q = r − k's chunk, core[r] · t_q / s, while
    it sends that chunk on (all steps but the last); backward sends the chunk with its dK, dV
    (twice the bytes) and ends with one hop of each chunk's dK, dV to its owner."""
    cp, seq = len(tokens), sum(tokens)

    def send(r: int, chunk: int, times: int) -> float:
        bandwidth, latency = hops[r]
        if bandwidth is None:
            return 0.0
        return p2p_ms(times * kv_bytes_per_token * tokens[chunk], bandwidth, latency)

    def phase(core: Sequence[float], times: int) -> float:
        total = 0.0
        for step in range(cp):
            sends = step + 1 < cp
            total += max(
                max(core[r] * tokens[(r - step) % cp] / seq, send(r, (r - step) % cp, times))
                if sends
                else core[r] * tokens[(r - step) % cp] / seq
                for r in range(cp)
            )
        return total

    # The last hop of backward: rank r holds rank r + 1's dK, dV, as many bytes as its K, V.
    last_hop = max(send(r, (r + 1) % cp, 1) for r in range(cp)) if cp > 1 else 0.0
    return LockstepRing(
        forward_ms=phase(core_forward_ms, 1),
        backward_ms=phase(core_backward_ms, 2) + last_hop,
        buffer_bytes=kv_bytes_per_token * max(tokens) if cp > 1 else 0.0,
    )
