"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, DeepSeekMoE): a LLaMA-style model whose
MLPs are routed experts.

Each MoE block replaces the gated MLP with a router (softmax over ``num_experts``, top-k per
token, the k weights renormalised where ``normalize_top_k``), ``num_experts`` gated experts of
width ``expert_ffn_hidden_size`` and optionally a shared expert every token passes through
(DeepSeekMoE's ``n_shared_experts`` fused into one MLP of their summed width; Qwen2-MoE's, with
a sigmoid gate). Blocks listed in ``dense_layers`` keep a dense MLP (DeepSeekMoE's first block).

Dispatch has static shapes, so fake-tensor profiling traces it and the expert-parallel runtime
exchanges fixed-size buffers: every expert has ``capacity`` slots,
``ceil(capacity_factor · tokens · k / experts)``; a token's picks fill its experts' slots in
token order and picks past an expert's capacity are dropped (their weight contributes nothing,
as in GShard and Switch). The experts then run as three batched matmuls on an
``(experts, capacity, hidden)`` buffer. Between dispatch and the experts sits
:attr:`MoE.exchange`, identity in one process: the runtime's expert parallelism
(:mod:`autoplan.runtime.expert_parallel`) swaps in the all-to-all that sends each expert's
slots to the rank holding it and back.

Expert weights are 3-D parameters (not ``nn.Linear``), so tensor parallelism leaves them whole:
experts are split by expert parallelism, the attention and shared expert by tp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.layered import LayeredModel
from autoplan.zoo.llama import (
    GatedActivation,
    LlamaBlock,
    LlamaConfig,
    LlamaEmbedding,
    LlamaHead,
    SwiGLU,
)

