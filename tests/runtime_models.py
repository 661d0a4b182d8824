"""Factory models ('tests.runtime_models:...') for the runtime's tests."""

from __future__ import annotations

import torch

from autoplan.zoo.gpt import GPT, GPTConfig

__all__ = [
    "HF_DECODER_LAYERS",
    "DecoderForCausalLM",
    "hf_decoder",
    "hf_decoder_tied",
    "mlp_stack",
    "tied_gpt",
]

TIED_GPT = GPTConfig(2, 16, 2, 33, 16, tie_embeddings=True)


def tied_gpt(batch_size: int = 2, seq_len: int = 8) -> tuple[GPT, torch.Tensor]:
    """A 4-layer GPT (embed, 2 blocks, head) whose head shares the token embedding's weight."""
    return GPT(TIED_GPT), torch.randint(0, TIED_GPT.vocab_size, (batch_size, seq_len))


def mlp_stack(batch_size: int = 2) -> tuple[torch.nn.Sequential, torch.Tensor]:
    """A Sequential of 4 layers (3 with weights) taking float features: pipeline layer = child."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    )
    return model, torch.randn(batch_size, 8)


class _Attention(torch.nn.Module):
    """Causal self-attention with separate q, k, v projections, as Hugging Face Llama's."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.v_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = hidden_states.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)

        q, k, v = (heads(p(hidden_states)) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class _Mlp(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.up_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    """A pre-norm block named as Hugging Face's LlamaDecoderLayer names its parts."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.input_layernorm = torch.nn.RMSNorm(hidden)
        self.self_attn = _Attention(hidden, heads)
        self.post_attention_layernorm = torch.nn.RMSNorm(hidden)
        self.mlp = _Mlp(hidden, ffn)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DecoderModel(torch.nn.Module):
    """The body, as Hugging Face's LlamaModel: embed_tokens, layers (a ModuleList), norm."""

    def __init__(self, vocab: int, hidden: int, heads: int, ffn: int, blocks: int) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(DecoderLayer(hidden, heads, ffn) for _ in range(blocks))
        self.norm = torch.nn.RMSNorm(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class DecoderForCausalLM(torch.nn.Module):
    """The whole model, as Hugging Face's LlamaForCausalLM: model (the body) and lm_head."""

    def __init__(
        self,
        vocab: int = 37,
        hidden: int = 16,
        heads: int = 2,
        ffn: int = 24,
        blocks: int = 4,
        tie_word_embeddings: bool = False,
    ) -> None:
        super().__init__()
        self.model = DecoderModel(vocab, hidden, heads, ffn, blocks)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        if tie_word_embeddings:  # as Hugging Face ties them: one Parameter, two modules
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def hf_decoder(batch_size: int = 2, seq_len: int = 8) -> tuple[DecoderForCausalLM, torch.Tensor]:
    """A decoder written like a Hugging Face model: embed, 4 blocks in a ModuleList, norm, head
    (7 pipeline layers), neither a LayeredModel nor an nn.Sequential."""
    return DecoderForCausalLM(), torch.randint(0, 37, (batch_size, seq_len))


def hf_decoder_tied(
    batch_size: int = 2, seq_len: int = 8
) -> tuple[DecoderForCausalLM, torch.Tensor]:
    """:func:`hf_decoder` with lm_head's weight tied to embed_tokens' (tie_word_embeddings)."""
    return DecoderForCausalLM(tie_word_embeddings=True), torch.randint(0, 37, (batch_size, seq_len))


HF_DECODER_LAYERS = [
    "model.embed_tokens",
    *(f"model.layers.{index}" for index in range(4)),
    "model.norm",
    "lm_head",
]
"""The pipeline layers of :func:`hf_decoder`, as the profiler finds them (a test checks)."""
