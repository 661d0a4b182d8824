"""``autoplan cost``: price a configuration you wrote (a plan file, stage specs or Megatron-style
flags) against a profile and a cluster, with nothing searched."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoplan.cli.app import command, output_console
from autoplan.errors import InputError
from autoplan.files import check_outputs, read_json_model, write_json_model
from autoplan.inputs import (
    catalog_path,
    check_flags,
    cluster_path,
    engine_choice,
    read_cluster,
    read_profile,
)
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.plan.stage_spec import megatron_stage_specs
from autoplan.view import print_document, solve_summary
from autoplan.view.plan_tables import ENGINE_NAMES, plan_precision_warnings
from autoplan.view.units import duration_text

__all__ = ["cost"]


def _split(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise InputError(f"--layer-split must be comma-separated integers; got {value!r}") from None


@command("cost")
def cost(
    plan_path: Annotated[
        Path | None,
        typer.Argument(help="A plan JSON to price (hand-written or edited); or use --stages/--tp."),
    ] = None,
    profile_path: Annotated[
        Path, typer.Option("--profile", "-p", help="Profile JSON from `autoplan profile`.")
    ] = Path("profile.json"),
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            "-c",
            help="Cluster YAML or a shipped example's name (default for a plan: its own).",
        ),
    ] = None,
    stages: Annotated[
        str | None,
        typer.Option(
            "--stages",
            help="Stages as 'TYPES:Lfirst-last:tpT:dpD | ...' (inclusive layers; 'A+B' mixes "
            "types, 'A*2+B*1' says how many replicas each; extras :mbB :full :z1 :offload :sp), "
            "e.g. 'RTX-2080+RTX-3090:L0-11:tp8:dp2 | RTX-2080+Titan-RTX:L12-25:tp8:dp2'.",
        ),
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", help="Megatron-style: tp of every stage.")
    ] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline ranks.")] = None,
    dp: Annotated[
        int | None, typer.Option("--dp", help="Megatron-style: replicas of every stage.")
    ] = None,
    layer_split: Annotated[
        str | None, typer.Option("--layer-split", help="Layers per stage, e.g. '10,12,10'.")
    ] = None,
    gpu_type: Annotated[
        str | None,
        typer.Option(
            "--gpu-type",
            help="Megatron-style: the GPU type of every stage, or one per stage, comma-"
            "separated ('A+B' mixes types in a stage). Needed when the cluster has several.",
        ),
    ] = None,
    micro_batch_size: Annotated[
        int,
        typer.Option(
            "--micro-batch-size",
            help="Samples per micro-batch of EACH replica (Megatron-LM's --micro-batch-size).",
        ),
    ] = 1,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Samples per iteration, all replicas.")
    ] = None,
    num_micro_batches: Annotated[
        int | None, typer.Option("--num-micro-batches", help="Micro-batches per iteration.")
    ] = None,
    schedule: Annotated[
        str,
        typer.Option(
            "--schedule",
            help="gpipe, 1f1b, interleaved_1f1b, interleaved_zero_bubble, zbv or dualpipev.",
        ),
    ] = "1f1b",
    recompute: Annotated[
        str, typer.Option("--recompute", help="none, selective or full (stages that do not say).")
    ] = "none",
    zero: Annotated[
        int, typer.Option("--zero", min=0, max=3, help="ZeRO level (stages that do not say).")
    ] = 0,
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sp/--no-sp",
            help="Sequence parallelism with tp in every stage (':sp' in --stages: one stage).",
        ),
    ] = False,
    catalog: Annotated[
        list[Path] | None,
        typer.Option("--catalog", help="Catalog overlay YAML (repeatable; later files win)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the priced plan here.")
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="Price as this engine runs it: autoplan (`autoplan run`) or "
            "megatron-deepspeed (default: a plan file's own; autoplan for stages).",
        ),
    ] = None,
) -> None:
    """Price a plan file or a configuration you describe: the same prediction, memory and
    validity checks as `solve`'s plans, nothing searched."""
    # PuLP and NumPy come with the solver: imported here, so that `autoplan --help` and the
    # small commands start without them.
    from autoplan.api import price
    from autoplan.solve.options import SolveOptions

    # The bounds the schemas declare, checked with the flags' names.
    check_flags(
        SolveOptions,
        {
            "--tp": ("tp", tp),
            "--pp": ("pp", pp),
            "--dp": ("dp", dp),
            "--micro-batch-size": ("micro_batch_size", micro_batch_size),
        },
    )
    check_flags(PlanInputs, {"--global-batch": ("global_batch_size", global_batch)})
    check_flags(SolveOptions, {"--num-micro-batches": ("num_micro_batches", num_micro_batches)})
    chosen_engine = engine_choice(engine)
    megatron = any(v is not None for v in (tp, dp, layer_split, gpu_type)) or (
        pp is not None and plan_path is None and stages is None
    )
    given = [name for name, on in (("a plan", plan_path), ("--stages", stages)) if on is not None]
    if megatron:
        given.append("--tp/--dp/--layer-split/--gpu-type")
    if len(given) != 1:
        raise InputError(
            "price one configuration: a plan file, --stages, or Megatron-style --tp/--pp/--dp"
            + (f" (got {', '.join(given)})" if given else "")
        )
    cluster_file = cluster_path(cluster) if cluster is not None else None
    inputs = [profile_path, catalog_path(), *(catalog or [])]
    inputs += [p for p in (plan_path, cluster_file) if p is not None]
    check_outputs({"--output": output}, inputs)
    if plan_path is not None:
        flags = (global_batch, num_micro_batches, pp)
        if any(value is not None for value in flags):
            raise InputError("a plan file gives its own batch and pipeline: drop those flags")
        priced = price(
            profile_path,
            None if cluster_file is None else read_cluster(cluster_file),
            plan=read_json_model(plan_path, Plan),
            catalog=catalog or [],
            engine=chosen_engine,
        )
    else:
        if cluster_file is None:
            raise InputError("--cluster is needed to price --stages or --tp/--pp/--dp")
        hardware = read_cluster(cluster_file)
        if stages is None:
            profile = read_profile(profile_path)
            types = sorted({group.gpu for group in hardware.node_groups})
            if gpu_type is None and len(types) > 1:
                raise InputError(
                    f"the cluster has GPU types {', '.join(types)}: say which each stage runs "
                    "on with --gpu-type (one, or one per stage; 'A+B' mixes) or use --stages"
                )
            specs = megatron_stage_specs(
                len(profile.layers),
                tp or 1,
                pp or 1,
                dp or 1,
                gpu_type.split(",") if gpu_type is not None else types,
                _split(layer_split),
            )
            pp = None  # the specs have one stage per pipeline rank
        else:
            specs = stages  # type: ignore[assignment]  # price parses the text
        priced = price(
            profile_path,
            hardware,
            stages=specs,
            global_batch=global_batch,
            num_micro_batches=num_micro_batches,
            micro_batch_size=micro_batch_size,
            schedule=schedule,
            pipeline_degree=pp,
            recompute=recompute,
            zero=zero,
            sequence_parallel=sequence_parallel,
            catalog=catalog or [],
            engine=chosen_engine,
        )
    plan = priced.plan
    console = output_console()
    print_document(console, solve_summary(plan))
    # The other engine's figure where it differs (``autoplan.cost.engines``).
    own_ms = plan.prediction.iteration_time_ms
    for engine, other_ms in priced.iteration_ms_by_engine.items():
        if engine != plan.inputs.engine and abs(other_ms / own_ms - 1) > 1e-3:
            console.print(
                f"as {ENGINE_NAMES[engine]} runs it: {duration_text(other_ms)} per iteration "
                f"(the plan is priced for {ENGINE_NAMES[plan.inputs.engine]}: "
                f"{duration_text(own_ms)})"
            )
    for violation in priced.violations:
        console.print(f"[bold red]does not fit:[/] {violation}")
    if priced.violations:
        console.print(
            "[bold red]warning:[/] the plan does not fit its GPUs' memory: `show` and `run` "
            "refuse it (fewer samples per replica, recompute, ZeRO or more stages may fit)"
        )
    if plan.inputs.dtype == "bf16" and plan_precision_warnings(plan):
        # What the warning costs, for this very plan: the same layers' FLOPs and bytes in
        # fp16, which these GPUs run on tensor cores (the runtime scales the loss).
        half = read_profile(profile_path).model_copy(update={"dtype": "fp16"})
        fp16 = price(half, plan.inputs.cluster, plan=plan).plan.prediction.iteration_time_ms
        bf16 = plan.prediction.iteration_time_ms
        console.print(
            f"[bold red]precision:[/] in fp16 this plan predicts {duration_text(fp16)} per "
            f"iteration instead of {duration_text(bf16)} ({bf16 / fp16:.2f}x faster)"
        )
    if output is not None:
        write_json_model(output, plan)
        console.print(f"wrote {output}")
