"""Megatron-style tensor parallelism with DTensor: column-split in, row-split out.

In each block, the projections that fan out (q, k, v, the MLP's up and gate) are split by
output columns (``ColwiseParallel``) and the ones that fan back in (attention out, MLP down) by
input rows (``RowwiseParallel``), so each attention or MLP sub-layer costs one all-reduce forward
and one backward. Norms, embeddings and the head stay replicated. The zoo's attention reshapes
with ``view(..., -1, head_dim)``, so it works on the tp-local heads unchanged.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from autoplan.errors import InputError
from autoplan.runtime.model_stage import pipeline_layers

__all__ = ["COLUMN_PROJECTIONS", "ROW_PROJECTIONS", "apply_tensor_parallel"]

# Leaf names of the projections, as the zoo's GPT and Llama blocks (and Hugging Face) name them.
COLUMN_PROJECTIONS = frozenset(
    {"q", "k", "v", "up", "gate", "q_proj", "k_proj", "v_proj", "up_proj", "gate_proj", "w1", "w3"}
)
ROW_PROJECTIONS = frozenset({"out", "down", "o", "o_proj", "down_proj", "w2"})


def _tp_plan(layer_name: str, layer: nn.Module, degree: int) -> dict[str, object]:
    plan: dict[str, object] = {}
    unknown: list[str] = []
    for name, module in layer.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in COLUMN_PROJECTIONS:
            if module.out_features % degree:
                raise InputError(
                    f"{layer_name}.{name} has {module.out_features} output features, not "
                    f"divisible by tensor parallel degree {degree}"
                )
            plan[name] = ColwiseParallel()
        elif leaf in ROW_PROJECTIONS:
            if module.in_features % degree:
                raise InputError(
                    f"{layer_name}.{name} has {module.in_features} input features, not "
                    f"divisible by tensor parallel degree {degree}"
                )
            plan[name] = RowwiseParallel()
        else:
            unknown.append(name)
    if plan and unknown:
        raise InputError(
            f"{layer_name}: cannot tell how to split linear layer(s) {', '.join(unknown)} for "
            f"tensor parallelism (known: column {sorted(COLUMN_PROJECTIONS)}, "
            f"row {sorted(ROW_PROJECTIONS)})"
        )
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, divisor: int | None) -> None:
    """Split, in place, every block among ``model``'s pipeline layers over the 1-D ``tp_mesh``.

    ``divisor`` is what the degree must divide (the zoo's gcd of attention heads, kv heads and
    MLP width; None when unknown): a kv head cannot be split, even where its width could be.
    """
    degree = tp_mesh.size()
    if divisor is not None and divisor % degree:
        raise InputError(
            f"tensor parallel degree {degree} does not divide the model's heads, kv heads and "
            f"MLP width (their gcd is {divisor})"
        )
    for layer_name, layer in pipeline_layers(model):
        plan = _tp_plan(layer_name or type(layer).__name__, layer, degree)
        if plan:
            parallelize_module(layer, tp_mesh, plan)
