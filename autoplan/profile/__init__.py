"""The profiler: a model (zoo name or factory) → per-layer compute, memory and communication.

Tracing runs under ``FakeTensorMode`` so nothing real is allocated; see
:func:`autoplan.profile.profiler.profile_model`. The solve path reads only
:mod:`autoplan.profile.schema`, which must import without torch, so nothing here is imported
eagerly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["profile_model"]


def __getattr__(name: str) -> Any:
    if name == "profile_model":
        from autoplan.profile.profiler import profile_model

        return profile_model
    raise AttributeError(f"module 'autoplan.profile' has no attribute {name!r}")
