"""Context parallelism executed: ring attention over a cp process group, by hand on send/recv.

Each of the c ranks of a cp group holds two of 2c equal pieces of every sample's sequence,
pieces r and 2c − 1 − r (``chunk_positions``: the load balance of a causal mask that the cost
model assumes, ``autoplan.cost.context_parallel``). Uneven chunks (a cp group across two GPU
types, the faster holding more tokens: ``tokens``, the tokens of each cp rank) keep the same
mirror: rank r holds two pieces of t_r / 2 tokens, one at offset a_r = Σ_{q<r} t_q / 2 from
the start and one at a_r from the end. Under a causal mask such a pair costs t_r / 2 · s
query-key work wherever a_r lies, so a rank's attention, like the rest of its layer, is its
tokens' share of the whole; with equal counts the pieces are the even ones exactly.

Every layer runs on the rank's tokens as they are; the attention core alone needs the other
ranks' keys and values. ``context_parallel`` replaces each causal
``F.scaled_dot_product_attention`` of the model with ``ring_attention`` and gives the zoo's
position table and RoPE the tokens' global positions (``autoplan.zoo.positions``).

Ring attention (Liu et al. 2023), forward: c steps; at step s the rank attends its queries to
the K, V chunk of rank r − s (masked by global positions: a key is seen by the queries at or
after it) while it passes that chunk on to rank r + 1; the partial results are merged with
their log-sum-exps (the online softmax), so the output is exactly softmax(QKᵀ)V over the whole
sequence. Backward: the same ring carries each chunk with the gradient of its K and V
accumulated by the ranks it has visited; after c steps every chunk's gradient is back at its
owner. The gradient of Q stays local. Weights are whole on every cp rank: their gradients are
summed over the cp group like a data-parallel all-reduce (``reduce_gradients``), each rank's
loss being its tokens' share of the whole.

``torch.distributed.tensor.experimental.context_parallel`` is not used: it dispatches on the
CUDA attention kernels (flash and memory-efficient) and does not run on CPU with gloo, where
the runtime's tests run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autoplan.errors import InputError
from autoplan.runtime.model_stage import pipeline_layers
from autoplan.zoo.positions import token_positions
from autoplan.zoo.sdpa import SdpaCall, SdpaMode

__all__ = [
    "apply_context_parallel",
    "chunk_positions",
    "context_parallel",
    "even_tokens",
    "reduce_gradients",
    "ring_attention",
    "shard_sequence",
]


def even_tokens(seq_len: int, cp: int) -> tuple[int, ...]:
    """Tokens of each of ``cp`` ranks in equal chunks: 2·cp equal pieces, two per rank."""
    if seq_len % (2 * cp):
        raise InputError(
            f"context parallel degree {cp}: 2 × {cp} chunks do not divide the sequence "
            f"length {seq_len}"
        )
    return (seq_len // cp,) * cp


def _rank_tokens(seq_len: int, cp: int, tokens: Sequence[int] | None) -> tuple[int, ...]:
    """``tokens`` checked against the sequence and the degree (``even_tokens`` when None)."""
    if tokens is None:
        return even_tokens(seq_len, cp)
    counts = tuple(tokens)
    if len(counts) != cp or sum(counts) != seq_len or any(t <= 0 or t % 2 for t in counts):
        raise InputError(
            f"context parallel tokens {list(counts)}: {cp} positive even counts (two mirrored "
            f"pieces per rank) summing to the sequence length {seq_len} are needed"
        )
    return counts


def chunk_positions(
    seq_len: int, cp: int, rank: int, tokens: Sequence[int] | None = None
) -> torch.Tensor:
    """Global positions of cp rank ``rank``'s tokens: its two mirrored pieces, in that order
    (module docstring; ``tokens`` the tokens of each rank, equal chunks when None: pieces
    ``rank`` and ``2·cp − 1 − rank`` of ``2·cp`` equal pieces)."""
    halves = [t // 2 for t in _rank_tokens(seq_len, cp, tokens)]
    offset, piece = sum(halves[:rank]), halves[rank]
    first = torch.arange(offset, offset + piece)
    last = torch.arange(seq_len - offset - piece, seq_len - offset)
    return torch.cat([first, last])


def shard_sequence(
    tensor: torch.Tensor,
    group: dist.ProcessGroup,
    dim: int = 1,
    tokens: Sequence[int] | None = None,
) -> torch.Tensor:
    """This cp rank's tokens of ``tensor`` (whole sequences along ``dim``; ``tokens`` as
    ``chunk_positions`` takes them)."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    positions = chunk_positions(tensor.shape[dim], cp, rank, tokens).to(tensor.device)
    return tensor.index_select(dim, positions)


