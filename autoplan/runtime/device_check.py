"""Is the GPU this rank found the GPU type the plan gave it? Checked before any process group.

A plan places each stage on a GPU type by its speed and memory; started on other GPUs (a node
list in the wrong order, a mistyped host), it would run, slowly or out of memory, with nothing
to say why. torch names the device (``torch.cuda.get_device_name``, e.g.
'NVIDIA A100-SXM4-80GB') and its memory; the plan's type must match the name
(``autoplan.cost.layers.matches_device``, the same matching the profile's measured times use)
and its memory must be the catalog's within ``MEMORY_TOLERANCE`` (an 80 GB card reports
a little less than 80 GiB; a MIG slice or a 40 GB card much less). CPU runs (gloo) have no GPU to
check: their "GPU types" are stand-ins for processes of this machine.
"""

from __future__ import annotations

import torch

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.layers import matches_device
from autoplan.errors import LaunchMismatchError
from autoplan.plan.schema import Plan, RankEntry

__all__ = ["MEMORY_TOLERANCE", "check_device", "check_device_identity"]

MEMORY_TOLERANCE = 0.1
"""Relative difference allowed between the device's total memory and its type's catalog figure."""


def check_device_identity(
    plan: Plan, entry: RankEntry, device_name: str, total_memory_bytes: int
) -> None:
    """LaunchMismatchError unless a device called ``device_name`` with ``total_memory_bytes``
    is the plan's GPU type for rank ``entry``."""
    gpu_type = entry.gpu_type
    found = f"{device_name} ({total_memory_bytes / 2**30:.1f} GiB)"
    where = f"rank {entry.rank} (node {entry.node}, local rank {entry.local_rank})"
    if not matches_device(gpu_type, device_name):
        raise LaunchMismatchError(
            f"{where} found a {found}, but the plan runs it as a {gpu_type}: start each plan "
            "node on a host with its GPU type (or solve for the GPUs you have)"
        )
    spec = gpu_specs(plan.inputs.cluster).get(gpu_type)
    if spec is None:
        return
    if abs(total_memory_bytes - spec.memory_bytes) > MEMORY_TOLERANCE * spec.memory_bytes:
        raise LaunchMismatchError(
            f"{where} found a {found}, but the plan's {gpu_type} has {spec.memory_gib:g} GiB: "
            "a different model of the card, or a MIG slice"
        )


def check_device(plan: Plan, entry: RankEntry, device: torch.device) -> None:
    """On CUDA, check this rank's GPU against the plan (``check_device_identity``); on CPU,
    nothing."""
    if device.type != "cuda":
        return
    properties = torch.cuda.get_device_properties(device)
    check_device_identity(plan, entry, torch.cuda.get_device_name(device), properties.total_memory)
