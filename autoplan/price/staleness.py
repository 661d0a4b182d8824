"""Do a plan's recorded timings still follow from its profile? Price it again and compare.

``autoplan validate --profile`` and ``autoplan simulate --profile`` use it: a plan whose stage
times or iteration time differ from what the cost model gives for its own stages on that
profile was edited, solved on another profile, or made by an older cost model, and playing or
trusting its old figures would mislead.
"""

from __future__ import annotations

from autoplan.plan.schema import Plan
from autoplan.price.configuration import price_configuration
from autoplan.profile.schema import Profile

__all__ = ["timing_mismatch"]

# The plan rounds its figures (emit._round: six decimals or six significant digits).
_TOLERANCE = 1e-5


def _differs(recorded: float, computed: float) -> bool:
    return abs(recorded - computed) > _TOLERANCE * max(abs(recorded), abs(computed), 1e-9)


def timing_mismatch(plan: Plan, profile: Profile) -> str | None:
    """The first recorded figure of ``plan`` that pricing it on ``profile`` (its own cluster
    as recorded) does not reproduce, as a phrase; None when every one matches."""
    fresh = price_configuration(profile, None, plan=plan).plan.prediction
    old = plan.prediction
    pairs = [("iteration time", old.iteration_time_ms, fresh.iteration_time_ms)]
    for was, now in zip(old.stage_timings, fresh.stage_timings, strict=True):
        for name in ("forward_ms", "backward_ms", "send_ms"):
            label = f"stage {was.stage} {name.removesuffix('_ms')}"
            pairs.append((label, getattr(was, name), getattr(now, name)))
    for label, recorded, computed in pairs:
        if _differs(recorded, computed):
            return f"{label} {recorded:.6g} ms recorded, {computed:.6g} ms from the profile"
    return None
