"""``autoplan profile`` (model → per-layer profile JSON), ``autoplan profile import`` (measured
tables → a profile's measured times) and ``autoplan models`` (the zoo)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table
from typer import _click
from typer.core import TyperCommand

from autoplan.cli.app import EXIT_BAD_INPUT, command, output_console
from autoplan.errors import AutoplanError, InputError
from autoplan.files import check_outputs, read_json_model, write_json_model
from autoplan.inputs import check_flags
from autoplan.limits import GIB
from autoplan.profile.schema import DType, Granularity, Profile

__all__ = ["models", "profile", "profile_import"]

_DEFAULT_OUTPUT = Path("profile.json")


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


_import_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


class _ProfileCommand(TyperCommand):
    """``autoplan profile MODEL ...``; ``autoplan profile import ...`` goes to the import
    command (a command cannot also be a group with a positional argument in front)."""

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        if args[:1] == ["import"]:
            importer = typer.main.get_command(_import_app)
            # Not standalone: usage errors propagate to the outer command; an exit returns
            # its code.
            code = importer.main(
                args=args[1:], prog_name=f"{ctx.command_path} import", standalone_mode=False
            )
            ctx.exit(code if isinstance(code, int) else 0)
        return super().parse_args(ctx, args)


def _gpu_names(values: list[str]) -> dict[str, str]:
    names = {}
    for item in values:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise InputError(f"--gpu-name takes TABLE_NAME=GPU_TYPE; got '{item}'")
        names[old] = new
    return names


@_import_app.command()
def profile_import(
    table: Annotated[Path, typer.Argument(help="Measured table, CSV or JSON.")],
    profile_path: Annotated[
        Path, typer.Option("--profile", "-p", help="Profile to attach the times to.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile to write.")],
    model: Annotated[
        str | None, typer.Option("--model", help="Keep only this model's rows (model column).")
    ] = None,
    gpu_name: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu-name", help="TABLE_NAME=GPU_TYPE, e.g. A100-40=A100-40GB (repeatable)."
        ),
    ] = None,
) -> None:
    """Attach measured per-layer times (per GPU type, tp, micro-batch size) to a profile."""
    from autoplan.profile.measured_table import attach, read_table

    try:
        rows = read_table(table, model=model, gpu_names=_gpu_names(gpu_name or []))
        base = read_json_model(profile_path, Profile)
        result = attach(base, rows, source=str(table))
        write_json_model(output, result)
    except (AutoplanError, ValidationError) as error:
        typer.echo(f"error: {' '.join(str(error).split())}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    layers_of: dict[tuple[str, int, int], set[str]] = {}
    for row in rows:
        layers_of.setdefault((row.gpu, row.tp, row.micro_batch), set()).add(row.layer)
    summary = Table(title=f"{table} → {output}")
    for column in ("gpu", "tp", "micro-batch", "layers"):
        summary.add_column(column, justify="left" if column == "gpu" else "right")
    for (gpu, tp, micro_batch), layers in sorted(layers_of.items()):
        summary.add_row(gpu, str(tp), str(micro_batch), f"{len(layers)}/{len(result.layers)}")
    console = output_console(width=160)
    console.print(summary)
    console.print(
        f"wrote {output}: {len(rows)} measured layer times attached to {result.model.name}; "
        "the cost model uses them for GPU types whose name matches, at their tp, and "
        "interpolates between micro-batch sizes"
    )


def _module_paths(value: str | None) -> list[str] | None:
    """``--layer-modules``: comma-separated module paths (None when not given)."""
    if value is None:
        return None
    paths = [path.strip() for path in value.split(",")]
    if not all(paths):
        raise InputError(f"--layer-modules takes module paths separated by commas, got {value!r}")
    return paths


@command("profile", cls=_ProfileCommand)
def profile(
    model: str = typer.Argument(
        ...,
        help="Zoo name (see `autoplan models`), a Hugging Face config 'hf:PATH/config.json' "
        "or 'hf:FOLDER', or 'package.module:factory'.",
    ),
    seq: int = typer.Option(..., "--seq", help="Tokens per sample."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Samples per micro-batch."),
    dtype: str = typer.Option(
        "bf16", "--dtype", help="bf16, fp16, tf32 (fp32 storage, TF32 matmuls), fp32 or fp64."
    ),
    measure: bool = typer.Option(
        False, "--measure", help="Also time the real layers on this machine (small models)."
    ),
    table: Annotated[
        Path | None,
        typer.Option(
            "--table", help="With --measure: also write the times as a measured table (CSV)."
        ),
    ] = None,
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
    granularity: Annotated[
        str,
        typer.Option(
            "--granularity",
            help="Unit of partition: block (whole transformer blocks) or sub-block (each "
            "block's attention and MLP parts apart, so stages may start or end mid-block).",
        ),
    ] = "block",
    layer_modules: Annotated[
        str | None,
        typer.Option(
            "--layer-modules",
            help="A factory model's pipeline layers, by module path, comma-separated (as "
            "torch.distributed.pipelining's split points name them; a ModuleList stands for "
            "its entries), e.g. 'model.layers'; the modules its forward runs around them "
            "(embedding, norm, head) are layers too. Default: the entries of its largest "
            "ModuleList of one module type.",
        ),
    ] = None,
    tp_divisor: Annotated[
        int | None,
        typer.Option(
            "--tp-divisor",
            min=1,
            help="A factory model's tensor-parallel limit: what every tp degree must divide "
            "(the gcd of its heads, kv heads and MLP size). Without it a factory model is "
            "profiled without a tensor-parallel split (tp 1 only); zoo and hf: models know "
            "their own.",
        ),
    ] = None,
) -> None:
    """Profile a model per layer (FLOPs, bytes, parameters, activations) without allocating it.

    `autoplan profile import TABLE --profile P -o OUT` attaches measured per-layer times.
    """
    check_flags(
        Profile, {"--seq": ("seq_len", seq), "--micro-batch": ("micro_batch_size", micro_batch)}
    )
    check_outputs({"--output": output})
    # torch is imported here, not at module level: `autoplan solve` loads every command module
    # and must start without torch.
    from autoplan.profile.attention import AttentionKernel
    from autoplan.profile.profiler import profile_model

    dtype_name: DType = dtype  # type: ignore[assignment]  # checked by profile_model
    kernel: AttentionKernel = attention  # type: ignore[assignment]  # checked by profile_model
    if granularity not in ("block", "sub-block"):
        raise InputError(f"--granularity must be block or sub-block, got {granularity!r}")
    grain: Granularity = granularity  # type: ignore[assignment]  # checked just above
    result = profile_model(
        model,
        seq,
        micro_batch,
        dtype_name,
        measure=measure,
        replicate=not all_layers,
        attention=kernel,
        granularity=grain,
        layer_modules=_module_paths(layer_modules),
        tensor_parallel_divisor=tp_divisor,
    )
    if table is not None and not measure:
        raise InputError("--table writes measured times: add --measure")
    write_json_model(output, result)
    console = output_console(width=160)
    console.print(_summary_table(result))
    if table is not None:
        from autoplan.profile.measured_table import table_rows, write_table

        write_table(table, table_rows(result))
        console.print(f"wrote {table}: the measured times as a table (autoplan profile import)")
    for note in result.notes:
        console.print(f"note: {note}")
    totals = result.totals
    active = result.model.active_parameter_count
    console.print(
        f"wrote {output}: {len(result.layers)} layers ({len(result.profiled_layer_indices)} "
        f"traced), {totals.param_count:,} parameters"
        f"{'' if active is None else f' ({active:,} active per token)'}, "
        f"{(totals.forward_flops + totals.backward_flops) / 1e12:,.2f} TFLOP per micro-batch, "
        f"{totals.saved_activation_bytes / GIB:,.2f} GiB saved for backward"
    )


@command("models")
def models() -> None:
    """List the model zoo."""
    # The rows come from the user's cache when the zoo is unchanged: no torch to import.
    from autoplan.cli.zoo_table import ZOO_COLUMNS, zoo_rows

    table = Table(title="autoplan model zoo")
    for column in ZOO_COLUMNS:
        table.add_column(column, justify="left" if column in ("name", "family") else "right")
    for row in zoo_rows():
        table.add_row(*row)
    output_console(width=160).print(table)
