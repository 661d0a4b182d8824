"""The GPU catalog (``profiles/gpus.yaml``) and cluster files checked against it.

A cluster names its GPUs by type; a type is either a catalog entry or one the cluster file
defines itself under ``gpu_types`` (which wins over the catalog entry of the same name, so a
cluster can re-rate a GPU it has measured).

What peak to use for a dtype the GPU has no entry for (``peak_tflops``): the GPU has no tensor
cores for that dtype, so its matmuls run on the plain FP32 units at best. ``bf16``, ``tf32`` and
``fp16`` therefore fall back to the ``fp32`` peak (bf16 on a V100 is not faster than fp32);
``fp32`` itself and ``fp64`` have no fallback and raise InputError.

What efficiency to use (``efficiency_for``): a GPU's ``efficiency`` is the ceiling of its
matmul efficiency in 16-bit training; ``efficiency_by_dtype`` holds ceilings fitted for other
dtypes (the calibration data ran in fp32/tf32). A dtype without its own figure uses the figure
of the dtype whose peak stands in for it, else ``efficiency``. The efficiency curve's
half-intensity resolves the same way (``half_intensity_for``); ``spec_for_dtype`` resolves
both, once per cost model.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan.cluster.schema import Cluster, GpuSpec
from autoplan.errors import InputError
from autoplan.files import read_yaml_model

__all__ = [
    "CATALOG_SCHEMA_VERSION",
    "REQUIRED_DTYPES",
    "CatalogOverlay",
    "GpuCatalog",
    "efficiency_for",
    "example_cluster_path",
    "gpu_specs",
    "half_intensity_for",
    "load_catalog",
    "load_cluster",
    "load_overlay",
    "peak_tflops",
    "precision_warnings",
    "profiles_dir",
    "spec_for_dtype",
    "tensor_core_problem",
    "with_overlay",
]

CATALOG_SCHEMA_VERSION = 1

# Every catalog entry must state these; bf16/tf32 are absent where no tensor core runs them.
REQUIRED_DTYPES = ("fp32", "fp16", "fp64")

# A dtype the GPU lists no peak for → the dtype whose peak stands in for it (see module doc).
_FALLBACK_DTYPE = {"bf16": "fp32", "tf32": "fp32", "fp16": "fp32"}


class GpuCatalog(BaseModel):
    """The catalog file: a list of GPU types with unique names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=CATALOG_SCHEMA_VERSION, description="Version of the file.")
    gpus: list[GpuSpec] = Field(min_length=1, description="GPU types, datasheet figures.")

    @model_validator(mode="after")
    def _check(self) -> GpuCatalog:
        names = [gpu.name for gpu in self.gpus]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"GPU names must be unique; repeated: {repeated}")
        for gpu in self.gpus:
            missing = [dtype for dtype in REQUIRED_DTYPES if dtype not in gpu.peak_tflops]
            if missing:
                raise ValueError(f"GPU {gpu.name} lists no peak_tflops for {missing}")
        return self


def profiles_dir() -> Path:
    """The shipped ``profiles/`` folder (catalog, example clusters).

    It is installed as the top-level package ``profiles`` next to ``autoplan``; in a source
    checkout it is the sibling folder of ``autoplan/``. The sibling path is tried first because
    it is right in both layouts; importlib.resources covers any other installer layout.
    """
    sibling = Path(__file__).resolve().parents[2] / "profiles"
    if (sibling / "gpus.yaml").is_file():
        return sibling
    try:
        located = Path(str(importlib.resources.files("profiles")))
    except ModuleNotFoundError:
        located = sibling
    if not (located / "gpus.yaml").is_file():
        raise InputError(f"cannot find autoplan's GPU catalog (looked in {sibling}, {located})")
    return located


def example_cluster_path(name: str) -> Path:
    """Path of a shipped example cluster, e.g. ``example_cluster_path('a100x8')``."""
    folder = profiles_dir() / "clusters"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"
        raise InputError(f"no example cluster '{name}'; {hint}")
    return path