def _start_exchange(
    tensor: torch.Tensor, group: dist.ProcessGroup, ranks: list[int], rank: int, incoming: int
) -> tuple[torch.Tensor, list[dist.Work]]:
    """Start sending ``tensor`` (tokens along dim −2) to the next rank of the ring and
    receiving what the previous one sends, ``incoming`` tokens (its chunk's owner's count);
    the received tensor is valid once the requests are waited on."""
    cp = len(ranks)
    shape = list(tensor.shape)
    shape[-2] = incoming
    received = tensor.new_empty(shape)
    ops = [
        dist.P2POp(dist.isend, tensor.contiguous(), ranks[(rank + 1) % cp], group),
        dist.P2POp(dist.irecv, received, ranks[(rank - 1) % cp], group),
    ]
    return received, dist.batch_isend_irecv(ops)


def _finish(exchange: tuple[torch.Tensor, list[dist.Work]]) -> torch.Tensor:
    received, requests = exchange
    for request in requests:
        request.wait()
    return received


def _scores(
    query: torch.Tensor, key: torch.Tensor, scale: float, seen: torch.Tensor
) -> torch.Tensor:
    """Scaled QKᵀ with the keys a query may not see at −inf (``seen``: (Lq, Lk) booleans)."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    return scores.masked_fill(~seen, -math.inf)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        seq_len: int,
        scale: float,
        group: dist.ProcessGroup,
        tokens: tuple[int, ...],
    ) -> torch.Tensor:
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group)
        mine = chunk_positions(seq_len, cp, rank, tokens).to(query.device)
        out = torch.zeros_like(query)
        lse = torch.full(query.shape[:-1], -math.inf, dtype=query.dtype, device=query.device)
        kv = torch.stack([key, value])
        for step in range(cp):
            # The chunk is passed on while the rank attends to it (the ring's overlap); the
            # next one is rank r − step − 1's, of its tokens.
            source = (rank - step) % cp
            pending = (
                _start_exchange(kv, group, ranks, rank, tokens[(source - 1) % cp])
                if step + 1 < cp
                else None
            )
            theirs = chunk_positions(seq_len, cp, source, tokens).to(query.device)
            scores = _scores(query, kv[0], scale, theirs[None, :] <= mine[:, None])
            block_lse = torch.logsumexp(scores, dim=-1)
            merged = torch.logaddexp(lse, block_lse)
            # After step 0 (the rank's own chunk, where every query sees itself) merged is
            # finite, so the rescaling never divides -inf by -inf.
            out = out * torch.exp(lse - merged)[..., None] + torch.matmul(
                torch.exp(scores - merged[..., None]), kv[1]
            )
            lse = merged
            if pending is not None:
                kv = _finish(pending)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.seq_len, ctx.scale, ctx.group, ctx.tokens = seq_len, scale, group, tokens
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        query, key, value, out, lse = ctx.saved_tensors
        group, seq_len, scale, tokens = ctx.group, ctx.seq_len, ctx.scale, ctx.tokens
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group)
        mine = chunk_positions(seq_len, cp, rank, tokens).to(query.device)
        # softmax backward: dS = P ∘ (dP − rowsum(dO ∘ O))
        delta = (grad_out * out).sum(dim=-1, keepdim=True)
        grad_query = torch.zeros_like(query)
        kv = torch.stack([key, value])
        grad_kv = torch.zeros_like(kv)
        for step in range(cp):
            source = (rank - step) % cp
            theirs = chunk_positions(seq_len, cp, source, tokens).to(query.device)
            scores = _scores(query, kv[0], scale, theirs[None, :] <= mine[:, None])
            probs = torch.exp(scores - lse[..., None])
            grad_kv[1] += torch.matmul(probs.transpose(-1, -2), grad_out)
            grad_scores = probs * (torch.matmul(grad_out, kv[1].transpose(-1, -2)) - delta)
            grad_query += torch.matmul(grad_scores, kv[0]) * scale
            grad_kv[0] += torch.matmul(grad_scores.transpose(-1, -2), query) * scale
            # What arrives is rank r − step − 1's chunk (after the last step: r's own).
            incoming = tokens[(source - 1) % cp]
            if step + 1 < cp:
                # The chunk travels on with the gradient its visits have gathered.
                both = torch.stack([kv, grad_kv])
                both = _finish(_start_exchange(both, group, ranks, rank, incoming))
                kv, grad_kv = both[0], both[1]
            else:
                # One more hop: the gradient of the chunk reaches its owner.
                grad_kv = _finish(_start_exchange(grad_kv, group, ranks, rank, incoming))
        return grad_query, grad_kv[0], grad_kv[1], None, None, None, None


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    seq_len: int,
    group: dist.ProcessGroup,
    scale: float | None = None,
    tokens: Sequence[int] | None = None,
) -> torch.Tensor:
    """Causal attention of this cp rank's queries over the whole sequence of ``seq_len``
    tokens (module docstring); (batch, heads, tokens, head_dim) tensors of the rank's tokens,
    ``tokens`` the tokens of each cp rank (equal chunks when None)."""
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    counts = _rank_tokens(seq_len, dist.get_world_size(group), tokens)
    return _RingAttention.apply(query, key, value, seq_len, scale, group, counts)


class _RingAttentionMode(SdpaMode):
    """Runs every causal ``F.scaled_dot_product_attention`` as ``ring_attention``."""

    def __init__(
        self, group: dist.ProcessGroup, seq_len: int, tokens: Sequence[int] | None
    ) -> None:
        super().__init__()
        self.group, self.seq_len, self.tokens = group, seq_len, tokens

    def attention(self, call: SdpaCall) -> torch.Tensor:
        """``ring_attention`` of the call's causal attention."""
        if call.attn_mask is not None or not call.is_causal or call.dropout_p:
            raise InputError(
                "context parallelism runs causal attention without a mask or dropout "
                "(is_causal=True); this model's attention is another"
            )
        key, value = call.kv_per_query_head()
        return ring_attention(
            call.query, key, value, self.seq_len, self.group, call.scale, self.tokens
        )


