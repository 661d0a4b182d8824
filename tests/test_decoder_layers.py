"""Decoder-shaped models (an embedding, a ModuleList of blocks, a norm, a head, a forward that
loops over the list, as Hugging Face and torchtitan write them) profile as their layers, solve,
and build pipeline stages that compute the model's own forward (autoplan.zoo.decoder).

The torchrun runs of such a model (1F1B over two stages; GPipe with two replicas) are in
tests/test_runtime_distributed.py ('hf_decoder_*'), compared with single-process training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.profile import profile_model
from autoplan.profile.schema import ModelRef, Profile
from autoplan.runtime.check import check_runnable
from autoplan.runtime.model_stage import build_full_model, build_stage_models
from autoplan.solve import SolveOptions, solve
from tests.runtime_models import HF_DECODER_LAYERS, DecoderForCausalLM

FACTORY = "tests.runtime_models:hf_decoder"
BLOCKS = 4


@pytest.fixture(scope="module")
def profile() -> Profile:
    return profile_model(FACTORY, 8, 1, "fp64")


def test_profiles_as_embedding_blocks_norm_and_head(profile: Profile) -> None:
    assert profile.model.num_layers == 1 + BLOCKS + 2
    assert profile.model.layer_modules == HF_DECODER_LAYERS
    assert [layer.name for layer in profile.layers] == HF_DECODER_LAYERS
    kinds = [layer.kind for layer in profile.layers]
    assert kinds == ["embedding", *["block"] * BLOCKS, "other", "head"]
    model = DecoderForCausalLM()
    for layer in profile.layers:
        expected = sum(p.numel() for p in model.get_submodule(layer.name).parameters())
        assert layer.param_count == expected, layer.name
    assert profile.model.parameter_count == sum(p.numel() for p in model.parameters())
    # Identical blocks are traced once; each costs what the first does.
    assert [layer.replica_of for layer in profile.layers[2 : 1 + BLOCKS]] == [1] * (BLOCKS - 1)
    assert profile.layers[1].forward_flops > 0 and profile.layers[-1].forward_flops > 0
    assert "largest ModuleList" in profile.notes[0]


def test_solves_into_a_pipeline_that_builds_and_computes_the_forward(profile: Profile) -> None:
    plan = solve(profile, load_cluster(example_cluster_path("cpu-local")), 4, SolveOptions(pp=2))
    assert len(plan.stages) == 2
    assert plan.inputs.model.layer_modules == HF_DECODER_LAYERS
    check_runnable(plan)
    stages, tied = build_stage_models(plan, list(plan.stages), seed=0)
    assert tied == []
    whole = build_full_model(FACTORY, "fp64", 0)  # the model as written, its own forward
    tokens = torch.randint(0, 37, (2, 8))
    hidden = tokens
    for stage_model in stages:
        hidden = stage_model(hidden)
    assert torch.equal(hidden, whole(tokens))
    # Parameter names are the model's own, each in exactly one stage.
    names = [name for stage_model in stages for name, _ in stage_model.named_parameters()]
    assert sorted(names) == sorted(name for name, _ in whole.named_parameters())


def test_tied_embedding_and_head_profile_once_and_tie_across_stages() -> None:
    tied = profile_model("tests.runtime_models:hf_decoder_tied", 8, 1, "fp64")
    assert tied.model.layer_modules == HF_DECODER_LAYERS
    # The shared weight counts once, where it is first (the embedding); the head owns none.
    assert tied.layers[-1].param_count == 0
    assert tied.model.parameter_count == sum(
        p.numel() for p in DecoderForCausalLM(tie_word_embeddings=True).parameters()
    )
    plan = solve(tied, load_cluster(example_cluster_path("cpu-local")), 4, SolveOptions(pp=2))
    stages, tied_weights = build_stage_models(plan, list(plan.stages), seed=0)
    (weight,) = tied_weights
    assert weight.names == ("model.embed_tokens.weight", "lm_head.weight")
    assert weight.stages == (0, len(plan.stages) - 1)
    # Each stage holds its own copy, equal at the start (the runtime sums their gradients).
    first = dict(stages[0].named_parameters())["model.embed_tokens.weight"]
    last = dict(stages[-1].named_parameters())["lm_head.weight"]
    assert first is not last and torch.equal(first, last)


@pytest.mark.skipif(torch.cuda.is_available(), reason="times the CPU in fp64 here")
def test_measure_times_each_layer_of_the_chain() -> None:
    measured = profile_model(FACTORY, 8, 1, "fp64", measure=True, measure_repeats=1)
    for layer in measured.layers:
        source = measured.layers[layer.replica_of] if layer.replica_of is not None else layer
        assert layer.measured == source.measured and len(layer.measured) == 1, layer.name
        assert layer.measured[0].forward_ms > 0 and layer.measured[0].backward_ms > 0


def test_named_layer_modules_split_where_told() -> None:
    """As pipelining's split points: the named modules (a ModuleList for its entries) and the
    modules the forward runs around them."""
    named = profile_model(FACTORY, 8, 1, "fp64", layer_modules=["model.layers"])
    assert named.model.layer_modules == HF_DECODER_LAYERS
    coarse = profile_model(FACTORY, 8, 1, "fp64", layer_modules=["model"])
    assert coarse.model.layer_modules == ["model", "lm_head"]
    assert [layer.kind for layer in coarse.layers] == ["block", "head"]


class _MaskedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.proj(hidden) if mask is None else self.proj(hidden) * mask


class _MaskedDecoder(torch.nn.Module):
    """Its blocks take a mask made in the model's forward: not a chain of one-tensor layers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.blocks = torch.nn.ModuleList(_MaskedBlock() for _ in range(3))
        self.scale = torch.nn.Parameter(torch.ones(8))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        mask = torch.ones_like(hidden)
        for block in self.blocks:
            hidden = block(hidden, mask=mask)
        return hidden * self.scale


