"""Names → model specs: the zoo's presets, Hugging Face configs ('hf:PATH', autoplan.zoo.hf) and
user factories ('package.module:callable')."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.names import is_hf_name
from autoplan.zoo.bert import Bert, BertConfig
from autoplan.zoo.factory import call_factory, is_factory_path, load_factory
from autoplan.zoo.gpt import GPT, GPTConfig
from autoplan.zoo.hf import read_hf_model
from autoplan.zoo.llama import Llama, LlamaConfig
from autoplan.zoo.moe import MoEConfig, MoELlama, active_parameter_count
from autoplan.zoo.opt import OPT, OPTConfig
from autoplan.zoo.presets import PRESET_CONFIGS, PresetConfig

__all__ = ["LossKind", "ModelSpec", "get_model_spec", "model_names"]

LossKind = Literal["cross_entropy", "sum"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and feed it.

    Zoo models are :class:`~autoplan.zoo.layered.LayeredModel` language models taking token ids;
    a factory's module may be any ``nn.Module`` and brings its own example input.
    """

    name: str
    build: Callable[[], nn.Module] = field(repr=False)
    vocab_size: int | None
    max_seq_len: int | None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    num_blocks: int | None = None
    ffn_hidden_size: int | None = None
    family: str = "factory"
    loss: LossKind = "cross_entropy"
    """The loss the last layer's output feeds: token cross-entropy for the zoo, a plain sum
    (gradient of ones) for factories, whose loss autoplan does not know."""

    def example_input(self, batch: int, seq_len: int, device: str = "cpu") -> Any:
        """Token ids of shape (batch, seq_len); for a factory, the input it returns."""
        if self.vocab_size is None:
            return self.build_with_input(batch, seq_len)[1]
        return torch.randint(0, self.vocab_size, (batch, seq_len), device=device)

    def build_with_input(self, batch: int, seq_len: int) -> tuple[nn.Module, Any]:
        """The module and an input of ``batch`` samples of ``seq_len`` tokens."""
        if is_factory_path(self.name):
            return call_factory(self.name, batch, seq_len)
        return self.build(), self.example_input(batch, seq_len)

    @property
    def tensor_parallel_divisor(self) -> int | None:
        """What the tp degree must divide: gcd of heads, kv heads and the MLP size (or None)."""
        sizes = [self.num_attention_heads, self.num_kv_heads, self.ffn_hidden_size]
        known = [size for size in sizes if size is not None]
        return math.gcd(*known) if self.num_attention_heads is not None else None

    def parameter_count(self) -> int:
        """Parameters of the model, counted on the meta device (nothing is allocated)."""
        if is_hf_name(self.name):
            # Not cached by name: the file behind a name may change; this spec's config is fixed.
            return _count_parameters(self.build)
        return _parameter_count(self.name)

    def active_parameter_count(self) -> int:
        """Parameters one token passes through (mixture-of-experts: k routed experts of E in
        each MoE block); the whole count for a dense model. Counted on the meta device."""
        with torch.device("meta"):
            return active_parameter_count(self.build())


def _preset_spec(name: str, config: PresetConfig) -> ModelSpec:
    builders: dict[type, tuple[str, Callable[[Any], nn.Module]]] = {
        GPTConfig: ("gpt", GPT),
        LlamaConfig: ("llama", Llama),
        BertConfig: ("bert", Bert),
        OPTConfig: ("opt", OPT),
        MoEConfig: ("moe", MoELlama),
    }
    family, model_class = builders[type(config)]
    if isinstance(config, MoEConfig):
        kv_heads, ffn = config.num_kv_heads, config.tensor_parallel_ffn
    elif isinstance(config, LlamaConfig):
        kv_heads, ffn = config.num_kv_heads, config.ffn_hidden_size
    elif isinstance(config, OPTConfig):
        kv_heads, ffn = config.num_heads, config.ffn_hidden_size
    else:
        kv_heads, ffn = config.num_heads, config.ffn
    return ModelSpec(
        name=name,
        build=functools.partial(model_class, config),
        vocab_size=config.vocab_size,
        max_seq_len=config.max_seq_len,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_heads,
        num_kv_heads=kv_heads,
        num_blocks=config.num_layers,
        ffn_hidden_size=ffn,
        family=family,
    )


_PRESETS: dict[str, ModelSpec] = {
    name: _preset_spec(name, config) for name, config in PRESET_CONFIGS.items()
}


def _factory_spec(path: str) -> ModelSpec:
    load_factory(path)  # fail now, with a one-line error, if it does not import

    def build() -> nn.Module:
        return call_factory(path, 1, 1)[0]

    return ModelSpec(name=path, build=build, vocab_size=None, max_seq_len=None, loss="sum")


def _hf_spec(name: str) -> ModelSpec:
    """The spec of a Hugging Face config: the zoo model its family maps to, named by the
    config file's absolute path (so a profile's name rebuilds it anywhere on the machine)."""
    model = read_hf_model(name)
    return dataclasses.replace(_preset_spec(model.name, model.config), family=model.model_type)


def _count_parameters(build: Callable[[], nn.Module]) -> int:
    with torch.device("meta"):
        model = build()
    return sum(parameter.numel() for parameter in model.parameters())


@functools.cache
def _parameter_count(name: str) -> int:
    return _count_parameters(get_model_spec(name).build)


def model_names() -> list[str]:
    """All zoo names, in the zoo's order (families together, small to large)."""
    return list(_PRESETS)


def get_model_spec(name: str) -> ModelSpec:
    """The spec of a zoo name, a Hugging Face config 'hf:PATH' (a config.json or the folder
    holding one) or a factory path 'package.module:callable'.

    Unknown names raise InputError with the nearest names offered.
    """
    if name in _PRESETS:
        return _PRESETS[name]
    if is_hf_name(name):
        return _hf_spec(name)
    if is_factory_path(name):
        return _factory_spec(name)
    close = difflib.get_close_matches(name, model_names(), n=3, cutoff=0.5)
    known = ", ".join(model_names())
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {known}"
    raise InputError(f"unknown model '{name}'{hint}")
