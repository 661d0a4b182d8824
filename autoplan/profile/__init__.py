"""The profiler: a model (zoo name or factory) → per-layer compute, memory and communication.

Tracing runs under ``FakeTensorMode`` so nothing real is allocated; see
:func:`autoplan.profile.profiler.profile_model`.
"""

from autoplan.profile.profiler import profile_model

__all__ = ["profile_model"]
