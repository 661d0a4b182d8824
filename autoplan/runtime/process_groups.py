"""The process groups a rank trains on: a uniform plan's DeviceMesh, or per-stage groups.

A uniform plan (one (dp, cp, tp) for every stage) is one DeviceMesh of shape (pp, dp, tp), or
(pp, dp, cp, tp) with context parallelism (:func:`build_mesh`); the mesh executor takes its
sub-meshes. Any other plan runs on groups of its own rank sets (:class:`ProcessGroups`).

Process groups: ``dist.new_group`` is collective over the whole world (every rank must create
every group, in the same order, even groups it is not in), so :class:`ProcessGroups` takes
the full list of rank sets that any rank will use, computed from the plan alike on every rank,
and creates them once, sorted. A replica's tensor-parallel group becomes a 1-D DeviceMesh with
``DeviceMesh.from_group`` (no further collective), the mesh DTensor's Colwise/Rowwise
parallelism runs on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoplan.errors import InputError, LaunchMismatchError
from autoplan.plan.schema import Plan, RankEntry, Replica

__all__ = [
    "CP_MESH_DIMS",
    "MESH_DIMS",
    "ProcessGroups",
    "UniformMesh",
    "build_mesh",
    "tp_mesh",
]

MESH_DIMS = ("pp", "dp", "tp")
# With context parallelism the cp groups sit between the replicas and their tp groups.
CP_MESH_DIMS = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True)
class UniformMesh:
    """A uniform plan's DeviceMesh and the groups the mesh executor takes from it."""

    mesh: DeviceMesh
    """(pp, dp, tp), or (pp, dp, cp, tp) with context parallelism."""
    data: DeviceMesh
    """The replicas and their cp ranks: gradients are reduced (and ZeRO shards) over them."""
    cp_group: dist.ProcessGroup | None
    """The context-parallel ring; None without context parallelism."""


def build_mesh(plan: Plan, device: torch.device, entry: RankEntry) -> UniformMesh:
    """The (pp, dp, tp) DeviceMesh of a uniform plan, (pp, dp, cp, tp) with context
    parallelism; checks this rank sits where the rank map says."""
    uniform = plan.mesh_shape()
    if uniform is None:
        raise InputError(
            "the plan's stages differ in replicas, tp or shares: one DeviceMesh cannot hold "
            "it (run it with the groups executor)"
        )
    dp, cp, tp = uniform
    pp = plan.parallelism.pipeline_degree
    if cp > 1:
        shape: tuple[int, ...] = (pp, dp, cp, tp)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=CP_MESH_DIMS)
        expected = [entry.pipeline_rank, entry.dp_index, entry.cp_index, entry.tp_index]
    else:
        shape = (pp, dp, tp)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS)
        expected = [entry.pipeline_rank, entry.dp_index, entry.tp_index]
    coordinate = mesh.get_coordinate()
    if coordinate is None or list(coordinate) != expected:
        raise LaunchMismatchError(
            f"rank {entry.rank} is at (pp, dp, tp) = {coordinate} of the row-major mesh "
            f"{shape}, but the plan's rank map says {tuple(expected)}"
        )
    if cp == 1:
        return UniformMesh(mesh, mesh["dp"], None)
    # Creating the flattened group is collective: once per process, here.
    return UniformMesh(mesh, mesh["dp", "cp"]._flatten("dp_cp"), mesh["cp"].get_group())


def _key(ranks: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(ranks)))


class ProcessGroups:
    """One process group per distinct rank set of more than one rank, created on every rank
    in one sorted order; looked up by rank set (order ignored) on its members."""

    def __init__(self, rank_sets: Iterable[Sequence[int]]) -> None:
        me = dist.get_rank()
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in sorted({_key(ranks) for ranks in rank_sets if len(set(ranks)) > 1}):
            group = dist.new_group(list(ranks))
            if me in ranks:
                self._groups[ranks] = group

    def get(self, ranks: Iterable[int]) -> dist.ProcessGroup | None:
        """The group of ``ranks`` (this rank among them); None for a single rank."""
        key = _key(ranks)
        if len(key) == 1:
            return None
        if key not in self._groups:
            raise KeyError(f"no process group of ranks {list(key)} on rank {dist.get_rank()}")
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)


def tp_mesh(groups: ProcessGroups, replica: Replica, device: torch.device) -> DeviceMesh:
    """The 1-D DeviceMesh of ``replica``'s tp group (this rank is in it; tp > 1)."""
    group = groups.get(replica.ranks)
    if group is None:
        raise ValueError(f"replica on ranks {replica.ranks} has no tp group")
    return DeviceMesh.from_group(group, device.type, mesh_dim_names=("tp",))
