"""Hand-built profiles for tests of the cost model and the solver (no profiler needed).

A transformer-like model: an embedding, ``blocks`` identical blocks, a head. Figures follow
the usual formulas (2 FLOPs per MAC, backward = 2 × forward, Korthikanti et al.'s saved
activation bytes) so that the numbers are plausible, but they are made up, not traced.
"""

from __future__ import annotations

from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup
from autoplan.profile.schema import (
    LayerProfile,
    ModelRef,
    Profile,
    ProfileTotals,
    TensorParallelProfile,
)

__all__ = ["gpu", "layer", "make_cluster", "make_profile", "transformer_profile"]


def gpu(
    name: str,
    tflops: float,
    memory_gib: float,
    bandwidth: float = 1000.0,
    host_link: float = 25.0,
) -> GpuSpec:
    """A made-up GPU type with one bf16 peak (``host_link``: GB/s to host memory)."""
    return GpuSpec(
        name=name,
        memory_gib=memory_gib,
        memory_bandwidth_gb_per_s=bandwidth,
        peak_tflops={"bf16": tflops, "fp32": tflops / 2, "fp16": tflops, "fp64": tflops / 4},
        efficiency=0.5,
        host_link_bandwidth_gb_per_s=host_link,
        datasheet_url="test fixture",
    )


def make_cluster(
    groups: list[tuple[str, GpuSpec, int, int]],
    *,
    intra_gb_per_s: float = 100.0,
    inter_gb_per_s: float = 10.0,
) -> Cluster:
    """Node groups (name, gpu, gpus_per_node, count) of the given GPU types."""
    specs = {spec.name: spec for _, spec, _, _ in groups}
    return Cluster(
        name="test",
        gpu_types=list(specs.values()),
        node_groups=[
            NodeGroup(
                name=name,
                gpu=spec.name,
                gpus_per_node=per_node,
                count=count,
                intra_node_bandwidth_gb_per_s=intra_gb_per_s,
            )
            for name, spec, per_node, count in groups
        ],
        inter_node_bandwidth_gb_per_s=inter_gb_per_s,
    )


def layer(
    index: int,
    *,
    flops: int,
    params: int,
    saved: int,
    output: int,
    kind: str = "block",
    tp_divides: int | None = 4,
    dtype_bytes: int = 2,
) -> LayerProfile:
    """One layer; backward FLOPs = 2 × forward; tp splits everything but the output."""
    tp = (
        TensorParallelProfile(
            sharded_param_count=params,
            sharded_saved_activation_bytes=saved // 2,
            allreduce_payload_bytes=output,
            forward_allreduce_count=2,
            backward_allreduce_count=2,
            degree_must_divide=tp_divides,
        )
        if tp_divides
        else None
    )
    return LayerProfile(
        index=index,
        name=f"layers.{index}",
        kind=kind,  # type: ignore[arg-type]
        forward_flops=flops,
        backward_flops=2 * flops,
        forward_bytes_moved=params * dtype_bytes + 2 * output,
        backward_bytes_moved=2 * params * dtype_bytes + 4 * output,
        param_count=params,
        param_bytes=params * dtype_bytes,
        saved_activation_bytes=saved,
        selective_recompute_saved_bytes=saved * 3 // 4,
        selective_recompute_flops=flops // 10,
        input_activation_bytes=output,
        output_activation_bytes=output,
        tensor_parallel=tp,
    )


def make_profile(layers: list[LayerProfile], *, seq_len: int = 128, mbs: int = 1) -> Profile:
    """A profile of these layers (indices must be 0..n-1)."""
    return Profile(
        model=ModelRef(
            name="synthetic",
            parameter_count=sum(x.param_count for x in layers),
            num_layers=len(layers),
        ),
        seq_len=seq_len,
        micro_batch_size=mbs,
        dtype="bf16",
        dtype_bytes=2,
        layers=layers,
        totals=ProfileTotals(
            forward_flops=sum(x.forward_flops for x in layers),
            backward_flops=sum(x.backward_flops for x in layers),
            param_count=sum(x.param_count for x in layers),
            param_bytes=sum(x.param_bytes for x in layers),
            saved_activation_bytes=sum(x.saved_activation_bytes for x in layers),
        ),
        profiled_layer_indices=list(range(len(layers))),
        method="synthetic (tests)",
    )


def transformer_profile(
    blocks: int, hidden: int, seq_len: int, vocab: int = 32000, heads: int = 32
) -> Profile:
    """A GPT-like profile with per-sample figures from the standard formulas."""
    s, h = seq_len, hidden
    block_params = 12 * h * h + 13 * h
    block_flops = 24 * s * h * h + 4 * s * s * h
    saved = s * h * (34 + 5 * heads * s // h)
    out = 2 * s * h
    layers = [
        layer(
            0, flops=0, params=vocab * h, saved=out, output=out, kind="embedding", tp_divides=None
        )
    ]
    for i in range(blocks):
        layers.append(
            layer(
                1 + i,
                flops=block_flops,
                params=block_params,
                saved=saved,
                output=out,
                tp_divides=heads,
            )
        )
    layers.append(
        layer(
            blocks + 1,
            flops=2 * s * h * vocab,
            params=vocab * h,
            saved=4 * s * vocab,
            output=4 * s * vocab,
            kind="head",
            tp_divides=None,
        )
    )
    return make_profile(layers, seq_len=seq_len)
