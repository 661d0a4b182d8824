"""The profiler's attention option: flash (fused, default) vs math (unfused, s×s in memory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.profile.attention import UnfusedAttentionMode
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile

REFERENCE = Path(__file__).resolve().parents[1] / "profiles"

# GPT-2 small block: h 768, 12 heads; bf16 (2 bytes); micro-batch 2 at sequence 512.
B, S, H, HEADS = 2, 512, 768, 12


@pytest.fixture(scope="module")
def blocks() -> dict[str, object]:
    return {
        kernel: profile_model("gpt2-small", S, B, "bf16", attention=kernel).layers[1]
        for kernel in ("flash", "math")
    }


def test_math_attention_costs_the_s_by_s_scores_counted_by_hand(blocks: dict) -> None:
    flash, math = blocks["flash"], blocks["math"]
    assert flash.kind == math.kind == "block"
    scores = HEADS * S * S * B  # elements of one s×s tensor per block
    bsh = B * S * H
    # Matmuls: the same forward; flash's backward recomputes QKᵀ (one s×s bmm), math's does not.
    assert math.forward_flops == flash.forward_flops
    assert flash.backward_flops - math.backward_flops == 2 * B * S * S * H
    # Unfused, every forward matmul has exactly two backward ones (Megatron-LM's 3× count).
    assert math.backward_flops == 2 * math.forward_flops
    # Forward, memory-bound: softmax reads and writes the scores (2 × 2 bytes each); the
    # per-sample outputs are stacked once (read + write b·s·h); the causal bias is built once
    # (full writes s², triu reads and writes s², 2 bytes each).
    forward_extra = 4 * scores + 4 * bsh + 6 * S * S
    assert math.forward_memory_bound_bytes - flash.forward_memory_bound_bytes == forward_extra
    # Backward: softmax backward reads the gradient and the probabilities and writes the
    # gradient (6 bytes per score); q, k, v gradients are stacked back (3 × 4 b·s·h) and
    # baddbmm's alpha scales the q and k gradients (2 × 4 b·s·h).
    backward_extra = 6 * scores + 20 * bsh
    assert math.backward_memory_bound_bytes - flash.backward_memory_bound_bytes == backward_extra
    assert forward_extra > 0.8 * (4 * scores)  # the s×s traffic dominates the difference


def test_math_attention_saves_the_probabilities_as_korthikanti_counts(blocks: dict) -> None:
    """Korthikanti et al. (2022): sbh(34 + 5as/h) bytes per block; with no dropout the two
    sbh-byte masks and, of the 5as²b score bytes, the dropout mask and output go: sbh·32 +
    2as²b (the softmax output, saved once for the softmax and the ·V backward)."""
    flash, math = blocks["flash"], blocks["math"]
    sbh = S * B * H
    probabilities = 2 * HEADS * S * S * B
    assert math.saved_activation_bytes == pytest.approx(32 * sbh + probabilities, rel=0.01)
    # Flash saves a fp32 logsumexp per query and head instead.
    logsumexp = 4 * HEADS * S * B
    assert math.saved_activation_bytes - flash.saved_activation_bytes == (probabilities - logsumexp)
    # Selective recompute drops the core's s×s either way: both keep the same bytes.
    assert math.selective_recompute_saved_bytes == flash.selective_recompute_saved_bytes
    assert math.selective_recompute_flops == flash.selective_recompute_flops


def test_profile_records_the_kernel_and_old_profiles_read_as_flash(tmp_path: Path) -> None:
    math = profile_model("gpt-tiny", 16, 2, attention="math")
    assert math.attention_kernel == "math" and "unfused" in math.method
    assert profile_model("gpt-tiny", 16, 2).attention_kernel == "flash"
    # A profile written before the field (the key left out) reads as flash.
    data = json.loads((REFERENCE / "gpt2-small.profile.json").read_text())
    data.pop("attention_kernel", None)
    old = tmp_path / "old.profile.json"
    old.write_text(json.dumps(data))
    assert read_json_model(old, Profile).attention_kernel == "flash"
    with pytest.raises(InputError, match="attention kernel must be one of flash, math"):
        profile_model("gpt-tiny", 16, 2, attention="xformers")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "case", ["causal", "bool mask", "float mask per sample", "no mask", "3-d", "gqa"]
)
def test_unfused_attention_computes_what_sdpa_computes(case: str) -> None:
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q, k, v = rand(2, 4, 8, 5), rand(2, 4, 8, 5), rand(2, 4, 8, 3)
    kwargs: dict = {"scale": 0.7}
    if case == "causal":
        kwargs["is_causal"] = True
    elif case == "bool mask":
        kwargs["attn_mask"] = torch.rand(8, 8, generator=generator) > 0.3
        kwargs["attn_mask"][:, 0] = True
    elif case == "float mask per sample":
        kwargs["attn_mask"] = rand(2, 1, 8, 8)
    elif case == "3-d":
        q, k, v = q[0], k[0], v[0]
    elif case == "gqa":
        k, v = k[:, :2], v[:, :2]
        kwargs["enable_gqa"] = True
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with UnfusedAttentionMode():
        got = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


def test_cli_attention_option(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "math.json"
    result = runner.invoke(
        app, ["profile", "gpt-tiny", "--seq", "16", "--attention", "math", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert read_json_model(out, Profile).attention_kernel == "math"
    bad = runner.invoke(
        app, ["profile", "gpt-tiny", "--seq", "16", "--attention", "fused", "-o", str(out)]
    )
    assert bad.exit_code == 2
    assert "attention kernel must be one of flash, math, got 'fused'" in bad.output
