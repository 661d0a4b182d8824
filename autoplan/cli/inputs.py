"""How commands take their inputs: every plan checked before it is used, clusters by name or
path, and no code a plan names run without the user's word.

Shared by every command module, so that ``show``, ``simulate``, ``compare``, ``launch`` and
``run`` refuse exactly what ``autoplan validate`` refuses (with its first problem).
"""

from __future__ import annotations

import re
from pathlib import Path

from autoplan.checks import (
    all_plan_problems,
    check_factory_trust,
    model_name_syntax_problem,
)
from autoplan.cluster.catalog import example_cluster_path, profiles_dir
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.names import printable, shown
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile

__all__ = [
    "catalog_path",
    "check_bounds",
    "check_factory_trust",
    "cluster_path",
    "read_plan",
    "read_profile",
    "safe_host",
]

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}")


def read_plan(path: Path) -> Plan:
    """The plan at ``path``, read and checked; InputError with its first problem otherwise."""
    plan = read_json_model(path, Plan)
    problems = all_plan_problems(plan)
    if problems:
        more = (
            f" (and {len(problems) - 1} more: autoplan validate lists them)"
            if len(problems) > 1
            else ""
        )
        raise InputError(f"{printable(str(path))}: invalid plan: {problems[0]}{more}")
    return plan


def read_profile(path: Path) -> Profile:
    """The profile at ``path``, read and its model name checked (by syntax: nothing imported)."""
    profile = read_json_model(path, Profile)
    problem = model_name_syntax_problem(profile.model.name)
    if problem is not None:
        raise InputError(f"{printable(str(path))}: {problem}")
    return profile


def cluster_path(value: str) -> Path:
    """A cluster file: a path (it has '/' or a YAML suffix, or exists), else a shipped
    example's name."""
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in value:
        return path
    return example_cluster_path(value)


def catalog_path() -> Path:
    """The GPU catalog every command that reads a cluster reads too."""
    return profiles_dir() / "gpus.yaml"


def safe_host(value: str, what: str = "--master-addr") -> str:
    """``value`` if it is a host name or IP address (letters, digits, '.', ':', '-', '_')."""
    if _HOST.fullmatch(value) is None:
        raise InputError(f"{what} {shown(value)} is not a host name or IP address")
    return value


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def check_bounds(values: dict[str, tuple[float | None, float, float]]) -> None:
    """Each ``flag: (value, low, high)`` within ``[low, high]`` (None: not given); one
    InputError line naming the first flag that is not, NaN included."""
    for flag, (value, low, high) in values.items():
        if value is None:
            continue
        if value != value:  # NaN compares unequal to itself
            raise InputError(f"{flag} must be a number, got {value}")
        if value < low:
            raise InputError(f"{flag} must be at least {_number(low)}, got {value}")
        if value > high:
            raise InputError(f"{flag} {value} exceeds the maximum, {_number(high)}")
