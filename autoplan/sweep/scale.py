"""Clusters of other sizes made from one cluster file: the configurations ``autoplan sweep`` solves.

Proportional (the default): a cluster of N nodes keeps the file's node groups in the file's
proportions. Group i of c_i nodes (C in all) gets N·c_i/C nodes, rounded by the largest-remainder
rule: each group its floor, then one more node to the groups with the largest remainders (ties
to the earlier group in the file), so that the counts add up to N exactly; N = C gives the file's
own counts.

By GPU mix (``--gpu-mix H100=0.5,A100-80GB=0.5``): fractions *of the nodes* per GPU type, adding
up to 1. Type T gets N·f_T nodes by the same rule (types in the file's order), shared among T's
node groups in their file proportions; a type the mix leaves out gets no node.

Groups left with no node are dropped, and so are the inter-node links that then join no group.
Everything else (GPUs per node, links' bandwidths and latencies, ``gpu_types``, the memory
reserve) stays as the file has it. The cluster is named ``<name>-<N>n``.
"""

from __future__ import annotations

import math

from autoplan import limits
from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.errors import InputError

__all__ = ["check_gpu_mix", "largest_remainder", "scale_cluster"]

# How far the fractions of a GPU mix may add up from 1 (0.33 + 0.33 + 0.34 is fine; 0.3 is a
# typo): the counts are then taken from the fractions normalised to 1.
_MIX_TOLERANCE = 1e-3


def largest_remainder(weights: list[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights`` (non-negative, some positive) into integers
    that add up to ``total``: floors first, then one each to the largest remainders, ties to the
    earlier weight."""
    whole = sum(weights)
    quotas = [total * weight / whole for weight in weights]
    counts = [math.floor(quota) for quota in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for index in order[: total - sum(counts)]:
        counts[index] += 1
    return counts


def _gpu_types(cluster: Cluster) -> list[str]:
    """The cluster's GPU types in the order of their first node group."""
    return list(dict.fromkeys(group.gpu for group in cluster.node_groups))


def check_gpu_mix(cluster: Cluster, gpu_mix: dict[str, float]) -> dict[str, float]:
    """The mix with its fractions normalised to add up to 1; InputError naming the problem if
    a type is not one of the cluster's, a fraction is outside [0, 1], or they do not add up
    to 1 (within 0.001)."""
    known = _gpu_types(cluster)
    for name, fraction in gpu_mix.items():
        if name not in known:
            raise InputError(
                f"--gpu-mix names GPU type {name!r}; the cluster's types are {', '.join(known)}"
            )
        if not 0 <= fraction <= 1:  # NaN fails too
            raise InputError(f"--gpu-mix fraction of {name} must be in [0, 1]; got {fraction}")
    total = sum(gpu_mix.values())
    if abs(total - 1) > _MIX_TOLERANCE:
        raise InputError(f"--gpu-mix fractions must add up to 1; they add up to {total:g}")
    return {name: fraction / total for name, fraction in gpu_mix.items()}


def _node_counts(cluster: Cluster, nodes: int, gpu_mix: dict[str, float] | None) -> list[int]:
    groups = cluster.node_groups
    if gpu_mix is None:
        return largest_remainder([group.count for group in groups], nodes)
    types = _gpu_types(cluster)
    per_type = largest_remainder([gpu_mix.get(name, 0.0) for name in types], nodes)
    counts = [0] * len(groups)
    for name, type_nodes in zip(types, per_type, strict=True):
        members = [i for i, group in enumerate(groups) if group.gpu == name]
        shares = largest_remainder([groups[i].count for i in members], type_nodes)
        for index, share in zip(members, shares, strict=True):
            counts[index] = share
    return counts


def _scaled_name(name: str, nodes: int) -> str:
    suffix = f"-{nodes}n"
    return name[: limits.MAX_NAME_LENGTH - len(suffix)] + suffix


def scale_cluster(cluster: Cluster, nodes: int, gpu_mix: dict[str, float] | None = None) -> Cluster:
    """``cluster`` with ``nodes`` nodes, its groups in the file's proportions or, with
    ``gpu_mix`` (GPU type → fraction of the nodes), in those (module docstring).

    Raises InputError if ``nodes`` is not positive, the mix is not one of the cluster's types
    adding up to 1, or the result has more nodes or GPUs than autoplan takes."""
    if not 1 <= nodes <= limits.MAX_CLUSTER_NODES:
        raise InputError(f"a cluster takes 1 to {limits.MAX_CLUSTER_NODES:,} nodes; got {nodes}")
    mix = None if gpu_mix is None else check_gpu_mix(cluster, gpu_mix)
    counts = _node_counts(cluster, nodes, mix)
    kept: list[NodeGroup] = [
        group.model_copy(update={"count": count})
        for group, count in zip(cluster.node_groups, counts, strict=True)
        if count > 0
    ]
    gpus = sum(group.count * group.gpus_per_node for group in kept)
    if gpus > limits.MAX_CLUSTER_GPUS:
        raise InputError(
            f"{cluster.name} scaled to {nodes} nodes has {gpus:,} GPUs; autoplan takes at most "
            f"{limits.MAX_CLUSTER_GPUS:,}"
        )
    names = {group.name for group in kept}
    links = []
    for link in cluster.inter_node_links:
        joined = [name for name in link.groups if name in names]
        if joined:
            links.append(link.model_copy(update={"groups": joined}))
    # Validated again (model_copy does not): the scaled cluster obeys every rule of a file.
    return Cluster.model_validate(
        {
            **cluster.model_dump(),
            "name": _scaled_name(cluster.name, nodes),
            "node_groups": [group.model_dump() for group in kept],
            "inter_node_links": [link.model_dump() for link in links],
        }
    )
