"""Hugging Face ``config.json`` files as zoo models: ``hf:PATH/config.json`` or ``hf:DIR``.

The config is read as data (no ``transformers``, no code from the model's repository) and
mapped onto the zoo's own modules, so that parameter counts equal the published ones and the
profiler and runtime treat the model as any zoo model:

- ``llama`` (Llama 2, 3, 3.1, 3.2), ``mistral``, ``qwen2`` (Qwen2, Qwen2.5), ``qwen3`` (its
  per-head query and key RMSNorms), ``phi3``, ``gemma`` and ``gemma2`` →
  :class:`~autoplan.zoo.llama.LlamaConfig`;
- ``gpt2`` and ``gpt_neox`` (GPT-NeoX-20B, Pythia) → :class:`~autoplan.zoo.gpt.GPTConfig`;
- ``opt`` → :class:`~autoplan.zoo.opt.OPTConfig`.

Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` become separate projections with the same
parameters (tensor parallelism must split q, k and v apart). ``rope_scaling`` of type 'linear'
or 'llama3' changes the RoPE frequencies as Hugging Face does; 'dynamic', 'yarn' and
'longrope' change the angles (and scale them) at long contexts only, which costs nothing more:
they run as plain RoPE.

Mixture-of-experts decoders → :class:`~autoplan.zoo.moe.MoEConfig`: ``mixtral`` (8 experts of
``intermediate_size``, top-k renormalised), ``qwen2_moe`` (``moe_intermediate_size`` experts,
a gated shared expert, dense MLPs in ``mlp_only_layers`` and off the ``decoder_sparse_step``),
``qwen3_moe`` (the same placement of experts, Qwen3's attention, no shared expert) and
DeepSeekMoE's ``deepseek`` (``n_routed_experts`` fine-grained experts, ``n_shared_experts``
fused into one shared MLP, dense blocks before ``first_k_dense_replace`` and off the
``moe_layer_freq``). The configs do not state a capacity factor: the zoo's default applies.
Other mixture-of-experts families (DeepSeek-V2/V3's latent attention, DBRX, …) are refused.

The model's name is ``hf:`` and the config file's absolute path: the runtime rebuilds the model
from it on every rank (the file must be at that path on every node), and refuses to run a plan
whose config no longer builds the parameter count the plan was made for.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from autoplan import limits
from autoplan.errors import InputError
from autoplan.files import read_json_data
from autoplan.names import HF_MODEL_PREFIX, is_hf_name, printable, shown
from autoplan.zoo.gpt import GPTConfig, MLPActivation
from autoplan.zoo.llama import GatedActivation, LlamaConfig
from autoplan.zoo.moe import MoEConfig
from autoplan.zoo.opt import OPTConfig
from autoplan.zoo.rope import RopeScaling

__all__ = ["SUPPORTED_MODEL_TYPES", "HFModel", "config_file", "read_hf_model"]

HFConfig = GPTConfig | LlamaConfig | OPTConfig | MoEConfig

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2")
# Mixture-of-experts families read, each with the dense family its attention is read as.
_MOE_FAMILY = {
    "mixtral": "mistral",
    "qwen2_moe": "qwen2",
    "qwen3_moe": "qwen3",
    "deepseek": "llama",
}
# Families whose decoder layers place experts as Qwen2-MoE's does (decoder_sparse_step,
# mlp_only_layers) and whose configs name the expert width moe_intermediate_size.
_QWEN_MOE = ("qwen2_moe", "qwen3_moe")
# Families whose attention windows are switched on by use_sliding_window (off by default) and
# cover the blocks from max_window_layers on.
_QWEN_WINDOWS = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
SUPPORTED_MODEL_TYPES = (*_LLAMA_FAMILY, *_MOE_FAMILY, "gpt2", "gpt_neox", "opt")

# model_type of mixture-of-experts families, and the keys that count experts in any config.
_EXPERT_MODEL_TYPES = frozenset(
    {
        "mixtral",
        "qwen2_moe",
        "deepseek_v2",
        "deepseek_v3",
        "dbrx",
        "phimoe",
        "olmoe",
        "jamba",
        "granitemoe",
        "switch_transformers",
    }
)
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

# Hugging Face activation names → the zoo's (ACT2FN: gelu_new, gelu_fast and
# gelu_pytorch_tanh are all GELU's tanh approximation).
_ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}

# rope_scaling types whose angles differ only beyond the pre-training context (run as plain
# RoPE, module docstring); 'su' is Phi-3's early name of 'longrope'.
_PLAIN_ROPE_SCALINGS = frozenset({"default", "dynamic", "yarn", "longrope", "su"})

_MISSING = object()


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face config read into the zoo: its canonical name and the zoo config."""

    name: str
    """'hf:' and the config file's absolute path."""
    model_type: str
    config: HFConfig


