"""The profile: what ``autoplan profile`` writes and ``autoplan solve`` reads.

Every figure is for one micro-batch of ``micro_batch_size`` samples of ``seq_len`` tokens in
``dtype`` on a single device (no parallelism). The cost model scales per-sample figures to the
micro-batch size it considers and divides what tensor parallelism shards by the tp degree.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

from autoplan import limits

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "DType",
    "ExpertProfile",
    "Granularity",
    "LayerKind",
    "LayerProfile",
    "MeasuredTimes",
    "ModelRef",
    "Profile",
    "ProfileTotals",
    "TensorParallelProfile",
]

PROFILE_SCHEMA_VERSION: Final = 1

LayerKind = Literal["embedding", "block", "head", "other"]
# tf32: fp32 storage (4-byte weights, activations and gradients) with matmuls on TF32 tensor
# cores (torch.backends.cuda.matmul.allow_tf32), costed at the TF32 peak where a GPU has one.
DType = Literal["fp32", "tf32", "fp16", "bf16", "fp64"]
DTYPE_ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp64": 8}
"""Bytes per element of each training dtype (tf32 is fp32 storage with tf32 matmuls)."""
# The unit of partition: a whole block, or each block's residual parts (attention, MLP) apart.
Granularity = Literal["block", "sub-block"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    """Which model: enough for the runtime to build exactly the model that was profiled."""

    name: str = Field(
        description="A zoo name (see `autoplan models`), a Hugging Face config 'hf:' and the "
        "config file's absolute path, or a factory path 'package.module:callable'."
    )
    parameter_count: NonNegativeInt = Field(description="Total parameters of the whole model.")
    active_parameter_count: NonNegativeInt | None = Field(
        default=None,
        description="Of a mixture-of-experts model: the parameters one token passes through "
        "(k of the E routed experts of each MoE layer, everything else). None for a dense model.",
    )
    num_layers: int = Field(
        ge=1, le=limits.MAX_LAYERS, description="Number of entries in `layers` (pipeline units)."
    )
    hidden_size: int | None = Field(default=None, ge=1, description="Hidden size, if known.")
    num_attention_heads: int | None = Field(default=None, ge=1, description="Attention heads.")
    vocab_size: int | None = Field(default=None, ge=1, description="Vocabulary size, if known.")
    granularity: Granularity = Field(
        default="block",
        description="Unit of partition the `layers` are: 'block' (a whole transformer block) or "
        "'sub-block' (each block's attention and MLP parts, with their norms and residual "
        "adds, as two units; the residual stream crosses between them). The runtime builds "
        "stages of these units. Profiles and plans written before the field are 'block'.",
    )
    unit_names: list[str] | None = Field(
        default=None,
        max_length=limits.MAX_LAYERS,
        description="At sub-block grain: each unit's name in order (the `layers` names, e.g. "
        "'layers.block_3:attn'), so that a plan, which carries this record, can name the units "
        "of its stages. None at block grain.",
    )

    layer_modules: list[str] | None = Field(
        default=None,
        max_length=limits.MAX_LAYERS,
        description="For a model that is neither a zoo LayeredModel nor an nn.Sequential (a "
        "decoder written like Hugging Face's or torchtitan's): each layer's module path in the "
        "model, in call order (e.g. 'model.embed_tokens', 'model.layers.0', ..., 'lm_head'), "
        "as `profile` found them (autoplan.zoo.decoder); the runtime builds stages of these "
        "modules. None for the zoo, an nn.Sequential, or a model profiled as one layer.",
    )

    @model_validator(mode="after")
    def _check_unit_names(self) -> ModelRef:
        if self.unit_names is not None and len(self.unit_names) != self.num_layers:
            raise ValueError(
                f"unit_names lists {len(self.unit_names)} units; num_layers is {self.num_layers}"
            )
        if self.layer_modules is not None and len(self.layer_modules) != self.num_layers:
            raise ValueError(
                f"layer_modules lists {len(self.layer_modules)} modules; num_layers is "
                f"{self.num_layers}"
            )
        if self.layer_modules is not None and self.granularity != "block":
            raise ValueError(
                f"layer_modules name whole modules; granularity is {self.granularity!r}, "
                "not 'block'"
            )
        return self


class TensorParallelProfile(_Strict):
    """What Megatron-style tensor parallelism of degree t does to this layer.

    Sharded parameters and sharded saved activations divide by t; each all-reduce moves
    ``allreduce_payload_bytes`` (a ring all-reduce sends 2(t-1)/t of it per GPU).
    """

    sharded_param_count: NonNegativeInt = Field(description="Parameters split across the tp group.")
    sharded_saved_activation_bytes: NonNegativeInt = Field(
        description="Part of `saved_activation_bytes` that splits across the tp group."
    )
    allreduce_payload_bytes: NonNegativeInt = Field(description="Bytes of one tp all-reduce.")
    forward_allreduce_count: NonNegativeInt = Field(description="All-reduces in the forward pass.")
    backward_allreduce_count: NonNegativeInt = Field(
        description="All-reduces in the backward pass."
    )
    degree_must_divide: int = Field(
        ge=1,
        description="The tp degree must divide this (gcd of heads, kv heads, ffn size, vocab).",
    )
    sharded_forward_flops: NonNegativeInt | None = Field(
        default=None, description="Part of `forward_flops` that splits across the tp group."
    )
    sharded_backward_flops: NonNegativeInt | None = Field(
        default=None, description="Part of `backward_flops` that splits across the tp group."
    )
    sharded_forward_bytes_moved: NonNegativeInt | None = Field(
        default=None, description="Part of `forward_bytes_moved` that splits across tp."
    )
    sharded_backward_bytes_moved: NonNegativeInt | None = Field(
        default=None, description="Part of `backward_bytes_moved` that splits across tp."
    )
    sharded_forward_memory_bound_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `forward_memory_bound_bytes` that splits across the tp group.",
    )
    sharded_backward_memory_bound_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `backward_memory_bound_bytes` that splits across the tp group.",
    )
    sharded_forward_matmul_fixed_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `forward_matmul_fixed_bytes` that splits across the tp group.",
    )
    sharded_backward_matmul_fixed_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `backward_matmul_fixed_bytes` that splits across the tp group.",
    )


class ExpertProfile(_Strict):
    """The routed experts of a mixture-of-experts layer (``autoplan.profile.experts``).

    Their FLOPs are inside the layer's own at capacity: every expert runs ``capacity_tokens``
    slots whatever the routing, the imbalance the capacity factor allows paid as padding.
    """

    num_experts: int = Field(ge=1, description="Routed experts of the layer (E).")
    top_k: int = Field(ge=1, description="Experts each token is routed to (k).")
    capacity_factor: float = Field(
        gt=0, description="Slots per expert as a multiple of the even share tokens·k/E."
    )
    capacity_tokens: int = Field(
        ge=1,
        description="Slots of one expert per micro-batch: ceil(capacity_factor · tokens · k / "
        "E); picks past it are dropped.",
    )
    expert_param_count: NonNegativeInt = Field(
        description="Parameters of all routed experts (what expert parallelism splits)."
    )
    expert_forward_flops: NonNegativeInt = Field(
        description="Forward FLOPs of one expert on its capacity_tokens slots."
    )
    expert_backward_flops: NonNegativeInt = Field(
        description="Backward FLOPs of one expert on its capacity_tokens slots."
    )
    dispatch_bytes: NonNegativeInt = Field(
        description="Bytes of the slot buffer (experts × capacity × hidden): what one "
        "all-to-all of the micro-batch carries from each GPU (four per pass pair: dispatch "
        "and combine, forward and backward).",
    )


class MeasuredTimes(_Strict):
    """Times measured by running the real layer on one GPU of a tensor-parallel group.

    Written by ``autoplan profile --measure`` (this machine's device, tp 1) or attached by
    ``autoplan profile import`` (a table measured elsewhere). One entry per (device,
    tensor-parallel degree, micro-batch size); the cost model uses it for that GPU type and
    tp, interpolating between measured micro-batch sizes (``autoplan.cost.measured``).
    """

    device_name: str = Field(
        description="The device: torch's name (e.g. 'NVIDIA H200') or a catalog GPU type "
        "(e.g. 'A100-80GB'); matched to GPU types by autoplan.cost.layers.matches_device."
    )
    forward_ms: float = Field(ge=0, description="Median forward time of one micro-batch.")
    backward_ms: float = Field(ge=0, description="Median backward time of one micro-batch.")
    repeats: int = Field(default=1, ge=1, le=10**6, description="Timed repetitions after warm-up.")
    tensor_parallel_degree: int = Field(
        default=1, ge=1, description="tp of the group the times were measured on (per GPU)."
    )
    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Samples per micro-batch measured; None: the profile's micro_batch_size "
        "(entries written before the field).",
    )
    memory_bytes: NonNegativeInt | None = Field(
        default=None, description="Peak memory of the layer's pass, where measured."
    )
    source: str = Field(
        default="", description="Where the times come from, e.g. 'profile --measure' or a file."
    )


class LayerProfile(_Strict):
    """One pipeline unit: the embedding, one block, or the final norm and head."""

    index: NonNegativeInt = Field(description="Position in the model's layer sequence.")
    name: str = Field(description="Module path in the model, e.g. 'blocks.3'.")
    kind: LayerKind = Field(description="What the layer is.")
    forward_flops: NonNegativeInt = Field(description="FLOPs of the forward pass (2 per MAC).")
    backward_flops: NonNegativeInt = Field(description="FLOPs of the backward pass.")
    forward_bytes_moved: NonNegativeInt = Field(
        description="Bytes read and written by forward ops (roofline memory term)."
    )
    backward_bytes_moved: NonNegativeInt = Field(
        description="Bytes read and written by backward ops."
    )
    forward_memory_bound_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `forward_bytes_moved` moved by ops that are not matmul-class "
        "(elementwise, norms, softmax, loss, copies, lookups): timed by memory bandwidth, on "
        "top of the matmuls' time. None in profiles made before it was recorded.",
    )
    backward_memory_bound_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of `backward_bytes_moved` moved by ops that are not matmul-class.",
    )
    forward_matmul_fixed_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of the matmul-class bytes of forward that does not grow with the "
        "batch (weights read). None in profiles made before it was recorded.",
    )
    backward_matmul_fixed_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Part of the matmul-class bytes of backward that does not grow with the "
        "batch (weights read, weight gradients written).",
    )
    forward_kernels: NonNegativeInt | None = Field(
        default=None, description="Kernels the forward launches (ops that move bytes)."
    )
    backward_kernels: NonNegativeInt | None = Field(
        default=None, description="Kernels the backward launches."
    )
    param_count: NonNegativeInt = Field(description="Parameters owned by this layer.")
    param_bytes: NonNegativeInt = Field(description="Bytes of those parameters in `dtype`.")
    saved_activation_bytes: NonNegativeInt = Field(
        description="Bytes kept for backward with no recompute."
    )
    selective_recompute_saved_bytes: NonNegativeInt = Field(
        description="Bytes kept for backward when the attention core is recomputed "
        "(Korthikanti et al.'s selective recompute); equals `saved_activation_bytes` if none.",
    )
    selective_recompute_flops: NonNegativeInt = Field(
        description="Forward FLOPs redone in backward under selective recompute."
    )
    input_activation_bytes: NonNegativeInt = Field(
        description="Bytes of the layer's input: all that full recompute keeps."
    )
    loss_saved_activation_bytes: NonNegativeInt = Field(
        default=0,
        description="Of `saved_activation_bytes`, what the loss the last layer feeds keeps "
        "(the token cross-entropy's log-softmax): saved outside the layer's own forward, so "
        "activation offload's hooks on the layer leave it on the device.",
    )
    output_activation_bytes: NonNegativeInt = Field(
        description="Bytes of the layer's output: what a pipeline stage ending here sends."
    )
    attention_kv_bytes: NonNegativeInt | None = Field(
        default=None,
        description="Bytes of the keys and values the layer's attention core "
        "(scaled_dot_product_attention) receives: what ring attention passes around a "
        "context-parallel group. None for profiles made before it was recorded (the cost "
        "model then takes 2 × the output, multi-head attention's K and V).",
    )
    tensor_parallel: TensorParallelProfile | None = Field(
        default=None, description="Tensor-parallel behaviour; None if the layer cannot be split."
    )
    block_index: NonNegativeInt | None = Field(
        default=None,
        description="At sub-block grain: index of the block-grain layer (the model's `layers` "
        "entry) this unit is a part of. None at block grain.",
    )
    part: Literal["attn", "mlp"] | None = Field(
        default=None,
        description="At sub-block grain: which residual part of its block this unit is "
        "('attn': norm, attention, residual add; 'mlp': norm, MLP, residual add); None for a "
        "whole layer (embedding, head, a block that cannot be split).",
    )
    replica_of: int | None = Field(
        default=None,
        description="Index of the identical layer whose profile this is a copy of (profiled once).",
    )
    experts: ExpertProfile | None = Field(
        default=None, description="Routed experts, for a mixture-of-experts layer; else None."
    )
    measured: list[MeasuredTimes] = Field(
        default_factory=list,
        max_length=limits.MAX_MEASURED_ENTRIES,
        description="Measured times, one entry per (device, tp, micro-batch size) measured.",
    )


class ProfileTotals(_Strict):
    """Sums over all layers."""

    forward_flops: NonNegativeInt
    backward_flops: NonNegativeInt
    param_count: NonNegativeInt
    param_bytes: NonNegativeInt
    saved_activation_bytes: NonNegativeInt
    forward_bytes_moved: NonNegativeInt | None = None
    backward_bytes_moved: NonNegativeInt | None = None
    selective_recompute_saved_bytes: NonNegativeInt | None = None


class Profile(_Strict):
    """Per-layer compute and memory of one model at one sequence length and micro-batch size."""

    schema_version: Literal[1] = Field(
        default=PROFILE_SCHEMA_VERSION, description="Version of this schema."
    )
    model: ModelRef
    seq_len: int = Field(ge=1, le=limits.MAX_SEQ_LEN, description="Tokens per sample.")
    micro_batch_size: int = Field(
        ge=1, le=limits.MAX_MICRO_BATCH_SIZE, description="Samples per micro-batch profiled."
    )
    dtype: DType = Field(description="Training dtype of parameters and activations.")
    dtype_bytes: int = Field(ge=1, le=8, description="Bytes per element of `dtype`.")
    layers: list[LayerProfile] = Field(min_length=1, max_length=limits.MAX_LAYERS)
    totals: ProfileTotals
    profiled_layer_indices: list[int] = Field(
        max_length=limits.MAX_LAYERS,
        description="Layers actually traced; all others are replicas of one of these.",
    )
    method: str = Field(
        description="How figures were obtained, e.g. 'FakeTensorMode + FlopCounterMode'."
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What a reader should know: how layers were found, which were replicated.",
    )
    attention_kernel: Literal["flash", "math"] = Field(
        default="flash",
        description="Attention traced: 'flash' (fused, no s×s scores in memory) or 'math' "
        "(unfused QKᵀ, softmax over s×s, ·V). Profiles written before the field are flash.",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> Profile:
        # Memory is costed in dtype_bytes and time in dtype's peak: the two must agree.
        if self.dtype_bytes != DTYPE_ELEMENT_BYTES[self.dtype]:
            raise ValueError(
                f"dtype_bytes {self.dtype_bytes} is not the size of {self.dtype} "
                f"({DTYPE_ELEMENT_BYTES[self.dtype]} bytes per element)"
            )
        outside = sorted({i for i in self.profiled_layer_indices if not 0 <= i < len(self.layers)})
        if outside:
            raise ValueError(f"profiled_layer_indices names layers {outside}, which do not exist")
        for position, layer in enumerate(self.layers):
            if layer.index != position:
                raise ValueError(
                    f"layer {position} has index {layer.index}; indices must be 0..n-1"
                )
            if layer.replica_of == position:
                raise ValueError(f"layer {position} names itself as the layer it replicates")
            if layer.replica_of is not None and layer.replica_of not in self.profiled_layer_indices:
                raise ValueError(
                    f"layer {position} replicates layer {layer.replica_of}, which was not profiled"
                )
        if self.model.num_layers != len(self.layers):
            raise ValueError(
                f"model.num_layers ({self.model.num_layers}) != len(layers) ({len(self.layers)})"
            )
        return self