__all__ = [
    "GroupedExperts",
    "MoE",
    "MoEBlock",
    "MoEConfig",
    "MoELlama",
    "active_parameter_count",
    "expert_capacity",
]


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """Shape of a LLaMA-style mixture-of-experts model (the LlamaConfig fields, plus experts).

    Parameters of an MoE block: attention and norms as LlamaConfig, plus h·E (router) +
    E·3h·f_e (experts) + 3h·f_s (shared expert, if any) + h (its gate, if any). Active
    parameters count k experts of E.
    """

    num_experts: int = 8
    top_k: int = 2
    expert_ffn_hidden_size: int | None = None
    """Width of one expert's MLP; None: ``ffn_hidden_size`` (Mixtral)."""
    shared_ffn_hidden_size: int | None = None
    """Width of the shared expert every token passes through; None: no shared expert."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by sigmoid(w·x) (Qwen2-MoE)."""
    normalize_top_k: bool = False
    """The k routing weights are divided by their sum (Mixtral: yes; Qwen1.5-MoE, DeepSeekMoE:
    no)."""
    capacity_factor: float = 1.25
    """Slots per expert as a multiple of the even share tokens·k/E (module docstring)."""
    dense_layers: tuple[int, ...] = ()
    """Blocks that keep a dense MLP of ``ffn_hidden_size`` (DeepSeekMoE: the first)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must be from 1 to num_experts ({self.num_experts})"
            )
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor}")

    @property
    def expert_ffn(self) -> int:
        """Width of one routed expert's MLP."""
        return self.expert_ffn_hidden_size or self.ffn_hidden_size

    @property
    def tensor_parallel_ffn(self) -> int:
        """What tp must divide of the MLPs it splits: the dense and shared MLPs' widths."""
        widths = [self.shared_ffn_hidden_size or 0]
        if self.dense_layers:
            widths.append(self.ffn_hidden_size)
        return math.gcd(*widths) or self.expert_ffn


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor · tokens · top_k / num_experts), at least 1."""
    # Rounded to 1e-9 first so that, e.g., 1.25 · 8 · 2 / 8 is 2.5 and not 2.5000000001.
    return max(1, math.ceil(round(capacity_factor * tokens * top_k / num_experts, 9)))


class GroupedExperts(nn.Module):
    """``num_experts`` gated MLPs as (experts, ·, ·) weights, run as batched matmuls on an
    (experts, slots, hidden) buffer. ``first_expert`` is the global index of expert 0 here
    (not 0 where expert parallelism kept a slice: :meth:`keep_experts`)."""

    def __init__(
        self, num_experts: int, hidden: int, ffn: int, activation: GatedActivation = "silu"
    ) -> None:
        super().__init__()
        self.activation = activation
        self.first_expert = 0
        self.gate = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.up = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        self.down = nn.Parameter(torch.empty(num_experts, ffn, hidden))
        # nn.Linear's default for each expert (uniform ±1/sqrt(fan_in)); fan_in is the
        # input width, which init.kaiming_uniform_ would misread from a 3-D tensor.
        for weight, fan_in in ((self.gate, hidden), (self.up, hidden), (self.down, ffn)):
            nn.init.uniform_(weight, -(fan_in**-0.5), fan_in**-0.5)

    @property
    def num_local_experts(self) -> int:
        return self.gate.shape[0]

    def keep_experts(self, start: int, end: int) -> None:
        """Keep experts ``[start, end)`` only (expert parallelism), in place."""
        if not 0 <= start < end <= self.first_expert + self.num_local_experts:
            raise ValueError(f"experts [{start}, {end}) are not all held here")
        local = slice(start - self.first_expert, end - self.first_expert)
        for name in ("gate", "up", "down"):
            weight = getattr(self, name)
            setattr(self, name, nn.Parameter(weight.detach()[local].clone()))
        self.first_expert = start

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        gate = torch.bmm(slots, self.gate)
        if self.activation == "silu":
            gate = F.silu(gate)
        else:
            gate = F.gelu(gate, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return torch.bmm(gate * torch.bmm(slots, self.up), self.down)

    def extra_repr(self) -> str:
        experts, hidden, ffn = self.gate.shape
        return f"experts={experts}, hidden={hidden}, ffn={ffn}, activation={self.activation}"


Exchange = Callable[[torch.Tensor], torch.Tensor]


def _identity(slots: torch.Tensor) -> torch.Tensor:
    return slots


class MoE(nn.Module):
    """Router, routed experts and an optional shared expert (module docstring)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.capacity_factor = config.capacity_factor
        self.normalize_top_k = config.normalize_top_k
        self.router = nn.Linear(hidden, config.num_experts, bias=False)
        self.experts = GroupedExperts(
            config.num_experts, hidden, config.expert_ffn, config.activation
        )
        self.shared = (
            None
            if config.shared_ffn_hidden_size is None
            else SwiGLU(
                hidden,
                config.shared_ffn_hidden_size,
                activation=config.activation,
                bias=config.mlp_bias,
            )
        )
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if config.shared_expert_gate else None
        # Plain attributes (not modules): the runtime replaces them with its all-to-alls.
        self.exchange: Exchange = _identity
        self.exchange_back: Exchange = _identity

    def capacity(self, tokens: int) -> int:
        """Slots per expert for ``tokens`` tokens (module docstring)."""
        return expert_capacity(tokens, self.top_k, self.num_experts, self.capacity_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        count, hidden = tokens.shape
        experts, k = self.num_experts, self.top_k
        capacity = self.capacity(count)
        weights, chosen = self.router(tokens).softmax(dim=-1).topk(k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        picks = chosen.reshape(-1)  # token-major: token t's picks are rows t·k … t·k + k − 1
        match = picks[:, None] == torch.arange(experts, device=x.device)[None, :]
        # A pick's place in its expert's queue: how many earlier picks chose that expert.
        place = (match.cumsum(dim=0) * match).sum(dim=-1) - 1
        kept = place < capacity
        # Dropped picks all write to one spare row past the buffer, which is then cut off.
        slot = torch.where(kept, picks * capacity + place, experts * capacity)
        buffer = tokens.new_zeros(experts * capacity + 1, hidden).index_add(
            0, slot, tokens.repeat_interleave(k, dim=0)
        )
        slots = buffer[:-1].view(experts, capacity, hidden)
        done = self.exchange_back(self.experts(self.exchange(slots)))
        rows = torch.cat([done.reshape(-1, hidden), done.new_zeros(1, hidden)])
        scale = (weights.reshape(-1) * kept).unsqueeze(-1)
        out = (rows[slot] * scale).view(count, k, hidden).sum(dim=1)
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(tokens)) * shared
            out = out + shared
        return out.view(shape)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, normalize_top_k={self.normalize_top_k}"
        )


class MoEBlock(LlamaBlock):
    """A LlamaBlock whose MLP is :class:`MoE` (its parts and names as LlamaBlock's)."""

    def __init__(self, config: MoEConfig, index: int = 0) -> None:
        super().__init__(config, index)
        self.mlp = MoE(config)
        # The part views hold the modules themselves: rebuild them over the new MLP.
        self._init_parts(
            {
                "attn": ("attn_norm", "attn", "attn_post_norm"),
                "mlp": ("mlp_norm", "mlp", "mlp_post_norm"),
            }
        )


class MoELlama(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}`` (MoE blocks but ``dense_layers``),
    ``head``; the same names and parts as :class:`~autoplan.zoo.llama.Llama`."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        embed = LlamaEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        for index in range(config.num_layers):
            dense = index in config.dense_layers
            layers[f"block_{index}"] = (
                LlamaBlock(config, index) if dense else MoEBlock(config, index)
            )
        layers["head"] = LlamaHead(config, embed.token if config.tie_embeddings else None)
        self.layers = nn.ModuleDict(layers)


def active_parameter_count(model: nn.Module) -> int:
    """Parameters one token passes through: every parameter, less the routed experts a token
    does not pick (E − k of E in each MoE block)."""
    total = sum(parameter.numel() for parameter in model.parameters())
    for module in model.modules():
        if isinstance(module, MoE):
            experts = module.experts
            per_expert = sum(p.numel() for p in experts.parameters()) // module.num_experts
            total -= (module.num_experts - module.top_k) * per_expert
    return total