def config_file(name: str) -> Path:
    """The config file an 'hf:PATH' name means: PATH itself, or PATH/config.json where PATH is
    a folder; '~' expands, a relative path is taken from the current directory."""
    if not is_hf_name(name):
        raise InputError(f"{shown(name)} is not an 'hf:PATH' model name")
    raw = name[len(HF_MODEL_PREFIX) :]
    if not raw:
        raise InputError("'hf:' needs a path: hf:PATH/config.json or hf:FOLDER")
    if not raw.isprintable() or len(raw) > limits.MAX_MODEL_PATH_LENGTH:
        raise InputError(f"{shown(name)}: not a usable path")
    path = Path(os.path.abspath(os.path.expanduser(raw)))
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise InputError(f"{printable(str(path.parent))}: no config.json in the folder")
    return path


class _Fields:
    """Typed reads of a config's keys, each failure one line naming the file and the key."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def fail(self, message: str) -> InputError:
        return InputError(f"{self.where}: {message}")

    def _get(self, key: str, default: Any) -> Any:
        # null reads as the default, as Hugging Face's config classes read it
        # (num_key_value_heads: null means as many as the attention heads).
        value = self.data.get(key)
        if value is None:
            value = default
        if value is _MISSING:
            raise self.fail(f"no {key!r}: the config must state it")
        return value

    def whole(
        self, key: str, default: Any = _MISSING, *, high: int = limits.MAX_MODEL_WIDTH
    ) -> int:
        """A whole number in [1, high] (null reads as the default)."""
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise self.fail(f"{key} must be a whole number from 1 to {high:,}, got {shown(value)}")
        return value

    def optional_whole(self, key: str) -> int | None:
        """A whole number, or None where the key is absent or null."""
        return None if self.data.get(key) is None else self.whole(key)

    def number(self, key: str, default: Any = _MISSING) -> float:
        """A positive number."""
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(f"{key} must be a positive number, got {shown(value)}")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        """A positive number, or None where the key is absent or null."""
        return None if self.data.get(key) is None else self.number(key)

    def flag(self, key: str, default: Any = _MISSING) -> bool:
        """true or false (null reads as the default)."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{key} must be true or false, got {shown(value)}")
        return value

    def text(self, key: str, default: Any = _MISSING) -> str:
        """A string (null reads as the default)."""
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{key} must be text, got {shown(value)}")
        return value

    def activation(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """The zoo's name of the activation ``key`` names, one of ``allowed``."""
        name = self.text(key, default)
        zoo = _ACTIVATIONS.get(name)
        if zoo not in allowed:
            known = sorted(k for k, v in _ACTIVATIONS.items() if v in allowed)
            raise self.fail(f"{key} {shown(name)} is not supported here (known: {known})")
        return zoo

    def require(self, key: str, expected: object, default: object) -> None:
        """Refuse a config whose ``key`` is not ``expected`` (an option the zoo lacks)."""
        value = self.data.get(key, default)
        if value is None:
            value = default
        if value != expected:
            raise self.fail(f"{key} {shown(value)} is not supported (only {expected!r})")


def _check_experts_known(fields: _Fields, model_type: str) -> None:
    """Refuse a mixture-of-experts config of a family autoplan does not read (its experts
    would otherwise be silently built as one dense MLP)."""
    if model_type in _MOE_FAMILY:
        return
    experts = [
        (key, fields.data[key])
        for key in _EXPERT_KEYS
        if isinstance(fields.data.get(key), int) and not isinstance(fields.data[key], bool)
    ]
    experts = [(key, count) for key, count in experts if count > 1]
    if model_type in _EXPERT_MODEL_TYPES or experts:
        count = f" ({experts[0][1]} experts)" if experts else ""
        raise fields.fail(
            f"{model_type} is a mixture-of-experts model{count} of a family autoplan does not "
            f"read (mixture-of-experts families: {', '.join(sorted(_MOE_FAMILY))})"
        )


def _rope_scaling(fields: _Fields) -> RopeScaling | None:
    """The frequency scaling of ``rope_scaling`` (None: plain RoPE, see module docstring)."""
    raw = fields.data.get("rope_scaling")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fields.fail(f"rope_scaling must be an object or null, got {shown(raw)}")
    scaling = _Fields(raw, f"{fields.where}: rope_scaling")
    kind = raw.get("rope_type", raw.get("type"))
    if kind in _PLAIN_ROPE_SCALINGS:
        return None
    try:
        if kind == "linear":
            return RopeScaling("linear", scaling.number("factor"))
        if kind == "llama3":
            return RopeScaling(
                "llama3",
                scaling.number("factor"),
                low_freq_factor=scaling.number("low_freq_factor", 1.0),
                high_freq_factor=scaling.number("high_freq_factor", 4.0),
                original_max_position=scaling.whole(
                    "original_max_position_embeddings", high=limits.MAX_SEQ_LEN
                ),
            )
    except ValueError as error:
        raise fields.fail(f"rope_scaling: {error}") from None
    known = sorted(_PLAIN_ROPE_SCALINGS | {"linear", "llama3"})
    raise fields.fail(f"rope_scaling type {shown(kind)} is not one autoplan knows ({known})")


def _layer_types(fields: _Fields, num_layers: int) -> tuple[int, ...] | None:
    """The blocks that ``layer_types`` (newer configs) marks 'sliding_attention', or None when
    the config has no such list."""
    raw = fields.data.get("layer_types")
    if raw is None:
        return None
    allowed = {"full_attention", "sliding_attention"}
    if not isinstance(raw, list) or len(raw) != num_layers or not set(raw) <= allowed:
        raise fields.fail(
            f"layer_types must list {num_layers} of {sorted(allowed)}, got {shown(raw, 60)}"
        )
    return tuple(index for index, kind in enumerate(raw) if kind == "sliding_attention")


def _sliding_window(
    fields: _Fields, model_type: str, num_layers: int
) -> tuple[int | None, tuple[int, ...] | None]:
    """(window, the blocks it applies to or None for every block) as Hugging Face's attention
    of ``model_type`` applies ``sliding_window``."""
    if model_type in ("llama", "gemma", "deepseek"):
        return None, None
    if model_type in _QWEN_WINDOWS and not fields.flag("use_sliding_window", False):
        return None, None
    # Hugging Face's defaults where a config leaves the key out (Phi-3's and Mixtral's: none).
    default = None if model_type in ("phi3", "mixtral") else 4096
    window = fields.data.get("sliding_window", default)
    if window is None:
        return None, None
    window = fields.whole("sliding_window", default, high=limits.MAX_SEQ_LEN)
    listed = _layer_types(fields, num_layers)
    if listed is not None:
        return window, listed
    if model_type == "gemma2":  # even blocks local, odd ones global
        return window, tuple(range(0, num_layers, 2))
    if model_type in _QWEN_WINDOWS:  # the first max_window_layers attend to all
        first = fields.whole("max_window_layers", 28, high=limits.MAX_LAYERS)
        return window, tuple(range(first, num_layers))
    return window, None


def _llama_family(fields: _Fields, model_type: str) -> LlamaConfig:
    gemma = model_type in ("gemma", "gemma2")
    num_layers = fields.whole("num_hidden_layers", high=limits.MAX_LAYERS - 2)
    hidden = fields.whole("hidden_size")
    heads = fields.whole("num_attention_heads")
    kv_heads = fields.whole("num_key_value_heads", heads)
    if gemma:
        # Hugging Face's Gemma reads hidden_activation and ignores hidden_act (an early
        # config said "gelu" where the model runs the tanh approximation).
        activation = fields.activation("hidden_activation", "gelu_pytorch_tanh", ("gelu_tanh",))
    else:
        activation = fields.activation("hidden_act", "silu", ("silu", "gelu_tanh", "gelu"))
    attention_bias = fields.flag("attention_bias", False)
    window, window_layers = _sliding_window(fields, model_type, num_layers)
    scalar = fields.optional_number("query_pre_attn_scalar") if model_type == "gemma2" else None
    softcap = fields.optional_number("final_logit_softcapping") if model_type == "gemma2" else None
    try:
        return LlamaConfig(
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            ffn_hidden_size=fields.whole("intermediate_size"),
            vocab_size=fields.whole("vocab_size"),
            max_seq_len=fields.whole("max_position_embeddings", high=limits.MAX_SEQ_LEN),
            rope_theta=fields.number("rope_theta", 10000.0),
            norm_eps=fields.number("rms_norm_eps", 1e-5 if model_type == "phi3" else 1e-6),
            attention_head_dim=fields.optional_whole("head_dim") or (256 if gemma else None),
            qkv_bias=attention_bias or model_type in ("qwen2", "qwen2_moe"),
            out_bias=attention_bias,
            mlp_bias=fields.flag("mlp_bias", False),
            tie_embeddings=fields.flag("tie_word_embeddings", gemma),
            activation=cast(GatedActivation, activation),
            rope_scaling=_rope_scaling(fields),
            rotary_fraction=fields.number("partial_rotary_factor", 1.0),
            sliding_window=window,
            sliding_window_layers=window_layers,
            attention_scale=None if scalar is None else scalar**-0.5,
            embedding_multiplier=math.sqrt(hidden) if gemma else None,
            offset_norms=gemma,
            sandwich_norms=model_type == "gemma2",
            final_logit_softcap=softcap,
            qk_norm=model_type == "qwen3",
        )
    except ValueError as error:  # the shapes do not fit together (heads, kv heads, …)
        raise fields.fail(str(error)) from None


def _dense_blocks(fields: _Fields, model_type: str, num_layers: int) -> tuple[int, ...]:
    """Blocks whose MLP is dense, as Hugging Face's decoder layer of ``model_type`` decides."""
    if model_type == "mixtral":
        return ()
    if model_type in _QWEN_MOE:
        step = fields.whole("decoder_sparse_step", 1, high=limits.MAX_LAYERS)
        listed = fields.data.get("mlp_only_layers") or []
        if not isinstance(listed, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in listed
        ):
            raise fields.fail(f"mlp_only_layers must list block indices, got {shown(listed, 60)}")
        return tuple(i for i in range(num_layers) if i in listed or (i + 1) % step)
    # DeepSeekMoE's default is 0 (no dense block first), which `whole` (1 or more) refuses.
    first = (
        0
        if fields.data.get("first_k_dense_replace") in (None, 0)
        else fields.whole("first_k_dense_replace", high=limits.MAX_LAYERS)
    )
    every = fields.whole("moe_layer_freq", 1, high=limits.MAX_LAYERS)
    return tuple(i for i in range(num_layers) if i < first or i % every)


def _moe_family(fields: _Fields, model_type: str) -> MoEConfig:
    """A mixture-of-experts config: its attention read as its dense family's, then experts."""
    base = _llama_family(fields, _MOE_FAMILY[model_type])
    if model_type == "mixtral":
        # Mixtral's sliding window default is none, unlike Mistral's (read again here).
        window, layers = _sliding_window(fields, model_type, base.num_layers)
        experts = fields.whole("num_local_experts")
        expert_ffn: int | None = None  # experts of intermediate_size
        shared_ffn: int | None = None
        gate = False
        normalize = True
    elif model_type in _QWEN_MOE:
        window, layers = base.sliding_window, base.sliding_window_layers
        experts = fields.whole("num_experts")
        expert_ffn = fields.whole("moe_intermediate_size")
        # Qwen3-MoE has no shared expert (its config has no such width).
        shared_ffn = None
        if model_type == "qwen2_moe":
            shared_ffn = fields.optional_whole("shared_expert_intermediate_size")
        gate = shared_ffn is not None
        normalize = fields.flag("norm_topk_prob", False)
    else:
        window, layers = base.sliding_window, base.sliding_window_layers
        fields.require("scoring_func", "softmax", "softmax")
        experts = fields.whole("n_routed_experts")
        expert_ffn = fields.whole("moe_intermediate_size")
        shared = fields.data.get("n_shared_experts")
        shared_ffn = None if not shared else fields.whole("n_shared_experts") * expert_ffn
        gate = False
        normalize = fields.flag("norm_topk_prob", False)
    shape = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    shape.update(sliding_window=window, sliding_window_layers=layers)
    try:
        return MoEConfig(
            **shape,
            num_experts=experts,
            top_k=fields.whole("num_experts_per_tok"),
            expert_ffn_hidden_size=expert_ffn,
            shared_ffn_hidden_size=shared_ffn,
            shared_expert_gate=gate,
            normalize_top_k=normalize,
            dense_layers=_dense_blocks(fields, model_type, base.num_layers),
        )
    except ValueError as error:  # top_k above the experts
        raise fields.fail(str(error)) from None


def _gpt2(fields: _Fields) -> GPTConfig:
    hidden = fields.whole("n_embd")
    positions = fields.whole(
        "n_positions", fields.data.get("n_ctx", _MISSING), high=limits.MAX_SEQ_LEN
    )
    # scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn change numerics, not costs.
    try:
        return GPTConfig(
            num_layers=fields.whole("n_layer", high=limits.MAX_LAYERS - 2),
            hidden_size=hidden,
            num_heads=fields.whole("n_head"),
            vocab_size=fields.whole("vocab_size"),
            max_seq_len=positions,
            ffn_hidden_size=fields.optional_whole("n_inner"),
            tie_embeddings=fields.flag("tie_word_embeddings", True),
            attention_scale=None if fields.flag("scale_attn_weights", True) else 1.0,
            activation=cast(
                MLPActivation,
                fields.activation("activation_function", "gelu_new", ("gelu_tanh", "gelu", "relu")),
            ),
            norm_eps=fields.number("layer_norm_epsilon", 1e-5),
        )
    except ValueError as error:
        raise fields.fail(str(error)) from None


def _gpt_neox(fields: _Fields) -> GPTConfig:
    # The zoo's attention has an output bias always, as every published NeoX model does.
    fields.require("attention_bias", True, True)
    rotary = fields.data.get("rotary_pct", fields.data.get("partial_rotary_factor", 0.25))
    if isinstance(rotary, bool) or not isinstance(rotary, int | float) or not 0 < rotary <= 1:
        raise fields.fail(f"rotary_pct must be a number in (0, 1], got {shown(rotary)}")
    theta = fields.data.get("rotary_emb_base", fields.data.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
        raise fields.fail(f"rotary_emb_base must be a positive number, got {shown(theta)}")
    _rope_scaling(fields)  # checked; its angles are not modelled for GPT-NeoX (docstring)
    try:
        return GPTConfig(
            num_layers=fields.whole("num_hidden_layers", high=limits.MAX_LAYERS - 2),
            hidden_size=fields.whole("hidden_size"),
            num_heads=fields.whole("num_attention_heads"),
            vocab_size=fields.whole("vocab_size"),
            max_seq_len=fields.whole("max_position_embeddings", high=limits.MAX_SEQ_LEN),
            ffn_hidden_size=fields.whole("intermediate_size"),
            tie_embeddings=fields.flag("tie_word_embeddings", False),
            activation=cast(
                MLPActivation, fields.activation("hidden_act", "gelu", ("gelu_tanh", "gelu"))
            ),
            norm_eps=fields.number("layer_norm_eps", 1e-5),
            rotary_fraction=float(rotary),
            rope_theta=float(theta),
            parallel_residual=fields.flag("use_parallel_residual", True),
        )
    except ValueError as error:
        raise fields.fail(str(error)) from None


def _opt(fields: _Fields) -> OPTConfig:
    hidden = fields.whole("hidden_size")
    # The zoo's OPT is what every published OPT is: ReLU, biases, affine LayerNorms, tied head.
    fields.require("activation_function", "relu", "relu")
    fields.require("enable_bias", True, True)
    fields.require("layer_norm_elementwise_affine", True, True)
    fields.require("tie_word_embeddings", True, True)
    pre_norm = fields.flag("do_layer_norm_before", True)
    try:
        return OPTConfig(
            num_layers=fields.whole("num_hidden_layers", high=limits.MAX_LAYERS - 2),
            hidden_size=hidden,
            num_heads=fields.whole("num_attention_heads"),
            ffn_hidden_size=fields.whole("ffn_dim"),
            vocab_size=fields.whole("vocab_size"),
            max_seq_len=fields.whole("max_position_embeddings", high=limits.MAX_SEQ_LEN),
            word_embed_size=fields.whole("word_embed_proj_dim", hidden),
            pre_norm=pre_norm,
            final_norm=pre_norm and not fields.flag("_remove_final_layer_norm", False),
        )
    except ValueError as error:
        raise fields.fail(str(error)) from None


def read_hf_model(name: str) -> HFModel:
    """Read the config an 'hf:PATH' name means into a zoo config.

    Raises InputError (one line naming the file) for a missing or malformed file, an unknown or
    mixture-of-experts ``model_type``, or values that do not make a model.
    """
    path = config_file(name)
    where = printable(str(path))
    data = read_json_data(path)
    if not isinstance(data, dict):
        raise InputError(f"{where}: not a model config (the top level is not a JSON object)")
    fields = _Fields(data, where)
    model_type = data.get("model_type")
    if model_type is None:
        raise fields.fail("no 'model_type': not a Hugging Face model config")
    if not isinstance(model_type, str):
        raise fields.fail(f"model_type must be text, got {shown(model_type)}")
    _check_experts_known(fields, model_type)
    if model_type in _LLAMA_FAMILY:
        config: HFConfig = _llama_family(fields, model_type)
    elif model_type in _MOE_FAMILY:
        config = _moe_family(fields, model_type)
    elif model_type == "gpt2":
        config = _gpt2(fields)
    elif model_type == "gpt_neox":
        config = _gpt_neox(fields)
    elif model_type == "opt":
        config = _opt(fields)
    else:
        raise fields.fail(
            f"model_type {shown(model_type)} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    return HFModel(name=HF_MODEL_PREFIX + str(path), model_type=model_type, config=config)
