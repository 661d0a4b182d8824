"""The zoo's named models and their published shapes.

Sources for the shapes (all parameter counts are checked in tests/test_zoo.py):
GPT-2: Radford et al. 2019 and the Hugging Face configs (gpt2, gpt2-medium, gpt2-xl);
GPT-3 175B: Brown et al. 2020, Table 2.1; Megatron-LM: Narayanan et al., SC'21, Table 1
(vocabulary 51,200, sequence 2,048), and the 22B and 175B of Korthikanti et al. 2022, Table 3
(its 530B and 1T are Table 1's 529.6B and 1T); GPT-Neo 2.7B and OPT-350M: their Hugging Face
configs; Llama-2: Touvron et al. 2023 and meta-llama configs; Llama-3: meta-llama/Meta-Llama-3
configs; BERT-large: Devlin et al. 2019 (bert-large-uncased config); mixture-of-experts:
the Hugging Face configs of mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen1.5-MoE-A2.7B and
deepseek-ai/deepseek-moe-16b-base (total and active counts in tests/test_zoo_moe.py).
"""

from __future__ import annotations

from typing import Any

from autoplan.zoo.bert import BertConfig
from autoplan.zoo.gpt import GPTConfig
from autoplan.zoo.llama import LlamaConfig
from autoplan.zoo.moe import MoEConfig
from autoplan.zoo.opt import OPTConfig

__all__ = ["KORTHIKANTI_TABLE3", "MEGATRON_TABLE1", "PRESET_CONFIGS", "PresetConfig"]

PresetConfig = GPTConfig | LlamaConfig | BertConfig | OPTConfig | MoEConfig

# Megatron-LM SC'21 Table 1: name → (attention heads, hidden size, layers).
MEGATRON_TABLE1: dict[str, tuple[int, int, int]] = {
    "megatron-1.7b": (24, 2304, 24),
    "megatron-3.6b": (32, 3072, 30),
    "megatron-7.5b": (32, 4096, 36),
    "megatron-18.4b": (48, 6144, 40),
    "megatron-39.1b": (64, 8192, 48),
    "megatron-76.1b": (80, 10240, 60),
    "megatron-145.6b": (96, 12288, 80),
    "megatron-310.1b": (128, 16384, 96),
    "megatron-529.6b": (128, 20480, 105),
    "megatron-1t": (160, 25600, 128),
}

# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
# Table 3, the models not in Table 1: name → (attention heads, hidden size, layers).
KORTHIKANTI_TABLE3: dict[str, tuple[int, int, int]] = {
    "megatron-22b": (64, 6144, 48),
    "megatron-175b": (96, 12288, 96),
}

_GPT2_VOCAB = 50257
# What every Qwen3 shares beside its shape (its config.json's rope_theta, rms_norm_eps,
# head_dim; the per-head query and key norms).
_QWEN3: dict[str, Any] = {
    "rope_theta": 1e6,
    "norm_eps": 1e-6,
    "attention_head_dim": 128,
    "qk_norm": True,
}

PRESET_CONFIGS: dict[str, PresetConfig] = {
    "gpt2-small": GPTConfig(12, 768, 12, _GPT2_VOCAB, 1024),
    "gpt2-medium": GPTConfig(24, 1024, 16, _GPT2_VOCAB, 1024),
    "gpt2-xl": GPTConfig(48, 1600, 25, _GPT2_VOCAB, 1024),
    # GPT-Neo: no q/k/v biases, unscaled attention scores, global and 256-token local
    # attention alternating (Hugging Face's attention_types [["global", "local"], 16]).
    "gpt-neo-2.7b": GPTConfig(
        32,
        2560,
        20,
        _GPT2_VOCAB,
        2048,
        qkv_bias=False,
        local_attention_window=256,
        attention_scale=1.0,
    ),
    "opt-350m": OPTConfig(24, 1024, 16, 4096, 50272, 2048, word_embed_size=512),
    **{
        name: GPTConfig(layers, hidden, heads, 51200, 2048)
        for name, (heads, hidden, layers) in (MEGATRON_TABLE1 | KORTHIKANTI_TABLE3).items()
    },
    "gpt3-175b": GPTConfig(96, 12288, 96, _GPT2_VOCAB, 2048),
    "llama2-7b": LlamaConfig(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": LlamaConfig(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": LlamaConfig(80, 8192, 64, 8, 28672, 32000, 4096),
    "llama3-8b": LlamaConfig(32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
    "llama3-70b": LlamaConfig(80, 8192, 64, 8, 28672, 128256, 8192, rope_theta=500000.0),
    # Qwen3: a query and key RMSNorm per head, heads 128 wide whatever the hidden width.
    "qwen3-8b": LlamaConfig(36, 4096, 32, 8, 12288, 151936, 40960, **_QWEN3),
    "bert-large": BertConfig(24, 1024, 16, 30522, 512),
    # Mixture-of-experts: 8 experts, top 2, renormalised (Mixtral); 60 fine-grained experts,
    # top 4, and a gated shared expert (Qwen1.5-MoE); 64 fine-grained experts, top 6, two
    # shared experts (one MLP of 2 × 1408) and a dense first block (DeepSeekMoE).
    "mixtral-8x7b": MoEConfig(
        32,
        4096,
        32,
        8,
        14336,
        32000,
        32768,
        rope_theta=1e6,
        num_experts=8,
        top_k=2,
        normalize_top_k=True,
    ),
    "qwen1.5-moe-a2.7b": MoEConfig(
        24,
        2048,
        16,
        16,
        5632,
        151936,
        8192,
        rope_theta=1e6,
        norm_eps=1e-6,
        qkv_bias=True,
        num_experts=60,
        top_k=4,
        expert_ffn_hidden_size=1408,
        shared_ffn_hidden_size=5632,
        shared_expert_gate=True,
    ),
    # Qwen3-30B-A3B: 128 fine-grained experts, top 8, renormalised; no shared expert.
    "qwen3-30b-a3b": MoEConfig(
        48,
        2048,
        32,
        4,
        6144,
        151936,
        40960,
        **_QWEN3,
        num_experts=128,
        top_k=8,
        expert_ffn_hidden_size=768,
        normalize_top_k=True,
    ),
    "deepseek-moe-16b": MoEConfig(
        28,
        2048,
        16,
        16,
        10944,
        102400,
        4096,
        norm_eps=1e-6,
        num_experts=64,
        top_k=6,
        expert_ffn_hidden_size=1408,
        shared_ffn_hidden_size=2816,
        dense_layers=(0,),
    ),
    # Tiny models for tests and the demo: fast on a CPU, float64-exact comparisons.
    "gpt-tiny": GPTConfig(4, 32, 4, 128, 64, tie_embeddings=False),
    "llama-tiny": LlamaConfig(4, 32, 4, 2, 64, 128, 64),
    # capacity_factor = experts / top_k: every expert has a slot for every token, so nothing
    # is dropped however the tokens are split over ranks (the expert-parallel runtime's test).
    "moe-tiny": MoEConfig(
        4,
        32,
        4,
        2,
        64,
        128,
        64,
        num_experts=4,
        top_k=2,
        expert_ffn_hidden_size=48,
        shared_ffn_hidden_size=32,
        capacity_factor=2.0,
        dense_layers=(0,),
    ),
}