@functools.cache
def _catalog_from(path: Path) -> dict[str, GpuSpec]:
    catalog = read_yaml_model(path, GpuCatalog, shipped=True)
    return {gpu.name: gpu for gpu in catalog.gpus}


def load_catalog() -> dict[str, GpuSpec]:
    """The shipped GPU catalog, by name (a fresh dict; the specs themselves are frozen)."""
    return dict(_catalog_from(profiles_dir() / "gpus.yaml"))


def gpu_specs(cluster: Cluster) -> dict[str, GpuSpec]:
    """Every GPU type the cluster may use: the catalog, overridden and extended by the
    cluster file's own ``gpu_types`` (``with_overlay`` puts a catalog overlay's there); the
    cluster's ``memory_reserve_gib``, where set, replaces every type's."""
    specs = load_catalog()
    specs.update({gpu.name: gpu for gpu in cluster.gpu_types})
    if cluster.memory_reserve_gib is not None:
        specs = {
            name: spec.model_copy(update={"memory_reserve_gib": cluster.memory_reserve_gib})
            for name, spec in specs.items()
        }
    return specs


class CatalogOverlay(BaseModel):
    """GPU types that replace the catalog's entries of the same name (or add new ones) for a
    solve: what ``autoplan calibrate`` writes and ``autoplan solve --catalog`` reads. Each
    entry is a whole GpuSpec, so the file says everything the cost model will use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=CATALOG_SCHEMA_VERSION, description="Version of the file.")
    source: str = Field(default="", description="Where the figures come from (e.g. run reports).")
    gpu_types: list[GpuSpec] = Field(min_length=1, description="Whole GPU type entries.")


def load_overlay(path: str | Path) -> list[GpuSpec]:
    """The GPU types of a catalog overlay file (``CatalogOverlay``)."""
    return list(read_yaml_model(path, CatalogOverlay).gpu_types)


def with_overlay(cluster: Cluster, overlay: list[GpuSpec]) -> Cluster:
    """``cluster`` with the overlay's GPU types among its own ``gpu_types``, replacing the
    catalog's entries and the file's own of the same name (an overlay asked for on the command
    line is the more specific: e.g. fitted on this cluster's run). The plan records the
    cluster, so a plan solved with an overlay carries the figures it used."""
    replaced = {gpu.name for gpu in overlay}
    kept = [gpu for gpu in cluster.gpu_types if gpu.name not in replaced]
    return cluster.model_copy(update={"gpu_types": [*kept, *overlay]})


def _check_gpu_types(cluster: Cluster, where: str) -> None:
    specs = gpu_specs(cluster)
    for group in cluster.node_groups:
        if group.gpu in specs:
            continue
        close = difflib.get_close_matches(group.gpu, sorted(specs), n=3, cutoff=0.3)
        hint = (
            f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(specs))}"
        )
        raise InputError(
            f"{where}: node group '{group.name}' uses unknown GPU type '{group.gpu}' (not in the "
            f"catalog or the file's gpu_types); {hint}"
        )


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster YAML file and check that every GPU type it uses is known.

    Raises InputError (one line) for a missing or malformed file or an unknown GPU type,
    offering the nearest known type names.
    """
    cluster = read_yaml_model(path, Cluster)
    _check_gpu_types(cluster, str(path))
    return cluster


def peak_tflops(gpu: GpuSpec, dtype: str) -> float:
    """Dense peak TFLOP/s of ``gpu`` for matmuls in ``dtype``.

    A dtype the GPU lists no figure for runs without tensor cores: bf16, tf32 and fp16 fall
    back to the fp32 peak (module docstring). A missing fp32 or fp64 raises InputError.
    """
    if dtype in gpu.peak_tflops:
        return gpu.peak_tflops[dtype]
    fallback = _FALLBACK_DTYPE.get(dtype)
    if fallback is not None and fallback in gpu.peak_tflops:
        return gpu.peak_tflops[fallback]
    raise InputError(
        f"GPU type {gpu.name} has no peak_tflops for dtype '{dtype}' "
        f"(it lists {', '.join(sorted(gpu.peak_tflops))})"
    )


def tensor_core_problem(gpu: GpuSpec, dtype: str) -> str | None:
    """What 16-bit training in ``dtype`` costs on ``gpu`` when it has no tensor cores for it
    (its matmuls run at the fp32 peak: bf16 before Ampere), and the 16-bit dtype it does run
    fast; None when it has them (or ``dtype`` is not bf16 or fp16)."""
    # tf32 falling back to fp32 is fp32 training, as asked: only 16-bit training loses here.
    if dtype not in ("bf16", "fp16") or dtype in gpu.peak_tflops:
        return None
    slow = peak_tflops(gpu, dtype)
    faster = [d for d in ("bf16", "fp16") if d in gpu.peak_tflops and d != dtype]
    text = (
        f"{gpu.name} has no {dtype} tensor cores: its {dtype} matmuls run at the fp32 peak "
        f"({slow:g} TFLOP/s)"
    )
    if not faster:
        return text
    best = max(faster, key=lambda d: gpu.peak_tflops[d])
    ratio = gpu.peak_tflops[best] / slow
    return (
        f"{text}, {ratio:.1f}x below its {best} peak ({gpu.peak_tflops[best]:g}); train in "
        f"{best} on it (autoplan profile --dtype {best}"
        + ("; the runtime scales the loss)" if best == "fp16" else ")")
    )


def precision_warnings(cluster: Cluster, dtype: str, gpu_types: list[str]) -> list[str]:
    """``tensor_core_problem`` of each of ``gpu_types`` (those a plan uses) in ``dtype``."""
    specs = gpu_specs(cluster)
    out = []
    for name in dict.fromkeys(gpu_types):
        spec = specs.get(name)
        problem = None if spec is None else tensor_core_problem(spec, dtype)
        if problem is not None:
            out.append(problem)
    return out


def half_intensity_for(gpu: GpuSpec, dtype: str) -> float:
    """``matmul_half_intensity_ridges`` for ``dtype``: its own figure where the catalog has
    one (``matmul_half_intensity_by_dtype``), else that of the dtype whose peak stands in for
    it, else the default."""
    if dtype in gpu.matmul_half_intensity_by_dtype:
        return gpu.matmul_half_intensity_by_dtype[dtype]
    fallback = _FALLBACK_DTYPE.get(dtype)
    if dtype not in gpu.peak_tflops and fallback in gpu.matmul_half_intensity_by_dtype:
        return gpu.matmul_half_intensity_by_dtype[fallback]
    return gpu.matmul_half_intensity_ridges


def spec_for_dtype(gpu: GpuSpec, dtype: str, efficiency: float | None = None) -> GpuSpec:
    """``gpu`` with its dtype-dependent figures resolved for ``dtype`` (``efficiency`` and
    ``matmul_half_intensity_ridges``), so that a cost model reads one of each;
    ``efficiency`` overrides the catalog's."""
    return gpu.model_copy(
        update={
            "efficiency": efficiency_for(gpu, dtype) if efficiency is None else efficiency,
            "matmul_half_intensity_ridges": half_intensity_for(gpu, dtype),
        }
    )


def efficiency_for(gpu: GpuSpec, dtype: str) -> float:
    """Fraction of ``peak_tflops(gpu, dtype)`` that training achieves (module docstring)."""
    if dtype in gpu.efficiency_by_dtype:
        return gpu.efficiency_by_dtype[dtype]
    if dtype not in gpu.peak_tflops:
        fallback = _FALLBACK_DTYPE.get(dtype)
        if fallback in gpu.efficiency_by_dtype:
            return gpu.efficiency_by_dtype[fallback]
    return gpu.efficiency