def masked_decoder(batch_size: int = 1) -> tuple[torch.nn.Module, torch.Tensor]:
    return _MaskedDecoder(), torch.randint(0, 11, (batch_size, 4))


def test_a_model_that_is_no_chain_profiles_as_one_layer_saying_why() -> None:
    profile = profile_model("tests.test_decoder_layers:masked_decoder", 4, 1, "fp32")
    assert profile.model.num_layers == 1 and profile.model.layer_modules is None
    assert "'blocks.0' is called with mask besides the hidden state" in profile.notes[0]
    assert "profiled as one layer" in profile.notes[0]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["blocks"], "'blocks.0' is called with mask besides the hidden state"),
        (["blokcs"], "_MaskedDecoder has no module 'blokcs'"),
    ],
)
def test_named_layer_modules_that_do_not_work_are_refused(names: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        profile_model("tests.test_decoder_layers:masked_decoder", 4, 1, "fp32", layer_modules=names)


class _Unrolled(torch.nn.Module):
    """A parameter of the model itself is in no layer: its stages could not hold it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
        self.bias = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_parameter_outside_every_layer_is_refused() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoplan.zoo.decoder import find_layer_modules

    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        pytest.raises(InputError, match="parameter 'bias' is in none of its layers"),
    ):
        find_layer_modules(_Unrolled(), [torch.randn(2, 4)])


def test_cli_takes_layer_modules(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(
        app,
        ["profile", FACTORY, "--seq", "8", "--dtype", "fp64", "--layer-modules", "model.layers",
         "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert read_json_model(out, Profile).model.layer_modules == HF_DECODER_LAYERS
    bad = CliRunner().invoke(
        app, ["profile", "gpt-tiny", "--seq", "8", "--layer-modules", "layers", "-o", str(out)]
    )
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        "error: --layer-modules is for models whose layers are not already known; GPT's are "
        "its `layers` entries"
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_layers": 3, "layer_modules": ["a", "b"]}, "lists 2 modules; num_layers is 3"),
        (
            {"num_layers": 2, "layer_modules": ["a", "b"], "granularity": "sub-block"},
            "granularity is 'sub-block'",
        ),
    ],
)
def test_model_record_checks_its_layer_modules(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelRef(name="pkg.mod:build", parameter_count=0, **fields)
