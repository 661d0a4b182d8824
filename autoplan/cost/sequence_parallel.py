"""Megatron-style sequence parallelism (Korthikanti et al. 2022, section 4.2.2): what it does
to one layer's costs on one rank of a tp group of degree t.

Tensor parallelism alone leaves a replicated part R of a layer on every tp rank (the norms,
the residual adds, dropout, the inputs of the column-split linears): R + S/t. Sequence
parallelism shards R along the sequence, so every FLOP, byte moved and saved activation of a
layer with a tensor-parallel profile divides by t (the runtime's ``SequenceParallel`` norms and
sequence-sharded residual stream). An embedding's lookup is the one piece still done whole on
every rank (its output is reduce-scattered, not its input); that part is small and counted as
divided with the rest.

Communication, as the runtime does it (``autoplan.runtime.sequence_parallel``):

- forward: each all-reduce after a row-split linear (``forward_allreduce_count`` f) becomes a
  reduce-scatter to the sequence shards; each distinct input of the column-split linears
  (``backward_allreduce_count`` b) is all-gathered once before them;
- backward: the all-gathers' backward is a reduce-scatter (b), the reduce-scatters' an
  all-gather (f), and the column-split linears' inputs, saved sequence-sharded, are all-gathered
  again for their weight gradients (b more all-gathers, not overlapped).

A ring reduce-scatter or all-gather of a payload S over t ranks is (t − 1) steps of latency α
and (t − 1)/t · S per rank: together the ring volume of one all-reduce, with its 2(t − 1)
latency steps, as two collectives. Saved activations: sbh(34 + 5as/h)/t per block, the paper's
figure (less what a model without dropout or with flash attention does not save).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SequenceParallelComm", "ring_collective_ms", "sequence_parallel_comm"]


def ring_collective_ms(
    payload_bytes: float, group_size: int, bandwidth_gb_per_s: float, latency_us: float
) -> float:
    """A ring reduce-scatter or all-gather whose whole (unsharded) tensor is ``payload_bytes``:
    (n − 1) steps of latency and (n − 1)/n of the payload per rank."""
    if group_size <= 1 or payload_bytes <= 0:
        return 0.0
    steps = group_size - 1
    volume = steps / group_size * payload_bytes
    return volume / (bandwidth_gb_per_s * 1e9) * 1e3 + steps * latency_us * 1e-3


@dataclass(frozen=True)
class SequenceParallelComm:
    """A layer's collectives per pass under sequence parallelism (module docstring)."""

    forward_collectives: int
    backward_collectives: int
    forward_ms: float
    backward_ms: float
    regather_ms: float  # the part of backward_ms that re-gathers the column-split inputs


def sequence_parallel_comm(
    payload_bytes: float,
    tp: int,
    row_outputs: int,
    column_inputs: int,
    bandwidth_gb_per_s: float | None,
    latency_us: float,
) -> SequenceParallelComm:
    """Collectives of one layer with ``row_outputs`` row-split outputs and ``column_inputs``
    distinct column-split inputs, each ``payload_bytes`` whole (module docstring). Times are
    zero when the bandwidth is not given (the caller counts kernels all the same)."""
    forward = row_outputs + column_inputs
    backward = column_inputs + row_outputs + column_inputs
    one = 0.0
    if bandwidth_gb_per_s is not None:
        one = ring_collective_ms(payload_bytes, tp, bandwidth_gb_per_s, latency_us)
    return SequenceParallelComm(
        forward, backward, forward * one, backward * one, column_inputs * one
    )


def sequence_runs(kinds: list[str]) -> int:
    """How many runs of consecutive blocks a stage with layers of ``kinds`` has: each run's
    output is all-gathered back to the whole sequence at its end (forward), and its input's
    gradient at its start (backward), for the embedding, the head and the next stage, which
    take the whole sequence."""
    return sum(
        1
        for position, kind in enumerate(kinds)
        if kind == "block" and (position == 0 or kinds[position - 1] != "block")
    )
