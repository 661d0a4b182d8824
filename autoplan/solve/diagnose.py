"""Why no plan exists: the binding constraint, with numbers, and in a few words."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.model import CostModel
from autoplan.solve.baselines import blind_model
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors, tp_choices

__all__ = [
    "Diagnosis",
    "diagnose_before_search",
    "diagnose_infeasible",
    "diagnose_megatron_infeasible",
]


@dataclass(frozen=True)
class Diagnosis:
    """The constraint that leaves no plan: ``message`` with its numbers, ``short`` as a phrase
    of a few words for a table row. ``proven``: the constraint holds whatever the search
    found (a count or a total); False for the last resort, 'nothing fits in memory', which
    only a search that ran to the end shows."""

    short: str
    message: str
    proven: bool = True


def _gb(value: float) -> str:
    return f"{value / 1e12:.2f} TB" if value >= 1e12 else f"{value / 1e9:.1f} GB"


def diagnose_before_search(model: CostModel, options: SolveOptions) -> Diagnosis | None:
    """A constraint that leaves no plan whatever the search would find, told before it runs:
    a pinned tp that fits no layer or node, pinned degrees beyond the GPU count, or model states
    beyond the whole cluster's memory (ZeRO-3 over every GPU could not hold them). None when
    only a search can tell. Batch divisibility is left to the search: uneven shares may
    absorb it."""
    return _diagnose_counts(model, options) or _diagnose_model_states(model)


def _diagnose_counts(model: CostModel, options: SolveOptions) -> Diagnosis | None:
    gpus = model.cluster.total_gpus()
    if options.tp is not None and not tp_choices(model, options):
        limits = sorted(
            {
                layer.tensor_parallel.degree_must_divide
                for layer in model.profile.layers
                if layer.tensor_parallel is not None
            }
        )
        per_node = sorted({c.gpus_per_node for c in model.classes})
        return Diagnosis(
            f"tp={options.tp} fits no layer or node",
            f"tp={options.tp} must divide the layers' tensor-parallel limit {limits or [1]} "
            f"and the GPUs per node {per_node}",
        )
    asked = 1
    # A pinned ep needs at least ep replicas in every stage (its expert groups).
    ep = options.expert_parallel or 1
    for value in (options.tp, max(options.dp or 1, ep), options.pp, options.cp):
        asked *= value or 1
    if asked > gpus:
        floor = f" (dp at least ep {ep})" if ep > (options.dp or 1) else ""
        # A pinned cp multiplies every replica's GPUs (cp ranks of tp GPUs each).
        degrees = "pp × dp × cp × tp" if (options.cp or 1) > 1 else "pp × dp × tp"
        return Diagnosis(
            f"{degrees} = {asked} > {gpus} GPUs",
            f"{degrees} = {asked} GPUs asked{floor}; the cluster has {gpus}",
        )
    return None


def _model_state_bytes(model: CostModel) -> float:
    params = sum(layer.param_count for layer in model.profile.layers)
    return params * (2 * model.dtype_bytes + model.optimizer_bytes_per_param)


def _diagnose_model_states(model: CostModel) -> Diagnosis | None:
    static = _model_state_bytes(model)
    memory = sum(c.gpu.memory_bytes * c.total_gpus for c in model.classes)
    if static > memory:
        return Diagnosis(
            f"model states {_gb(static)} > {_gb(memory)} of memory",
            f"weights, gradients and optimizer states need {_gb(static)}; "
            f"the cluster has {_gb(memory)}",
        )
    return None


def diagnose_infeasible(model: CostModel, batch: int, options: SolveOptions) -> Diagnosis:
    """The constraint that leaves no plan (GPU count, divisibility, memory)."""
    if (counted := _diagnose_counts(model, options)) is not None:
        return counted
    if options.dp is not None and batch % options.dp:
        return Diagnosis(
            f"dp={options.dp} does not divide the batch",
            f"dp={options.dp} does not divide the global batch {batch}",
        )
    if options.micro_batch_size is not None:
        dps = [options.dp] if options.dp else divisors(batch)
        if not any(batch % (dp * options.micro_batch_size) == 0 for dp in dps):
            return Diagnosis(
                f"micro-batch size {options.micro_batch_size} does not divide the batch",
                f"micro-batch size {options.micro_batch_size} × dp does not divide the "
                f"global batch {batch}",
            )
    if (states := _diagnose_model_states(model)) is not None:
        return states
    gpus = model.cluster.total_gpus()
    static = _model_state_bytes(model)
    # What a plan may fill: capacity less the reserve (CUDA context, NCCL, fragmentation).
    largest = max(model.usable_bytes(c.index) for c in model.classes)
    reserved = any(model.reserved_bytes(c.index) for c in model.classes)
    usable = " usable (capacity less the memory reserve)" if reserved else ""
    biggest_layer = max(
        model.tables(c.index, 1, 1).layers[i].params_per_gpu
        for c in model.classes
        for i in range(model.num_layers)
    )
    pinned = options.pinned()
    knobs = f" with {pinned}" if pinned else ""
    return Diagnosis(
        f"no configuration{knobs} fits in memory",
        f"no configuration{knobs} fits in memory: the cluster has {gpus} GPUs of at most "
        f"{_gb(largest)}{usable}; the model needs {_gb(static)} for weights, gradients and "
        f"optimizer states (largest layer {biggest_layer / 1e6:.0f} M parameters) plus activations",
        proven=False,
    )


def diagnose_megatron_infeasible(model: CostModel, batch: int, options: SolveOptions) -> Diagnosis:
    """Why the megatron baseline found no plan, in the terms it plans in.

    The baseline sees every GPU as the cluster's slowest and smallest type (``blind_model``),
    so it can fail where the cluster itself has room: the message says so first, with both
    memory totals, then gives the binding constraint of that blind pool."""
    blind = blind_model(model, options.efficiency)
    (pool,) = blind.classes
    real_memory = sum(c.gpu.memory_bytes * c.total_gpus for c in model.classes)
    blind_memory = pool.gpu.memory_bytes * pool.total_gpus
    slowest = pool.gpu.name.removeprefix("blind-")
    cause = diagnose_infeasible(blind, batch, options)
    message = cause.message
    if model.cluster.total_gpus() != pool.total_gpus:
        # The pool rounds the GPUs down to whole nodes of its smallest node size.
        message += f" (the pool keeps {pool.total_gpus} of the {model.cluster.total_gpus()} GPUs)"
    return Diagnosis(
        f"megatron sees {pool.total_gpus} × {slowest} ({pool.gpu.memory_gib:g} GiB): {cause.short}",
        f"the megatron baseline costs every GPU as the cluster's slowest and smallest "
        f"({slowest} speed, {pool.gpu.memory_gib:g} GiB each: {_gb(blind_memory)} in all, "
        f"where the cluster has {_gb(real_memory)}); so costed, {message}; "
        "--strategy optimal uses each GPU type as it is",
        cause.proven,
    )
