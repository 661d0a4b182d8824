"""Test driver run as the ranks of a launch (tests/forked_ranks.py, or torchrun): trains every
plan of a folder in one launch, dumping gradients.

``python -m torch.distributed.run --nproc-per-node W tests/distributed_driver.py PLANS OUT``
runs, one after another in the same processes, each ``PLANS/*.json`` whose world size is W
(so one launch serves many plans: launches cost seconds each), for ``STEPS`` steps. Plans whose
name ends in ``_dataloader`` get their data through ``train``'s ``batches`` argument from a
``torch.utils.data.DataLoader`` over synthetic tokens of another seed (``LOADER_DATA_SEED``),
so that the run matches the reference only if the loader's data was used. Plans whose name ends
in ``_masterweights`` train with ``MasterWeightAdamW`` (ZeRO-1 sharded over dp when the plan
says ZeRO-1) although float64, so that its sharding and broadcasts are checked exactly. Plans
whose name ends in ``_groups`` run through the groups executor although uniform
(``train(..., executor="groups")``). Plans whose name ends in ``_memory`` also record what each
pipeline action holds (``tests.split_backward_memory``) to ``OUT/<plan>/rank<r>_memory.json``.
Plans of several nodes run in the one launch too: each rank is given the torchrun variables
its node would have (``GROUP_RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from the plan's rank
map), as if each plan node were its own torchrun agent on this machine. Every rank
saves its stages' gradients of each step to ``OUT/<plan>/rank<r>_step<s>.pt`` and rank 0 the
run report to ``OUT/<plan>/report.json``; the pytest process compares them with single-process
training.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.utils.data import DataLoader, TensorDataset

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime import mesh_executor, tensor_parallel
from autoplan.runtime.data import training_batches
from autoplan.runtime.data_parallel import make_optimizer
from autoplan.runtime.loss import loss_context, loss_function
from autoplan.runtime.mixed_precision import MasterWeightAdamW
from autoplan.runtime.trainer import train
from autoplan.runtime.world import exit_process
from tests.split_backward_memory import recording_split_backward_memory

STEPS = 2
LOADER_DATA_SEED = 123  # train()'s own synthetic data uses seed + 1 = 1
SPLIT_LOSS_SHAPE = (2, 4, 33)  # (batch, seq, vocab): tp 2 holds 17 and 16 columns
SPLIT_LOSS_WEIGHT = 0.5


def _data_loader(plan: Plan) -> DataLoader:
    source = training_batches(plan, LOADER_DATA_SEED)
    pairs = [next(source) for _ in range(STEPS)]
    inputs = torch.cat([batch_inputs[0] for batch_inputs, _ in pairs])
    targets = torch.cat([batch_targets for _, batch_targets in pairs])
    return DataLoader(
        TensorDataset(inputs, targets), batch_size=plan.inputs.global_batch_size, shuffle=False
    )


def _master_weight_optimizer(
    params: list[torch.nn.Parameter], dp_mesh: DeviceMesh, zero1: bool, learning_rate: float
) -> MasterWeightAdamW:
    group = dp_mesh.get_group() if zero1 and dp_mesh.size() > 1 else None
    return MasterWeightAdamW(params, learning_rate, group)


_APPLY_TENSOR_PARALLEL = tensor_parallel.apply_tensor_parallel


def _recording_tensor_parallel(
    path: Path,
) -> Callable[..., None]:
    stages: list[dict[str, dict[str, object]]] = []

    def apply(
        model: torch.nn.Module, tp_mesh: DeviceMesh, divisor: int | None, **options: object
    ) -> None:
        _APPLY_TENSOR_PARALLEL(model, tp_mesh, divisor, **options)  # type: ignore[arg-type]
        first_name: dict[int, str] = {}
        layout: dict[str, dict[str, object]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            local = param.to_local() if isinstance(param, DTensor) else param
            layout[name] = {
                "local_shape": list(local.shape),
                "placements": str(getattr(param, "placements", "plain")),
                "same_as": first_name.setdefault(id(param), name),
            }
        stages.append(layout)
        path.write_text(json.dumps(stages, indent=1))

    return apply


def split_loss_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 logits and target ids of the vocabulary-split loss check."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(SPLIT_LOSS_SHAPE, dtype=torch.float64, generator=generator)
    targets = torch.randint(0, SPLIT_LOSS_SHAPE[-1], SPLIT_LOSS_SHAPE[:-1], generator=generator)
    return logits, targets


def _check_vocabulary_split_loss(out_dir: Path, world_size: int, rank: int) -> None:
    logits, targets = split_loss_inputs()
    mesh = init_device_mesh("cpu", (world_size,))
    sharded = distribute_tensor(logits, mesh, [Shard(-1)]).requires_grad_()
    with loss_context(True):
        loss = loss_function("cross_entropy", SPLIT_LOSS_WEIGHT)(sharded, targets)
        loss.backward()
    assert isinstance(sharded.grad, DTensor)
    gradient = sharded.grad.full_tensor()
    if rank == 0:
        torch.save({"loss": loss.detach(), "gradient": gradient}, out_dir / "vocab_split_loss.pt")


def _node_environ(plan: Plan, rank: int) -> dict[str, str]:
    """The torchrun variables of ``rank`` had each plan node its own agent."""
    entry = plan.rank_map[rank]
    node = next(node for node in plan.nodes if node.node_rank == entry.node_rank)
    return {
        "WORLD_SIZE": str(plan.world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(entry.local_rank),
        "GROUP_RANK": str(entry.node_rank),
        "LOCAL_WORLD_SIZE": str(node.nproc_per_node),
    }


def main(plans_dir: Path, out_dir: Path) -> None:
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    for path in sorted(plans_dir.glob("*.json")):
        plan = read_json_model(path, Plan)
        if plan.world_size != world_size:
            continue
        target = out_dir / path.stem
        target.mkdir(parents=True, exist_ok=True)

        def save(step: int, gradients: dict[str, torch.Tensor], target: Path = target) -> None:
            torch.save(gradients, target / f"rank{rank}_step{step}.pt")

        batches = _data_loader(plan) if path.stem.endswith("_dataloader") else None
        mesh_executor.make_optimizer = (  # type: ignore[assignment]
            _master_weight_optimizer if path.stem.endswith("_masterweights") else make_optimizer
        )
        tensor_parallel.apply_tensor_parallel = _recording_tensor_parallel(
            target / f"rank{rank}_shards.json"
        )
        executor = "groups" if path.stem.endswith("_groups") else "auto"
        memory = target / f"rank{rank}_memory.json"
        with (
            recording_split_backward_memory(memory)
            if path.stem.endswith("_memory")
            else contextlib.nullcontext()
        ):
            report = train(
                plan,
                STEPS,
                batches,
                on_gradients=save,
                environ=_node_environ(plan, rank),
                executor=executor,
            )
        if rank == 0:
            write_json_model(target / "report.json", report)
        dist.barrier()
    if world_size == 2:
        _check_vocabulary_split_loss(out_dir, world_size, rank)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
