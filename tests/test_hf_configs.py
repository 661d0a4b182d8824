"""Hugging Face configs as models ('hf:PATH'): published parameter counts, what each family's
options build, one-line errors, profiling and the runtime's rebuild from the profile's name.

The configs under tests/data/hf/ are the published config.json files (see its README); counts
are taken on the meta device, so the 20B model costs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from autoplan.checks import check_factory_trust, is_factory_name, model_name_problem
from autoplan.cli import app
from autoplan.cli.launch_cmd import runtime_args
from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.names import job_label
from autoplan.profile.schema import Profile
from autoplan.runtime.trainer import check_runnable
from autoplan.zoo import get_model_spec
from autoplan.zoo.llama import OffsetRMSNorm
from autoplan.zoo.rope import RopeScaling, apply_rotary
from tests.plan_factory import make_plan

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "hf"
runner = CliRunner()


def hf(folder: str) -> str:
    return f"hf:{DATA / folder}"


def build(folder: str) -> torch.nn.Module:
    with torch.device("meta"):
        return get_model_spec(hf(folder)).build()


@pytest.mark.parametrize(
    ("folder", "published"),
    [
        ("llama-3.1-8b", 8_030_261_248),
        ("mistral-7b-v0.1", 7_241_732_096),
        ("qwen2-7b", 7_615_616_512),
        ("gemma-2-9b", 9_241_705_984),
        ("gpt2", 124_439_808),
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.2-3b", 3_212_749_824),
        ("qwen2.5-0.5b", 494_032_768),
        ("gemma-2b", 2_506_172_416),
        ("gemma-7b", 8_537_680_896),
        ("gpt-neox-20b", 20_554_567_680),
        ("pythia-70m", 70_426_624),
        ("opt-125m", 125_239_296),
        ("opt-350m", 331_196_416),
        ("opt-1.3b", 1_315_758_080),
        ("phi-3-mini-4k", 3_821_079_552),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-0.6b", 596_049_920),
    ],
)
def test_parameter_counts_equal_the_published_ones(folder: str, published: int) -> None:
    # Published: the model cards' and Hugging Face's num_parameters() of *ForCausalLM.
    assert get_model_spec(hf(folder)).parameter_count() == published


@pytest.mark.parametrize(
    ("folder", "zoo"),
    [
        ("gpt2", "gpt2-small"),
        ("opt-350m", "opt-350m"),
        ("llama-3-8b", "llama3-8b"),
        ("qwen3-8b", "qwen3-8b"),
    ],
)
def test_a_config_of_a_zoo_model_builds_the_zoo_model(folder: str, zoo: str) -> None:
    with torch.device("meta"):
        expected = get_model_spec(zoo).build()
    shapes = {name: p.shape for name, p in build(folder).state_dict().items()}
    assert shapes == {name: p.shape for name, p in expected.state_dict().items()}


def test_a_folder_and_its_config_file_are_one_model_named_by_absolute_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(DATA)
    relative = get_model_spec("hf:llama-3.1-8b")
    assert relative.name == f"hf:{DATA / 'llama-3.1-8b' / 'config.json'}"
    assert get_model_spec(f"hf:{DATA / 'llama-3.1-8b' / 'config.json'}").name == relative.name
    assert (relative.family, relative.num_blocks, relative.max_seq_len) == ("llama", 32, 131072)
    assert relative.tensor_parallel_divisor == 8  # gcd(32 heads, 8 kv heads, 14336)


def test_families_build_their_published_structure() -> None:
    # Llama 3.2: the head is the embedding's weight; Llama 3.1: a llama3 RoPE scaling.
    small = build("llama-3.2-1b")
    assert small.layers["head"].output.weight is small.layers["embed"].token.weight
    scaling = build("llama-3.1-8b").layers["block_0"].attn.rope_scaling
    assert scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    # Qwen2: biases on q, k, v, none on the output projection; no window (use_sliding_window
    # is false).
    qwen = build("qwen2-7b").layers["block_0"].attn
    biases = [getattr(qwen, p).bias is not None for p in ("q", "k", "v", "out")]
    assert biases == [True, True, True, False]
    assert qwen.window is None
    # Qwen3: no biases; a query and a key RMSNorm of the head width (128, not 1024 / 16),
    # shared by every head; no window (use_sliding_window is false).
    qwen3 = build("qwen3-0.6b").layers["block_0"].attn
    assert [getattr(qwen3, p).bias for p in ("q", "k", "v", "out")] == [None] * 4
    assert qwen3.q_norm.weight.shape == qwen3.k_norm.weight.shape == (128,)
    assert (qwen3.q.out_features, qwen3.window) == (16 * 128, None)
    assert build("qwen2-7b").layers["block_0"].attn.q_norm is None
    # Mistral and Phi-3: every block slides its window.
    mistral, phi3 = build("mistral-7b-v0.1"), build("phi-3-mini-4k")
    assert {mistral.layers[f"block_{i}"].attn.window for i in range(32)} == {4096}
    assert {phi3.layers[f"block_{i}"].attn.window for i in range(32)} == {2047}
    # Gemma 2: even blocks local, odd global; four (1 + w) norms a block; 256-wide heads;
    # scores scaled by query_pre_attn_scalar ** -0.5; logits capped; head tied.
    gemma2 = build("gemma-2-9b")
    windows = [gemma2.layers[f"block_{i}"].attn.window for i in range(4)]
    assert windows == [4096, None, 4096, None]
    block = gemma2.layers["block_0"]
    norms = [m for m in block.modules() if isinstance(m, OffsetRMSNorm)]
    assert len(norms) == 4
    assert (block.attn.head_dim, block.attn.scale, gemma2.layers["head"].softcap) == (
        256,
        256**-0.5,
        30.0,
    )
    assert gemma2.layers["embed"].multiplier == pytest.approx(3584**0.5)
    # GPT-NeoX: rotary on a quarter of each head, no position table, parallel residual.
    neox = build("gpt-neox-20b")
    assert neox.layers["embed"].position is None
    assert neox.layers["block_0"].attn.rotary_dims == 96 // 4
    assert neox.layers["block_0"].parallel_residual
    # OPT-125M: pre-LayerNorm, a final norm, no projections (OPT-350M has both projections).
    opt = build("opt-125m")
    assert opt.layers["head"].norm is not None and opt.layers["head"].project_out is None
    assert build("opt-350m").layers["head"].norm is None


def test_llama3_rope_scaling_keeps_high_frequencies_and_divides_low_ones() -> None:
    """Llama 3.1 (theta 500,000, head 128, factor 8, original context 8192): a frequency keeps
    its value where its wavelength is under 8192 / 4, is divided by 8 above 8192 / 1; by hand,
    that is indices 0-28 kept and 35-63 divided, 29-34 blended, decreasing."""
    scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    factors = [scaling.frequency_factor(500000.0 ** (-i / 64)) for i in range(64)]
    assert factors[:29] == [1.0] * 29
    assert factors[35:] == [1 / 8] * 29
    blended = factors[29:35]
    assert all(1 / 8 < f < 1 for f in blended) and blended == sorted(blended, reverse=True)
    assert RopeScaling("linear", 4.0).frequency_factor(0.5) == 0.25


def test_partial_rotary_leaves_the_other_dimensions_alone() -> None:
    x = torch.randn(1, 2, 5, 16, dtype=torch.float64)
    rotated = apply_rotary(x, 10000.0, rotary_dims=4)
    torch.testing.assert_close(rotated[..., 4:], x[..., 4:], rtol=0, atol=0)
    assert not torch.allclose(rotated[..., :4], x[..., :4])


def test_qwen3_heads_are_normalised_one_by_one_before_rope(tmp_path: Path) -> None:
    """tiny-qwen3 (its norms' epsilon made negligible): each head's query and key pass an
    RMSNorm of the head width, so scaling the projection rows of one head (its 32 output
    features) changes nothing; scaling a single feature of it does (the norm divides by the
    head's root mean square, not by each feature)."""
    torch.manual_seed(0)
    config = json.loads((DATA / "tiny-qwen3" / "config.json").read_text())
    spec = get_model_spec(_write(tmp_path, {**config, "rms_norm_eps": 1e-30}))
    attn = spec.build().double().layers["block_0"].attn
    x = torch.randn(2, 6, 64, dtype=torch.float64)
    before = attn(x)
    with torch.no_grad():
        attn.q.weight[32:64] *= 10.0  # query head 1
        attn.k.weight[:32] *= 0.1  # key head 0
    torch.testing.assert_close(attn(x), before, rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        attn.q.weight[40] *= 10.0
    assert not torch.allclose(attn(x), before)


def test_sliding_window_blocks_see_only_the_last_window_of_tokens() -> None:
    """tiny-gemma2: window 8, block 0 local, block 1 global. Nudging token 0 changes block 0's
    attention output at positions 0-7 only, block 1's everywhere."""
    torch.manual_seed(0)
    model = get_model_spec(hf("tiny-gemma2")).build().double()
    x = torch.randn(1, 16, 64, dtype=torch.float64)
    nudged = x.clone()
    nudged[0, 0] += 1.0
    for block, reach in (("block_0", 8), ("block_1", 16)):
        attention = model.layers[block].attn
        changed = (attention(x) - attention(nudged)).abs().amax(dim=-1)[0]
        assert (changed[:reach] > 0).all() and (changed[reach:] == 0).all(), block


def test_gemma_norms_scale_by_one_plus_weight_and_logits_are_capped() -> None:
    norm = OffsetRMSNorm(8, eps=1e-6).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (8,), eps=1e-6))
    torch.manual_seed(0)
    head = get_model_spec(hf("tiny-gemma2")).build().double().layers["head"]
    hidden = torch.randn(2, 16, 64, dtype=torch.float64)
    with torch.no_grad():
        head.output.weight.mul_(100)  # uncapped logits far beyond the cap of 30
        uncapped = head.output(head.norm(hidden))
        capped = head(hidden)
    assert uncapped.abs().max() > 100
    torch.testing.assert_close(capped, 30 * torch.tanh(uncapped / 30))


@pytest.mark.parametrize(
    ("folder", "blocks_traced"), [("tiny-llama", 1), ("tiny-gemma2", 2), ("tiny-neox", 1)]
)
def test_profile_of_an_hf_config_names_it_by_absolute_path(
    folder: str, blocks_traced: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(DATA)
    out = tmp_path / "p.json"
    result = runner.invoke(
        app, ["profile", f"hf:{folder}", "--seq", "16", "--dtype", "fp32", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    profile = read_json_model(out, Profile)
    assert profile.model.name == f"hf:{DATA / folder / 'config.json'}"
    assert profile.model.parameter_count == get_model_spec(hf(folder)).parameter_count()
    assert [layer.kind for layer in profile.layers] == ["embedding", "block", "block", "head"]
    # Blocks of different windows are traced apart; identical ones once.
    assert sum(1 for i in profile.profiled_layer_indices if 0 < i < 3) == blocks_traced
    assert model_name_problem(profile.model.name) is None


def _write(tmp_path: Path, config: object) -> str:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return f"hf:{path}"


def _tiny_llama() -> dict:
    return json.loads((DATA / "tiny-llama" / "config.json").read_text())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {
                **json.loads((DATA / "mixtral-8x7b" / "config.json").read_text()),
                "model_type": "dbrx",
            },
            "dbrx is a mixture-of-experts model (8 experts) of a family autoplan does not read",
        ),
        (
            {
                **json.loads((DATA / "mixtral-8x7b" / "config.json").read_text()),
                "num_experts_per_tok": 9,
            },
            "top_k (9) must be from 1 to num_experts (8)",
        ),
        ({**_tiny_llama(), "model_type": "bloom"}, "model_type 'bloom' is not supported"),
        ({"hidden_size": 64}, "no 'model_type': not a Hugging Face model config"),
        ("{not json", "not JSON"),
        ("[1, 2]", "the top level is not a JSON object"),
        ({**_tiny_llama(), "num_hidden_layers": "2"}, "num_hidden_layers must be a whole number"),
        ({**_tiny_llama(), "vocab_size": 10**9}, "vocab_size must be a whole number from 1"),
        ({k: v for k, v in _tiny_llama().items() if k != "hidden_size"}, "no 'hidden_size'"),
        ({**_tiny_llama(), "num_key_value_heads": 3}, "must be divisible by num_kv_heads (3)"),
        ({**_tiny_llama(), "rope_scaling": {"rope_type": "warp"}}, "rope_scaling type 'warp'"),
        ({**_tiny_llama(), "hidden_act": "tanh"}, "hidden_act 'tanh' is not supported"),
        ({**_tiny_llama(), "num_experts": 4}, "(4 experts) of a family autoplan does not read"),
        # Found by fuzzing: an odd head width reached RoPE and failed inside torch's tracing.
        ({**_tiny_llama(), "head_dim": 3}, "RoPE rotates 3 dimensions of each head"),
        (
            {**json.loads((DATA / "tiny-neox" / "config.json").read_text()), "rotary_pct": 0.1},
            "RoPE rotates 1 dimensions of each head",
        ),
    ],
)
def test_bad_configs_are_one_line_and_exit_code_2(
    config: object, message: str, tmp_path: Path
) -> None:
    name = _write(tmp_path, config)
    result = runner.invoke(app, ["profile", name, "--seq", "16", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert not (tmp_path / "x.json").exists()


def test_missing_files_and_folders_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        get_model_spec(f"hf:{tmp_path / 'nothing.json'}")
    with pytest.raises(InputError, match=r"no config\.json in the folder"):
        get_model_spec(f"hf:{tmp_path}")
    with pytest.raises(InputError, match="'hf:' needs a path"):
        get_model_spec("hf:")


def test_null_values_read_as_hugging_faces_defaults(tmp_path: Path) -> None:
    config = {**_tiny_llama(), "num_key_value_heads": None, "rope_theta": None, "head_dim": None}
    spec = get_model_spec(_write(tmp_path, config))
    attention = spec.build().layers["block_0"].attn
    assert (attention.num_kv_heads, attention.head_dim, attention.rope_theta) == (4, 16, 10000.0)


def test_long_rope_and_yarn_scalings_are_accepted_as_plain_rope(tmp_path: Path) -> None:
    for scaling in (
        {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    ):
        spec = get_model_spec(_write(tmp_path, {**_tiny_llama(), "rope_scaling": scaling}))
        assert spec.build().layers["block_0"].attn.rope_scaling is None


def test_hf_names_are_checked_by_syntax_and_never_run_as_factories() -> None:
    name = hf("tiny-llama/config.json")
    assert model_name_problem(name) is None
    assert model_name_problem("hf:relative/config.json") is not None  # plans hold absolute
    assert model_name_problem("hf:/x\ny") is not None
    # 'hf:a.b' has the factory form, but an 'hf:' name is a config, never code to import.
    assert not is_factory_name("hf:llama.json")
    assert "--factory" not in runtime_args(1, None, name)
    check_factory_trust(name, trusted=False, named=None, source="the plan", action="run")
    assert job_label(name) == "hf-tiny-llama"


def test_the_runtime_rebuilds_the_model_and_refuses_a_changed_config(tmp_path: Path) -> None:
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text((DATA / "tiny-llama" / "config.json").read_text())
    plan = make_plan([2, 2], model=f"hf:{config}", num_micro_batches=2)
    assert plan.inputs.model.parameter_count == 90_432
    check_runnable(plan)
    config.write_text(json.dumps({**_tiny_llama(), "intermediate_size": 96}))
    with pytest.raises(
        InputError, match=r"now has 78,144 parameters; the plan was made for 90,432"
    ):
        check_runnable(plan)


def test_one_process_run_of_an_hf_plan_needs_no_trust_and_trains(tmp_path: Path) -> None:
    from autoplan.runtime.report import RunReport
    from tests.single_process_reference import reference_training

    plan = make_plan([4], model=get_model_spec(hf("tiny-neox")).name, num_micro_batches=2)
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "report.json"
    write_json_model(plan_path, plan)
    clean = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    command = [sys.executable, "-m", "autoplan.runtime", str(plan_path), "--steps", "2"]
    result = subprocess.run(
        [*command, "--report", str(report_path)],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = read_json_model(report_path, RunReport)
    expected, _ = reference_training(plan, 2)
    assert [s.loss for s in report.steps] == pytest.approx(expected, abs=1e-10)
