"""Mixture-of-experts models: published total and active parameter counts (zoo and Hugging
Face configs), routing with a capacity, and fake-tensor profiling of Mixtral-8x7B.

Counts are taken on the meta device: Mixtral's 46.7 B parameters cost nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autoplan.profile.profiler import profile_model
from autoplan.zoo import get_model_spec
from autoplan.zoo.moe import MoE, MoEConfig, expert_capacity

DATA = Path(__file__).resolve().parent / "data" / "hf"

# (zoo name, its Hugging Face config folder, total, published total and active in billions).
# Totals: the Hugging Face models' num_parameters(); the one-decimal figures are the model
# cards', rounded or cut (Mixtral: 46.7 B total, 12.9 B active; Qwen1.5-MoE-A2.7B: 14.3 B,
# 2.7 B; DeepSeekMoE 16B: 16.4 B, 2.8 B; Qwen3-30B-A3B: 30.5 B, 3.3 B for 3.35 B active).
PUBLISHED = [
    ("mixtral-8x7b", "mixtral-8x7b", 46_702_792_704, 46.7, 12.9),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", 30_532_122_624, 30.5, 3.3),
    ("qwen1.5-moe-a2.7b", "qwen1.5-moe-a2.7b", 14_315_784_192, 14.3, 2.7),
    ("deepseek-moe-16b", "deepseek-moe-16b", 16_375_728_128, 16.4, 2.8),
]


def _one_decimal(count: int) -> tuple[float, float]:
    """``count`` in billions as a card writes it: rounded, or cut, to one decimal."""
    return round(count / 1e9, 1), math.floor(count / 1e8) / 10


@pytest.mark.parametrize(("name", "folder", "total", "billions", "active"), PUBLISHED)
def test_zoo_and_hf_counts_equal_the_published_total_and_active(
    name: str, folder: str, total: int, billions: float, active: float
) -> None:
    for spec in (get_model_spec(name), get_model_spec(f"hf:{DATA / folder}")):
        assert spec.parameter_count() == total
        assert billions in _one_decimal(spec.parameter_count())
        assert active in _one_decimal(spec.active_parameter_count())


def test_hf_configs_build_the_zoo_configs() -> None:
    for name, folder, *_ in PUBLISHED:
        zoo = get_model_spec(name).build.args[0]  # type: ignore[attr-defined]
        hf = get_model_spec(f"hf:{DATA / folder}").build.args[0]  # type: ignore[attr-defined]
        assert hf == zoo, name


def test_active_count_of_a_dense_model_is_its_count() -> None:
    spec = get_model_spec("llama-tiny")
    assert spec.active_parameter_count() == spec.parameter_count()


def _reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax, top-k, each pick through its expert unless the expert's
    slots are full (picks fill them in token order)."""
    tokens = x.reshape(-1, x.shape[-1])
    capacity = moe.capacity(tokens.shape[0])
    used = [0] * moe.num_experts
    out = torch.zeros_like(tokens)
    experts = moe.experts
    for t, token in enumerate(tokens):
        probs = torch.softmax(moe.router(token), dim=-1)
        weights, chosen = probs.topk(moe.top_k)
        if moe.normalize_top_k:
            weights = weights / weights.sum()
        for weight, e in zip(weights, chosen.tolist(), strict=True):
            if used[e] < capacity:
                used[e] += 1
                hidden = torch.nn.functional.silu(token @ experts.gate[e]) * (token @ experts.up[e])
                out[t] += weight * (hidden @ experts.down[e])
        if moe.shared is not None:
            shared = moe.shared(token)
            if moe.shared_gate is not None:
                shared = torch.sigmoid(moe.shared_gate(token)) * shared
            out[t] += shared
    return out.view(x.shape)


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("shared", [False, True])
def test_dispatch_equals_token_by_token_routing(capacity_factor: float, shared: bool) -> None:
    torch.manual_seed(0)
    config = MoEConfig(
        1, 16, 2, 2, 32, 64, 64, num_experts=4, top_k=2, expert_ffn_hidden_size=24,
        shared_ffn_hidden_size=16 if shared else None, shared_expert_gate=shared,
        normalize_top_k=not shared, capacity_factor=capacity_factor,
    )  # fmt: skip
    moe = MoE(config).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    assert torch.allclose(moe(x), _reference(moe, x), atol=1e-12, rtol=0)


def test_capacity_drops_what_does_not_fit() -> None:
    # 15 tokens, top 2 of 4 experts, factor 0.5: ceil(0.5 · 15 · 2 / 4) = 4 slots per expert,
    # 16 slots for 30 picks: at least 14 picks are dropped.
    assert expert_capacity(15, 2, 4, 0.5) == 4
    assert expert_capacity(8, 2, 8, 1.25) == 3  # 2.5 rounds up
    assert expert_capacity(1, 1, 64, 1.0) == 1


def test_mixtral_profiles_on_fake_tensors_with_expert_flops() -> None:
    profile = profile_model(f"hf:{DATA / 'mixtral-8x7b'}", 4096, 1)
    assert profile.model.parameter_count == 46_702_792_704
    assert profile.model.active_parameter_count == 12_879_925_248  # 12.9 B
    assert profile_model("llama-tiny", 16, 1).model.active_parameter_count is None
    block = profile.layers[1]
    # Attention projections and core, plus the experts at their capacity: ceil(1.25 · 4096 ·
    # 2 / 8) = 1280 slots of each of 8 experts, 2 · 3 · h · f FLOPs a slot.
    h, f, s = 4096, 14336, 4096
    projections = 2 * s * (2 * h * h + 2 * h * 1024)
    experts = 8 * 1280 * 2 * 3 * h * f
    attention_core = 4 * s * s * h  # the CPU flash formula counts the full s × s
    router = 2 * s * h * 8
    assert block.forward_flops == projections + experts + attention_core + router
