"""The cost model as it was before issue 9, for bench_fidelity's "before" columns.

Before issue 9 (commit 5331848) a matmul ran at one flat efficiency per GPU type and dtype
(no intensity curve, no launch floor, no backward factor: the GpuSpec fields' defaults), the
catalog carried the efficiencies fitted then (``bench/gpus_before_issue9.yaml``), collectives
paid one latency whatever the group size (no ring steps, no tree), nothing was reserved, and
the calibration bench assumed fixed links per GPU type (``LINKS_BEFORE``). ``model_before()``
puts the old collective formula back for the duration of a block; ``catalog_before()`` is the
old catalog. The layer formulas themselves need no patch: with the new fields at their
defaults they are the old ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autoplan.cluster.catalog import GpuCatalog
from autoplan.cluster.schema import GpuSpec
from autoplan.files import read_yaml_model
from bench.calibration_data import Link

__all__ = ["LINKS_BEFORE", "catalog_before", "model_before", "ring_allreduce_ms_before"]

CATALOG_BEFORE = Path(__file__).with_name("gpus_before_issue9.yaml")

# The intra-node links the calibration bench assumed before issue 9 (GB/s each way, 10 µs).
_LATENCY_BEFORE_US = 10.0
LINKS_BEFORE = {
    "A100-40GB": 300.0,
    "A100-80GB": 300.0,
    "V100-16GB": 150.0,
    "GH200": 450.0,
    "RTX-2080": 12.0,
    "RTX-3090": 20.0,
    "Titan-RTX": 12.0,
}


def link_before(gpu: str) -> Link:
    """The link the old calibration bench assumed for ``gpu``'s tp groups."""
    return Link(LINKS_BEFORE[gpu], _LATENCY_BEFORE_US)


def catalog_before() -> dict[str, GpuSpec]:
    """The GPU catalog of commit 5331848."""
    return {gpu.name: gpu for gpu in read_yaml_model(CATALOG_BEFORE, GpuCatalog).gpus}


def ring_allreduce_ms_before(
    payload_bytes: float,
    group_size: int,
    bandwidth_gb_per_s: float,
    latency_us: float,
    **_: Any,
) -> float:
    """The old all-reduce: 2(n-1)/n of the payload at the bandwidth plus one latency."""
    if group_size <= 1 or payload_bytes <= 0:
        return 0.0
    volume = 2.0 * (group_size - 1) / group_size * payload_bytes
    return volume / (bandwidth_gb_per_s * 1e9) * 1e3 + latency_us * 1e-3


@contextlib.contextmanager
def model_before() -> Iterator[None]:
    """Within the block, the layer and plan cost models use the old all-reduce formula."""
    import autoplan.cost.layers as layers
    import autoplan.cost.model as model

    saved = (layers.ring_allreduce_ms, model.ring_allreduce_ms, model.nccl_allreduce_ms)
    layers.ring_allreduce_ms = ring_allreduce_ms_before
    model.ring_allreduce_ms = ring_allreduce_ms_before
    model.nccl_allreduce_ms = ring_allreduce_ms_before
    try:
        yield
    finally:
        layers.ring_allreduce_ms, model.ring_allreduce_ms, model.nccl_allreduce_ms = saved
