"""autoplan from Python: profile → solve → simulate, and sweeps over cluster sizes.

The stable interface for notebooks and scripts; the modules behind it (``autoplan.profile``,
``autoplan.solve``, ``autoplan.simulate``, ``autoplan.sweep``) may change between releases,
these functions and their keywords keep their meaning::

    from autoplan import api

    profile = api.profile("llama2-7b", seq_len=4096)  # traced on fake tensors: seconds, no GPU
    plan = api.solve(profile, "a100-v100", global_batch=128, time_limit_s=30)
    plan.prediction.tokens_per_s, plan.prediction.mfu
    result = api.simulate(plan)  # event by event, per replica
    mine = api.cost_plan(profile, "a100-v100", global_batch=128,  # price a config you wrote
                         stages="A100-80GB:L0-15:tp4:dp2 | V100-32GB:L16-33:tp4:dp2",
                         micro_batch_size=2)
    rows = api.sweep(profile, "a100-v100", nodes=[2, 4, 8], global_batch=128,
                     prices={"A100-80GB": 1.8, "V100-32GB": 0.9})
    api.save(plan, "plan.json")  # the file `autoplan show / run / launch` read

Each step takes the previous one's result or a path to the file the CLI writes (a profile or
plan JSON); a cluster is a ``Cluster``, a cluster YAML path or a shipped example's name
(``autoplan clusters``). Results are pydantic models (``model_dump()`` gives plain data, e.g.
for ``pandas.DataFrame([row.model_dump() for row in rows])``).

Errors are ``autoplan.errors.AutoplanError``: ``InputError`` for input that cannot be used
(a bad path, file, option or size), ``InfeasibleError`` when no plan exists (its message names
the binding constraint), ``PlanInvalidError`` for a plan that breaks the validator's rules;
their messages are the lines the CLI prints. Only ``profile`` imports torch, when called.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autoplan import inputs
from autoplan.checks import simulation_size_problem
from autoplan.cluster.schema import Cluster
from autoplan.errors import InputError
from autoplan.files import atomic_output, file_sha256, read_json_model, write_json_model
from autoplan.plan.fingerprint import edited_since_costed, stale_timings_message
from autoplan.plan.schema import Engine, Plan
from autoplan.plan.stage_spec import StageSpec
from autoplan.price.configuration import PipelineKnobs, Priced, price_configuration
from autoplan.profile.schema import DType, Profile
from autoplan.simulate import SimulationResult, simulate_plan
from autoplan.solve import SolveOptions
from autoplan.solve import solve as _solve
from autoplan.sweep import DEFAULT_TRAIN_TOKENS, SweepRow, run_sweep
from autoplan.sweep.csv_file import write_sweep_csv

__all__ = [
    "Cluster",
    "Plan",
    "Priced",
    "Profile",
    "SimulationResult",
    "SolveOptions",
    "SweepRow",
    "cost_plan",
    "load_cluster",
    "load_plan",
    "load_profile",
    "price",
    "profile",
    "save",
    "save_sweep",
    "simulate",
    "solve",
    "sweep",
]

PathLike = inputs.PathLike

# A sweep solves many configurations: a shorter default limit per solve than solve's 60 s.
_SWEEP_TIME_LIMIT_S = 20.0


def profile(
    model: str,
    seq_len: int,
    micro_batch_size: int = 1,
    dtype: DType = "bf16",
    *,
    measure: bool = False,
    attention: str = "flash",
    all_layers: bool = False,
) -> Profile:
    """Profile ``model`` (a zoo name, see ``autoplan models``, or 'package.module:factory')
    per layer at ``seq_len`` tokens per sample, as ``autoplan profile`` does.

    ``attention``: 'flash' (fused, as the runtime runs it) or 'math' (unfused, as Megatron-LM
    2021 ran it); ``measure`` also times the real layers on this machine (small models only);
    ``all_layers`` traces identical repeated blocks too instead of copying the first."""
    # torch is imported here only: everything else in this module runs without it.
    from autoplan.profile.profiler import profile_model

    return profile_model(
        model,
        seq_len,
        micro_batch_size,
        dtype,
        measure=measure,
        replicate=not all_layers,
        attention=attention,  # type: ignore[arg-type]  # checked by profile_model
    )


# The CLI's input layer, under the API's names: a profile JSON (its model name checked); a
# cluster as it is, read from a YAML path or a shipped example by name; a plan JSON checked as
# every command checks it (PlanInvalidError lists its problems).
load_profile = inputs.read_profile
load_cluster = inputs.read_cluster
load_plan = inputs.read_plan


def _profile_and_hash(value: Profile | PathLike) -> tuple[Profile, str]:
    """The profile and the SHA-256 a plan records: of the file, or of the bytes ``save``
    would write for a profile in memory (so the plan matches the file once saved)."""
    if isinstance(value, Profile):
        text = value.model_dump_json(indent=2) + "\n"
        return value, hashlib.sha256(text.encode()).hexdigest()
    return load_profile(value), file_sha256(value)


def _options(options: dict[str, Any], defaults: dict[str, Any] | None = None) -> SolveOptions:
    try:
        return SolveOptions(**{**(defaults or {}), **options})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "options"
        raise InputError(f"solve option {where}: {first['msg']}") from None


def solve(
    profile: Profile | PathLike,
    cluster: Cluster | PathLike,
    global_batch: int,
    *,
    catalog: Sequence[PathLike] = (),
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> Plan:
    """The best plan for ``profile`` on ``cluster`` at ``global_batch`` samples per iteration,
    as ``autoplan solve`` writes it.

    ``options`` are ``SolveOptions``' fields: pin a knob (``tp=4``, ``pp=8``, ``dp``,
    ``micro_batch_size`` (per replica, as Megatron-LM counts it; a plan's
    ``parallelism.micro_batch_size`` is the stage total over its replicas),
    ``num_micro_batches``, ``schedule``, ``recompute``, ``zero1``,
    ``layer_split``), pick a baseline (``strategy='megatron'``) or the search space
    (``space='uniform'``), bound the search (``time_limit_s``, default 60), override
    ``efficiency`` per GPU type or the memory reserve (``reserve_gb``). ``catalog``: overlay
    files from ``autoplan calibrate``. ``progress(done, total)`` is called as the search goes.
    Raises InfeasibleError naming the binding constraint when no plan exists."""
    loaded, sha256 = _profile_and_hash(profile)
    hardware = load_cluster(cluster, catalog)
    return _solve(
        loaded,
        hardware,
        global_batch,
        _options(options),
        profile_sha256=sha256,
        progress=progress,
    )


def price(
    profile: Profile | PathLike,
    cluster: Cluster | PathLike | None = None,
    *,
    plan: Plan | PathLike | None = None,
    stages: str | Sequence[StageSpec] | None = None,
    global_batch: int | None = None,
    num_micro_batches: int | None = None,
    micro_batch_size: int = 1,
    schedule: str = "1f1b",
    pipeline_degree: int | None = None,
    recompute: str = "none",
    zero: int = 0,
    sequence_parallel: bool = False,
    catalog: Sequence[PathLike] = (),
    engine: Engine | None = None,
) -> Priced:
    """``cost_plan`` with the cost model's violations beside the plan (what does not fit
    memory; empty when it fits); ``engine`` prices it as that engine runs it (default: the
    plan's own, or autoplan's runtime for stages)."""
    loaded, sha256 = _profile_and_hash(profile)
    given = None
    if plan is not None:
        given = plan if isinstance(plan, Plan) else read_json_model(plan, Plan)
    hardware = None if cluster is None else load_cluster(cluster)
    if catalog:
        if hardware is None and given is not None:
            hardware = given.inputs.cluster
        if hardware is not None:
            hardware = load_cluster(hardware, catalog)
    return price_configuration(
        loaded,
        hardware,
        plan=given,
        stages=stages,
        knobs=PipelineKnobs(
            global_batch=global_batch,
            num_micro_batches=num_micro_batches,
            micro_batch_size=micro_batch_size,
            schedule=schedule,
            pipeline_degree=pipeline_degree,
            recompute=recompute,
            zero_stage=zero,
            sequence_parallel=sequence_parallel,
        ),
        profile_sha256=sha256,
        engine=engine,
    )


def cost_plan(
    profile: Profile | PathLike,
    cluster: Cluster | PathLike | None = None,
    **configuration: Any,
) -> Plan:
    """Price a configuration you wrote, as ``autoplan cost`` does: nothing is searched, the
    same cost model, placement, memory and validity checks as ``solve``'s plans.

    Give ``plan=`` (a Plan or plan JSON path, hand-written or edited; its own cluster unless
    ``cluster`` is given) or ``stages=`` (``'A100:L0-11:tp2:dp4 | V100:L12-23:tp2:dp4'``,
    inclusive layer ranges, see ``autoplan.plan.stage_spec``; or a list of ``StageSpec``) on
    ``cluster`` with ``global_batch`` (or ``num_micro_batches``), ``micro_batch_size`` (samples
    of EACH replica per micro-batch), ``schedule``, ``pipeline_degree`` (for interleaved
    schedules), ``recompute``, ``zero``, ``sequence_parallel``, ``catalog`` overlays.
    Memory that does not fit is in the plan's memory estimates (``price`` lists it); a
    configuration that cannot be placed or breaks the validator's rules raises."""
    return price(profile, cluster, **configuration).plan


