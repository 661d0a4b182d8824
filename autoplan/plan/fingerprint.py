"""Which configuration a plan's recorded timings were computed for.

A plan's prediction (stage timings, memory, iteration time) is the cost model's answer for its
stages, batch, cluster and profile. Edit any of those in the file and the timings no longer
describe it: ``costed_sha256`` is a SHA-256 of exactly what they depend on, written by
``emit_plan`` into ``Prediction.costed_sha256``; ``simulate`` compares it with the plan as it
now stands and refuses a plan edited since (``autoplan cost`` prices it again).
"""

from __future__ import annotations

import hashlib
import json

from autoplan.names import printable
from autoplan.plan.schema import Plan

__all__ = ["costed_sha256", "edited_since_costed", "stale_timings_message"]


def costed_sha256(plan: Plan) -> str:
    """SHA-256 of what the plan's prediction depends on: the inputs (profile, cluster, batch,
    dtype; not the strategy or the pinned knobs, which only say how it was found), the
    parallelism and the stages (layer ranges, replicas, shares, recompute, ZeRO)."""
    record = {
        "inputs": plan.inputs.model_dump(mode="json", exclude={"strategy", "pinned"}),
        "parallelism": plan.parallelism.model_dump(mode="json"),
        "stages": [stage.model_dump(mode="json") for stage in plan.stages],
    }
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def edited_since_costed(plan: Plan) -> bool:
    """True when the plan records the fingerprint of its costing and it no longer matches
    (plans written before the fingerprint existed are taken as they are)."""
    recorded = plan.prediction.costed_sha256
    return recorded is not None and recorded != costed_sha256(plan)


def stale_timings_message(path: str) -> str:
    """What ``simulate`` and ``validate`` say of a plan edited since it was costed."""
    return (
        f"{printable(path)}: its recorded timings were computed for another configuration "
        "(its stages, batch, cluster or inputs were edited since); price it first: "
        f"autoplan cost {printable(path)} --profile PROFILE -o PRICED.json"
    )
