"""``autoplan profile`` (model → per-layer profile JSON) and ``autoplan models`` (the zoo)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoplan.cli.app import command
from autoplan.files import write_json_model
from autoplan.profile.schema import DType, Profile

__all__ = ["models", "profile"]

_GIB = 1024**3
_DEFAULT_OUTPUT = Path("profile.json")


def _console() -> Console:
    """A console that is wide enough for the tables when output is not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _summary_table(result: Profile) -> Table:
    table = Table(
        title=f"{result.model.name}: seq {result.seq_len}, micro-batch "
        f"{result.micro_batch_size}, {result.dtype}"
    )
    for column in (
        "layer",
        "kind",
        "copies",
        "params",
        "fwd GFLOP",
        "bwd GFLOP",
        "saved MiB",
        "out MiB",
    ):
        table.add_column(column, justify="left" if column in ("layer", "kind") else "right")
    copies = {index: 0 for index in result.profiled_layer_indices}
    for layer in result.layers:
        copies[layer.index if layer.replica_of is None else layer.replica_of] += 1
    for index in result.profiled_layer_indices:
        layer = result.layers[index]
        table.add_row(
            layer.name,
            layer.kind,
            str(copies[index]),
            f"{layer.param_count:,}",
            f"{layer.forward_flops / 1e9:,.1f}",
            f"{layer.backward_flops / 1e9:,.1f}",
            f"{layer.saved_activation_bytes / 2**20:,.1f}",
            f"{layer.output_activation_bytes / 2**20:,.1f}",
        )
    return table


@command("profile")
def profile(
    model: str = typer.Argument(
        ..., help="Zoo name (see `autoplan models`) or 'package.module:factory'."
    ),
    seq: int = typer.Option(..., "--seq", help="Tokens per sample."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Samples per micro-batch."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp32, fp16, bf16 or fp64."),
    measure: bool = typer.Option(
        False, "--measure", help="Also time the real layers on this machine (small models)."
    ),
    all_layers: bool = typer.Option(
        False, "--all-layers", help="Trace every layer, even identical repeats."
    ),
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Profile to write.")
    ] = _DEFAULT_OUTPUT,
    attention: Annotated[
        str,
        typer.Option(
            "--attention",
            help="Attention kernel to trace: flash (fused, as autoplan's runtime runs SDPA) or "
            "math (unfused QKᵀ, softmax over s×s, ·V, as Megatron-LM 2021 ran it).",
        ),
    ] = "flash",
) -> None:
    """Profile a model per layer (FLOPs, bytes, parameters, activations) without allocating it."""
    # torch is imported here, not at module level: `autoplan solve` loads every command module
    # and must start without torch.
    from autoplan.profile.attention import AttentionKernel
    from autoplan.profile.profiler import profile_model

    dtype_name: DType = dtype  # type: ignore[assignment]  # checked by profile_model
    kernel: AttentionKernel = attention  # type: ignore[assignment]  # checked by profile_model
    result = profile_model(
        model,
        seq,
        micro_batch,
        dtype_name,
        measure=measure,
        replicate=not all_layers,
        attention=kernel,
    )
    write_json_model(output, result)
    console = _console()
    console.print(_summary_table(result))
    for note in result.notes:
        console.print(f"note: {note}")
    totals = result.totals
    console.print(
        f"wrote {output}: {len(result.layers)} layers ({len(result.profiled_layer_indices)} "
        f"traced), {totals.param_count:,} parameters, "
        f"{(totals.forward_flops + totals.backward_flops) / 1e12:,.2f} TFLOP per micro-batch, "
        f"{totals.saved_activation_bytes / _GIB:,.2f} GiB saved for backward"
    )


@command("models")
def models() -> None:
    """List the model zoo."""
    from autoplan.zoo.registry import get_model_spec, model_names

    table = Table(title="autoplan model zoo")
    for column in (
        "name",
        "family",
        "parameters",
        "layers",
        "hidden",
        "heads",
        "kv heads",
        "vocab",
        "max seq",
    ):
        table.add_column(column, justify="left" if column in ("name", "family") else "right")
    for name in model_names():
        spec = get_model_spec(name)
        table.add_row(
            name,
            spec.family,
            f"{spec.parameter_count():,}",
            str(spec.num_blocks),
            str(spec.hidden_size),
            str(spec.num_attention_heads),
            str(spec.num_kv_heads),
            str(spec.vocab_size),
            str(spec.max_seq_len),
        )
    _console().print(table)
