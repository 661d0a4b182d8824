"""One layer's forward and backward time on one GPU type, the cost model's own pieces put
together the way the tests of the efficiency curves, measured tables and layer costs ask."""

from __future__ import annotations

from autoplan.cluster.catalog import peak_tflops, spec_for_dtype
from autoplan.cluster.schema import GpuSpec
from autoplan.cost.layers import layer_cost
from autoplan.profile.schema import LayerProfile


def layer_time_ms(
    layer: LayerProfile,
    gpu: GpuSpec,
    dtype: str,
    tp: int,
    micro_batch_size: int,
    *,
    profile_micro_batch_size: int = 1,
    efficiency: float | None = None,
    intra_node_bandwidth_gb_per_s: float | None = None,
    intra_node_latency_us: float = 0.0,
    recompute: str = "none",
) -> tuple[float, float]:
    """(forward_ms, backward_ms) of one micro-batch of ``layer`` on one GPU of a tp group.

    ``profile_micro_batch_size`` is the micro-batch the layer's figures were profiled at
    (``Profile.micro_batch_size``). The tp all-reduces are included only when the intra-node
    bandwidth is given.
    """
    resolved = spec_for_dtype(gpu, dtype, efficiency)
    cost = layer_cost(
        layer,
        resolved,
        peak_tflops(gpu, dtype),
        tp=tp,
        micro_batch_size=micro_batch_size,
        profile_micro_batch_size=profile_micro_batch_size,
        efficiency=resolved.efficiency,
        intra_node_bandwidth_gb_per_s=intra_node_bandwidth_gb_per_s,
        intra_node_latency_us=intra_node_latency_us,
    )
    return cost.forward_ms(), cost.backward_ms(recompute)