@contextmanager
def context_parallel(
    group: dist.ProcessGroup, seq_len: int, tokens: Sequence[int] | None = None
) -> Iterator[None]:
    """Within the block, the model runs this cp rank's tokens of sequences of ``seq_len``
    (``shard_sequence`` of its inputs, with the same ``tokens``): ring attention in place of
    causal SDPA, the tokens' global positions for the position table and RoPE."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    with ExitStack() as stack:
        stack.enter_context(token_positions(chunk_positions(seq_len, cp, rank, tokens)))
        stack.enter_context(_RingAttentionMode(group, seq_len, tokens))
        yield


def apply_context_parallel(
    model: nn.Module,
    group: dist.ProcessGroup,
    seq_len: int,
    tokens: Sequence[int] | None = None,
) -> int:
    """Run each of ``model``'s pipeline layers under ``context_parallel`` (set on the
    instance's forward, so activation recompute, applied after, reruns a block's forward under
    it too: the recompute runs inside backward, outside any context the caller holds); returns
    how many layers."""
    layers = pipeline_layers(model)
    for _, layer in layers:
        layer.forward = _under_context(layer.forward, group, seq_len, tokens)
    return len(layers)


def _under_context(
    forward: Callable[..., Any],
    group: dist.ProcessGroup,
    seq_len: int,
    tokens: Sequence[int] | None,
) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with context_parallel(group, seq_len, tokens):
            return forward(*args, **kwargs)

    return run


def reduce_gradients(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Sum every parameter's gradient over the cp group (each rank's loss is its tokens' share
    of the whole, uneven chunks included, so the sum is the whole sequence's gradient)."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM, group=group)
