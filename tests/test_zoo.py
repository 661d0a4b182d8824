"""The model zoo: exact parameter counts, GQA/RoPE LLaMA, tensor-parallel-ready attention,
stage slicing, factories and name errors.

Counts are taken on the meta device (nothing allocated): the 1T model is counted too.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.zoo import get_model_spec, keep_layers, model_names
from autoplan.zoo.gpt import SelfAttention
from autoplan.zoo.presets import KORTHIKANTI_TABLE3, MEGATRON_TABLE1, PRESET_CONFIGS


def _gpt_closed_form(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Megatron-LM SC'21 (Narayanan et al.), section 5.1: P = 12lh²(1 + 13/12h + (V+s)/12lh),
    plus the final LayerNorm's 2h, which the paper's formula leaves out. Exact fractions."""
    n, h = layers, hidden
    paper = 12 * n * h * h * (1 + Fraction(13, 12 * h) + Fraction(vocab + seq, 12 * n * h))
    assert paper.denominator == 1
    return int(paper) + 2 * h


@pytest.mark.parametrize("name", sorted(MEGATRON_TABLE1 | KORTHIKANTI_TABLE3))
def test_megatron_table1_parameter_counts_equal_the_closed_form(name: str) -> None:
    heads, hidden, layers = (MEGATRON_TABLE1 | KORTHIKANTI_TABLE3)[name]
    spec = get_model_spec(name)
    assert (spec.num_attention_heads, spec.hidden_size, spec.num_blocks) == (heads, hidden, layers)
    assert spec.parameter_count() == _gpt_closed_form(layers, hidden, 51200, 2048)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("gpt2-small", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-xl", 1_557_611_200),
        ("gpt-neo-2.7b", 2_651_307_520),
        ("opt-350m", 331_196_416),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("bert-large", 335_174_458),
    ],
)
def test_parameter_counts_equal_the_published_ones(name: str, published: int) -> None:
    # Published: the Hugging Face models' num_parameters() (OPT, GPT-Neo, BERT: *ForMaskedLM /
    # *ForCausalLM) and the Llama model cards' exact counts.
    assert get_model_spec(name).parameter_count() == published


def test_gpt3_175b_has_the_paper_shape_and_the_closed_form_count() -> None:
    spec = get_model_spec("gpt3-175b")
    assert (spec.num_blocks, spec.hidden_size, spec.num_attention_heads) == (96, 12288, 96)
    count = spec.parameter_count()
    assert count == _gpt_closed_form(96, 12288, 50257, 2048)
    assert 174e9 < count < 176e9


def test_every_zoo_name_resolves_and_tiny_models_run_for_real() -> None:
    assert {"gpt-tiny", "llama-tiny", "gpt3-175b", "megatron-1t", "bert-large"} <= set(
        model_names()
    )
    for name in ("gpt-tiny", "llama-tiny"):
        spec = get_model_spec(name)
        model = spec.build()
        logits = model(spec.example_input(2, 16))
        assert logits.shape == (2, 16, spec.vocab_size)
        assert torch.isfinite(logits).all()


def test_llama_tiny_has_grouped_query_attention_and_untied_head() -> None:
    spec = get_model_spec("llama-tiny")
    model = spec.build()
    attention = model.layers["block_0"].attn
    head_dim = 32 // 4
    assert attention.q.weight.shape == (4 * head_dim, 32)
    assert attention.k.weight.shape == (2 * head_dim, 32)
    assert attention.v.weight.shape == (2 * head_dim, 32)
    assert isinstance(model.layers["block_0"].attn_norm, nn.RMSNorm)
    assert model.layers["head"].output.weight is not model.layers["embed"].token.weight
    assert spec.tensor_parallel_divisor == 2  # gcd(4 heads, 2 kv heads, ffn 64)


def test_gpt_presets_tie_the_head_and_gpt_tiny_does_not() -> None:
    gpt2 = get_model_spec("gpt2-small")
    with torch.device("meta"):
        model = gpt2.build()
    assert model.layers["head"].output.weight is model.layers["embed"].token.weight
    tiny = get_model_spec("gpt-tiny").build()
    assert tiny.layers["head"].output.weight is not tiny.layers["embed"].token.weight


