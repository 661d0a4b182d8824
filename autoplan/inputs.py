"""The one input layer under the CLI and the Python API: profiles, clusters and plans read and
checked here, the cluster path-or-name rule written once, flags' bounds checked one way.

``autoplan.api`` and every command module read their inputs through these functions, so that
``show``, ``simulate``, ``compare``, ``launch``, ``run`` and ``api.simulate`` refuse exactly what
``autoplan validate`` refuses, and ``--cluster a100-v100`` means what ``api.solve(...,
"a100-v100", ...)`` means.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import cast, get_args

import annotated_types
from pydantic import BaseModel

from autoplan.checks import all_plan_problems, model_name_syntax_problem
from autoplan.cluster.catalog import (
    example_cluster_path,
    load_cluster,
    load_overlay,
    profiles_dir,
    with_overlay,
)
from autoplan.cluster.schema import Cluster
from autoplan.errors import InputError, PlanInvalidError
from autoplan.files import read_json_model
from autoplan.names import printable, shown
from autoplan.plan.schema import Engine, Plan
from autoplan.profile.schema import Profile

__all__ = [
    "PathLike",
    "catalog_path",
    "check_bounds",
    "check_flags",
    "checked_plan",
    "cluster_path",
    "engine_choice",
    "read_cluster",
    "read_plan",
    "read_profile",
    "safe_host",
]

PathLike = str | Path

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}")


def checked_plan(plan: Plan, source: str | None = None) -> Plan:
    """``plan`` if it breaks none of the validator's rules; PlanInvalidError otherwise, with
    every problem in ``problems`` (its line: the first, named after the file ``source``, or
    all of them numbered for a plan read from no file)."""
    problems = all_plan_problems(plan)
    if problems:
        raise PlanInvalidError(problems, None if source is None else printable(source))
    return plan


def read_plan(path: PathLike) -> Plan:
    """The plan at ``path``, read and checked (``checked_plan``)."""
    return checked_plan(read_json_model(path, Plan), str(path))


def read_profile(path: PathLike) -> Profile:
    """The profile at ``path``, read and its model name checked (by syntax: nothing imported)."""
    profile = read_json_model(path, Profile)
    problem = model_name_syntax_problem(profile.model.name)
    if problem is not None:
        raise InputError(f"{printable(str(path))}: {problem}")
    return profile


def cluster_path(value: PathLike) -> Path:
    """A cluster file: a path (an existing file, or a value with '/' or a YAML suffix), else
    the shipped example of that name (InputError naming the examples when there is none)."""
    path = Path(value)
    if path.is_file() or path.suffix in (".yaml", ".yml") or "/" in str(value):
        return path
    return example_cluster_path(str(value))


def read_cluster(value: Cluster | PathLike, catalogs: Sequence[PathLike] = ()) -> Cluster:
    """A cluster (as given, or read from ``cluster_path(value)``, its GPU types checked) with
    the catalog overlays ``catalogs`` applied in order."""
    cluster = value if isinstance(value, Cluster) else load_cluster(cluster_path(value))
    for overlay in catalogs:
        cluster = with_overlay(cluster, load_overlay(overlay))
    return cluster


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


def check_flags(model: type[BaseModel], flags: dict[str, tuple[str, float | None]]) -> None:
    """Each ``flag: (field, value)`` within the bounds ``model`` declares for ``field`` (its
    ``ge``/``gt`` and ``le``): a bound is written once, in the schema, and a command's error
    names its flag. None: not given; NaN is refused."""
    for flag, (name, value) in flags.items():
        if value is None:
            continue
        if value != value:  # NaN compares unequal to itself
            raise InputError(f"{flag} must be a number, got {value}")
        low: float | None = None
        high: float | None = None
        exclusive = False  # gt rather than ge
        # The schemas' numeric bounds (annotated_types types them as any comparable).
        for bound in model.model_fields[name].metadata:
            if isinstance(bound, annotated_types.Ge) and isinstance(bound.ge, int | float):
                low = bound.ge
            elif isinstance(bound, annotated_types.Gt) and isinstance(bound.gt, int | float):
                low, exclusive = bound.gt, True
            elif isinstance(bound, annotated_types.Le) and isinstance(bound.le, int | float):
                high = bound.le
        if low is not None and exclusive and value <= low:
            raise InputError(f"{flag} must be more than {_number(low)}, got {value}")
        if low is not None and not exclusive and value < low:
            raise InputError(f"{flag} must be at least {_number(low)}, got {value}")
        if high is not None and value > high:
            raise InputError(f"{flag} {value} exceeds the maximum, {_number(high)}")


def engine_choice(text: str | None) -> Engine | None:
    """An ``--engine`` flag as the schema's name (None: not given); one line otherwise."""
    if text is None:
        return None
    names = get_args(Engine)
    if text not in names:
        raise InputError(f"--engine must be one of {', '.join(names)}; got {text!r}")
    return cast(Engine, text)
