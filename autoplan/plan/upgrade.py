"""Plans of older schema versions, read as the current one.

Version 1 (one (dp, tp) for every stage, one DeviceMesh) maps onto version 2 without loss:
every stage gets dp replicas of tp GPUs, replica d of pipeline rank p holding the ranks
``p·dp·tp + d·tp + t``, with the version-1 replica shares and the stage's recompute; each
memory estimate (one per GPU type of a pipeline rank, which had one share) describes that
type's share, and the GPUs the plan leaves unused are listed as idle.

Version 2 maps onto version 3 with no search record (``search: null``): the plan was written
before the search kept its proven bound, so nothing says how far from optimal it is.

Version 3 maps onto version 4 unchanged: version 4 adds each replica's ``routed_experts``
(experts placed by GPU speed), and a version-3 plan's experts are even (``null``).

Version 4 maps onto version 5 unchanged: version 5 adds each replica's ``context_tokens``
(uneven cp chunks), and a version-4 plan's chunks are equal (``null``).

Version 5 maps onto version 6 unchanged: version 6 adds each stage's ``sequence_parallel``
(sequence parallelism on some stages only), and a version-5 plan says it for the whole plan
(``parallelism.sequence_parallel``) or not at all (every stage's flag false).
"""

from __future__ import annotations

from typing import Any

__all__ = ["upgrade_plan_data"]


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    par = data["parallelism"]
    pp, dp, tp = (
        par["pipeline_degree"],
        par["data_parallel_degree"],
        par["tensor_parallel_degree"],
    )
    shares = list(par["replica_micro_batch_sizes"])
    if len(shares) != dp:
        raise ValueError(
            f"replica_micro_batch_sizes has {len(shares)} entries; data_parallel_degree is {dp}"
        )
    entries = {entry["rank"]: entry for entry in data["rank_map"]}
    stages = []
    for stage in data["stages"]:
        replicas = []
        for d in range(dp):
            ranks = [stage["pipeline_rank"] * dp * tp + d * tp + t for t in range(tp)]
            first = entries.get(ranks[0])
            if first is None:
                raise ValueError(f"rank {ranks[0]} of stage {stage['index']} is not in rank_map")
            replicas.append(
                {
                    "gpu_type": first["gpu_type"],
                    "node": first["node"],
                    "tensor_parallel_degree": tp,
                    "ranks": ranks,
                    "micro_batch_size": shares[d],
                    "recompute": stage["recompute"],
                }
            )
        stages.append(
            {
                "index": stage["index"],
                "pipeline_rank": stage["pipeline_rank"],
                "layer_start": stage["layer_start"],
                "layer_end": stage["layer_end"],
                "replicas": replicas,
                "zero_stage": 1 if par["zero1"] else 0,
            }
        )
    # Version 1 gave each GPU type of a pipeline rank one share and one estimate for it.
    share_of: dict[tuple[int, str], int] = {}
    for stage in stages:
        for replica in stage["replicas"]:
            key = (stage["pipeline_rank"], replica["gpu_type"])
            share_of[key] = max(share_of.get(key, 0), replica["micro_batch_size"])
    memory = [
        {
            **estimate,
            "tensor_parallel_degree": tp,
            "micro_batch_size": share_of.get(
                (estimate["pipeline_rank"], estimate["gpu_type"]), max(shares)
            ),
        }
        for estimate in data["prediction"]["memory"]
    ]
    used: dict[str, int] = {}
    for entry in data["rank_map"]:
        used[entry["gpu_type"]] = used.get(entry["gpu_type"], 0) + 1
    present: dict[str, int] = {}
    for group in data["inputs"]["cluster"]["node_groups"]:
        count = group.get("count", 1) * group["gpus_per_node"]
        present[group["gpu"]] = present.get(group["gpu"], 0) + count
    idle = [
        {
            "gpu_type": gpu,
            "count": total - used.get(gpu, 0),
            "reason": "left unused by a version-1 plan, whose space had one (dp, tp) for "
            "every stage and one GPU type per stage",
        }
        for gpu, total in sorted(present.items())
        if total > used.get(gpu, 0)
    ]
    return {
        **data,
        "schema_version": 2,
        "parallelism": {
            "pipeline_degree": pp,
            "virtual_stages_per_rank": par.get("virtual_stages_per_rank", 1),
            "schedule": par["schedule"],
            "num_micro_batches": par["num_micro_batches"],
            "micro_batch_size": sum(shares),
        },
        "stages": stages,
        "prediction": {**data["prediction"], "memory": memory, "idle_gpus": idle},
    }


def upgrade_plan_data(data: dict[str, Any]) -> dict[str, Any]:
    """The plan ``data`` (parsed JSON) in the current schema version. Raises ValueError (or
    KeyError/TypeError on a malformed file) when it cannot be converted."""
    if data.get("schema_version") == 1:
        try:
            data = _v1_to_v2(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            raise ValueError(
                f"a version-1 plan that cannot be converted ({error!r}); solve it again with "
                "this autoplan: autoplan solve PROFILE --cluster CLUSTER -o PLAN"
            ) from None
    if data.get("schema_version") == 2:
        # Version 3 adds the search's certificate; an older plan has none (it may have been
        # stopped by the time limit: it is not called optimal).
        data = {**data, "schema_version": 3, "search": None}
    if data.get("schema_version") == 3:
        # Version 4 adds Replica.routed_experts, absent (even experts) in version 3.
        data = {**data, "schema_version": 4}
    if data.get("schema_version") == 4:
        # Version 5 adds Replica.context_tokens, absent (equal chunks) in version 4.
        data = {**data, "schema_version": 5}
    if data.get("schema_version") == 5:
        # Version 6 adds Stage.sequence_parallel, absent (the plan's setting) in version 5.
        data = {**data, "schema_version": 6}
    return data
