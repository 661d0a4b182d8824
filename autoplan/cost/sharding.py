"""ZeRO levels of one stage: what each shards across the stage's replicas, and what it costs.

A stage of n replicas (every replica of one tp, as for ZeRO-1) at level z holds per GPU, of
its P parameters (its tp shard) in the training dtype of d bytes with o optimizer bytes each:

====  =====================  ==========  ==========  ======================================
z     weights                gradients   optimizer   what runs (torch 2.13, FSDP2)
====  =====================  ==========  ==========  ======================================
0     P d                    P d         P o         DDP all-reduce after the last backward
1     P d                    P d         P o / n     DDP + ZeroRedundancyOptimizer
2     P d / n (+ P d)        P d / n     P o / n     fully_shard, reshard_after_forward=False
3     P d / n                P d / n     P o / n     fully_shard, reshard_after_forward=True
====  =====================  ==========  ==========  ======================================

At levels 0 and 1 the gradients are held once by both engines (``autoplan.cost.engines``):
autoplan's DDP makes them views into its all-reduce buckets, DeepSpeed flattens them after the
last backward.

At level 2 the stage's gathered parameters (``gathered_bytes``: P d) are held from each
micro-batch's forward to its backward, which under 1F1B is always: they count with the
transients (they are not a model state; after the step only the shards remain).

Levels 2 and 3 are FSDP2 ``fully_shard`` per layer and per stage over the stage's replicas.
The runtime (``autoplan.runtime.fsdp``) reduce-scatters the gradients in every micro-batch's
backward and reshards the parameters after it: torch's pipelining would otherwise defer the
reduce-scatter to the last micro-batch and keep every gradient and parameter unsharded for
the whole step, which shards nothing at the peak. So, per micro-batch:

- level 2 all-gathers the stage's parameters in its forward (kept gathered until its
  backward: the ``P d`` above, held in every 1F1B step) and reduce-scatters the gradients in
  its backward;
- level 3 all-gathers them in the forward, again in the backward, and reduce-scatters.

Each all-gather or reduce-scatter of the stage's parameters takes half the all-reduce's time
on the same link (``CostModel.allreduce_ms``: a ring's reduce-scatter and all-gather halves).
FSDP2 prefetches the next layer's all-gather behind the current layer's compute, so the
collectives of a pass overlap that pass: what is exposed is what exceeds it,
max(0, collectives − pass time), added to the pass. No gradient all-reduce is left for the
tail; the optimizer steps over the shard.

Transients: the unsharded gradients of the layer being reduce-scattered and of the next
(2 layers), and at level 3 the gathered parameters of the current and the prefetched layer
(2 more). The largest layer of the model stands for "the layer" (an upper bound that keeps the
search's stage costs O(1)).
"""

from __future__ import annotations

__all__ = [
    "ZERO_LEVELS",
    "exposed_ms",
    "gathered_bytes",
    "static_bytes",
    "static_bytes_per_param",
    "transient_bytes",
]

ZERO_LEVELS = (0, 1, 2, 3)


def _shards(replicas: int, level: int) -> int:
    return replicas if replicas > 1 and level >= 1 else 1


def static_bytes(
    params_per_gpu: float,
    replicas: int,
    level: int,
    dtype_bytes: int,
    optimizer_bytes_per_param: float,
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes one GPU holds at ZeRO ``level``."""
    n = _shards(replicas, level)
    full = params_per_gpu * dtype_bytes
    optimizer = params_per_gpu * optimizer_bytes_per_param / n
    if n == 1 or level <= 1:
        return full, full, optimizer
    return full / n, full / n, optimizer


def gathered_bytes(params_per_gpu: float, replicas: int, level: int, dtype_bytes: int) -> float:
    """Level 2's gathered parameters of the stage, held during the step (module docstring)."""
    if level != 2 or replicas <= 1:
        return 0.0
    return params_per_gpu * dtype_bytes


def static_bytes_per_param(
    replicas: int,
    level: int,
    dtype_bytes: int,
    optimizer_bytes_per_param: float,
) -> float:
    """Bytes per parameter held for the whole step: ``static_bytes`` and ``gathered_bytes``
    of one."""
    static = sum(static_bytes(1.0, replicas, level, dtype_bytes, optimizer_bytes_per_param))
    return static + gathered_bytes(1.0, replicas, level, dtype_bytes)


def transient_bytes(
    largest_layer_params: float, replicas: int, level: int, dtype_bytes: int
) -> float:
    """What levels 2 and 3 add to the largest transient (module docstring)."""
    if _shards(replicas, level) == 1 or level <= 1:
        return 0.0
    layers = 2 if level == 2 else 4
    return layers * largest_layer_params * dtype_bytes


def exposed_ms(
    level: int, collective_ms: float, forward_ms: float, backward_ms: float
) -> tuple[float, float]:
    """(forward, backward) time a micro-batch's ZeRO collectives add to the stage's passes;
    ``collective_ms`` is one all-gather (or reduce-scatter) of the stage's parameters."""
    if level <= 1 or collective_ms <= 0:
        return 0.0, 0.0
    backward_collectives = 1 if level == 2 else 2
    return (
        max(0.0, collective_ms - forward_ms),
        max(0.0, backward_collectives * collective_ms - backward_ms),
    )
