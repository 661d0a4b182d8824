"""``autoplan gpus`` and ``autoplan clusters``: the GPU catalog and the shipped example clusters."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from autoplan.cli.app import command, output_console
from autoplan.cluster.catalog import gpu_specs, load_catalog, load_cluster, profiles_dir

__all__ = ["clusters", "gpus"]

# fp8 is shown where the datasheet gives it; no training dtype uses it yet.
_DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")


@command("gpus")
def gpus(
    urls: Annotated[bool, typer.Option("--urls", help="Also print each datasheet URL.")] = False,
) -> None:
    """List the GPU types of the catalog (dense peaks, TFLOP/s) and their efficiencies."""
    table = Table(title=f"GPU catalog ({profiles_dir() / 'gpus.yaml'})")
    table.add_column("type")
    table.add_column("memory GiB", justify="right")
    table.add_column("mem GB/s", justify="right")
    for dtype in _DTYPES:
        table.add_column(dtype, justify="right")
    table.add_column("efficiency", justify="right")
    table.add_column("measured")
    if urls:
        table.add_column("datasheet")
    for gpu in load_catalog().values():
        peaks = [f"{gpu.peak_tflops[d]:g}" if d in gpu.peak_tflops else "-" for d in _DTYPES]
        measured = ", ".join(f"{d} {e:g}" for d, e in sorted(gpu.efficiency_by_dtype.items()))
        row = [gpu.name, f"{gpu.memory_gib:g}", f"{gpu.memory_bandwidth_gb_per_s:g}", *peaks]
        row += [f"{gpu.efficiency:g}", measured]
        table.add_row(*row, *([gpu.datasheet_url] if urls else []))
    output_console(width=160).print(table)


@command("clusters")
def clusters() -> None:
    """List the example cluster files shipped with autoplan (use them with --cluster)."""
    table = Table(title=f"example clusters ({profiles_dir() / 'clusters'})")
    table.add_column("file")
    table.add_column("GPUs", justify="right")
    table.add_column("nodes", justify="right")
    table.add_column("node groups (GPU type × GPUs per node × nodes)")
    for path in sorted((profiles_dir() / "clusters").glob("*.yaml")):
        cluster = load_cluster(path)
        specs = gpu_specs(cluster)
        groups = ", ".join(
            f"{g.name}: {g.gpu} ({specs[g.gpu].memory_gib:g} GiB) × {g.gpus_per_node} × {g.count}"
            for g in cluster.node_groups
        )
        table.add_row(path.name, str(cluster.total_gpus()), str(len(cluster.nodes())), groups)
    output_console(width=160).print(table)