def simulate(plan: Plan | PathLike) -> SimulationResult:
    """Play ``plan``'s schedule replica by replica, as ``autoplan simulate`` does: per-replica
    timelines with memory curves, the simulated iteration time beside the plan's prediction."""
    loaded = inputs.checked_plan(plan) if isinstance(plan, Plan) else load_plan(plan)
    if edited_since_costed(loaded):
        raise InputError(stale_timings_message(str(plan) if not isinstance(plan, Plan) else "plan"))
    too_big = simulation_size_problem(loaded)
    if too_big is not None:
        raise InputError(too_big)
    return simulate_plan(loaded)


def sweep(
    profile: Profile | PathLike,
    cluster: Cluster | PathLike,
    nodes: Sequence[int],
    global_batch: int | Sequence[int] | None = None,
    *,
    gpu_mix: dict[str, float] | None = None,
    tokens: float = DEFAULT_TRAIN_TOKENS,
    prices: dict[str, float] | None = None,
    catalog: Sequence[PathLike] = (),
    progress: Callable[[int, int, str], None] | None = None,
    **options: Any,
) -> list[SweepRow]:
    """Solve ``profile`` on ``cluster`` scaled to each of ``nodes`` (× each global batch), as
    ``autoplan sweep`` does: one row per configuration, an infeasible one saying why.

    The cluster's node groups keep the file's proportions, or ``gpu_mix`` gives the fraction of
    the nodes of each GPU type (``autoplan.sweep.scale``). ``global_batch``: one, several, or
    None for one sample per GPU of each configuration. ``prices``: USD per GPU-hour of every
    GPU type, for each run's cost (idle GPUs included) to train ``tokens``. ``options`` as for
    ``solve``, applied to every configuration; ``time_limit_s`` defaults to 20 s per solve.
    ``progress(done, total, label)`` is called before each configuration."""
    loaded, sha256 = _profile_and_hash(profile)
    hardware = load_cluster(cluster, catalog)
    batches = [global_batch] if isinstance(global_batch, int) else global_batch
    return run_sweep(
        loaded,
        hardware,
        nodes,
        batches,
        gpu_mix=gpu_mix,
        train_tokens=tokens,
        prices=prices,
        options=_options(options, {"time_limit_s": _SWEEP_TIME_LIMIT_S, "top_k": 1}),
        profile_sha256=sha256,
        progress=progress,
    )


def save(result: BaseModel, path: PathLike) -> None:
    """Write a profile, plan or simulation result as the JSON the CLI writes (atomically; the
    same model always gives the same bytes)."""
    write_json_model(path, result)


def save_sweep(rows: list[SweepRow], path: PathLike, title: str = "") -> None:
    """Write sweep rows as ``autoplan sweep`` does: CSV for a '.csv' path, the throughput and
    cost plot for a '.png' one."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        write_sweep_csv(path, rows)
    elif suffix == ".png":
        # matplotlib is imported only for a plot (it takes a while).
        from autoplan.sweep.plot import write_sweep_png

        with atomic_output(path) as temporary:
            write_sweep_png(temporary, rows, title)
    else:
        raise InputError(f"save_sweep writes .csv or .png files; got {path}")