def test_rope_makes_attention_depend_on_position() -> None:
    """Attention without positions is blind to the order of the keys: swapping two earlier
    tokens leaves the last position's output unchanged. With RoPE it must change it."""
    torch.manual_seed(0)
    attention = get_model_spec("llama-tiny").build().layers["block_0"].attn.double()
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    swapped = x[:, [1, 0, 2, 3]]
    assert not torch.allclose(attention(x)[0, 3], attention(swapped)[0, 3])
    # The same swap through a GPT attention (no positions inside) changes nothing.
    gpt_attention = get_model_spec("gpt-tiny").build().layers["block_0"].attn.double()
    torch.testing.assert_close(gpt_attention(x)[0, 3], gpt_attention(swapped)[0, 3])


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_attention_runs_on_a_tensor_parallel_shard(name: str) -> None:
    """Split q/k/v by output columns (whole heads) and out by input columns, as ColwiseParallel
    and RowwiseParallel do: the sum of the two shards' outputs equals the whole attention."""
    torch.manual_seed(0)
    model = get_model_spec(name).build().double()
    attention = model.layers["block_0"].attn
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    expected = attention(x)
    total = torch.zeros_like(expected)
    degree = 2
    for rank in range(degree):
        shard = type(attention).__new__(type(attention))
        nn.Module.__init__(shard)
        shard.__dict__.update(
            {k: v for k, v in attention.__dict__.items() if not k.startswith("_")}
        )
        for projection in ("q", "k", "v"):
            whole = getattr(attention, projection)
            rows = whole.out_features // degree
            local = nn.Linear(32, rows, bias=whole.bias is not None, dtype=torch.float64)
            local.weight.data = whole.weight.data[rank * rows : (rank + 1) * rows]
            if whole.bias is not None:
                local.bias.data = whole.bias.data[rank * rows : (rank + 1) * rows]
            setattr(shard, projection, local)
        cols = attention.out.in_features // degree
        out = nn.Linear(cols, 32, bias=False, dtype=torch.float64)
        out.weight.data = attention.out.weight.data[:, rank * cols : (rank + 1) * cols]
        shard.out = out
        total += shard(x)
    if attention.out.bias is not None:
        total += attention.out.bias
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-12)


def test_keep_layers_slices_a_stage_and_keeps_parameter_names() -> None:
    model = get_model_spec("llama-tiny").build()
    names = dict(model.named_parameters())
    stage = keep_layers(model, 2, 4)
    assert stage.layer_names() == ["block_1", "block_2"]
    for name, parameter in stage.named_parameters():
        assert names[name] is parameter
    assert "layers.block_1.attn.q.weight" in dict(stage.named_parameters())


def test_unknown_name_offers_the_nearest_names() -> None:
    with pytest.raises(InputError, match=r"unknown model 'llama2-7x'; did you mean llama2-7b"):
        get_model_spec("llama2-7x")


def test_factory_paths_load_and_bad_ones_fail_in_one_line() -> None:
    spec = get_model_spec("tests.test_zoo:make_two_linears")
    module, example = spec.build_with_input(3, 5)
    assert isinstance(module, nn.Sequential)
    assert example.shape == (3, 5, 16)
    with pytest.raises(InputError, match=r"cannot import module 'no_such_package\.models'"):
        get_model_spec("no_such_package.models:build")
    with pytest.raises(InputError, match="has no 'missing'"):
        get_model_spec("tests.test_zoo:missing")


def make_two_linears(batch_size: int = 1, seq_len: int = 1) -> tuple[nn.Module, torch.Tensor]:
    """A factory as users write them: (module, example input)."""
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)), torch.randn(
        batch_size, seq_len, 16
    )


def test_every_preset_config_is_in_the_zoo() -> None:
    assert set(PRESET_CONFIGS) == set(model_names())


def test_gpt_neo_alternates_global_and_local_attention() -> None:
    with torch.device("meta"):
        model = get_model_spec("gpt-neo-2.7b").build()
    windows = [model.layers[f"block_{i}"].attn.window for i in range(4)]
    assert windows == [None, 256, None, 256]
    # A local window of 4: the first token reaches positions 0..3 only.
    attention = SelfAttention(16, 2, causal=True, window=4, scale=1.0).double()
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    nudged = x.clone()
    nudged[0, 0] += 1.0
    changed = (attention(x) - attention(nudged)).abs().amax(dim=-1)[0]
    assert (changed[:4] > 0).all()
    assert (changed[4:] == 0).all()
