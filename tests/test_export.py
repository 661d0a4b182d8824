"""`autoplan export`: each launcher's file is read back the way the launcher reads it and
checked against the plan.

Megatron-LM's arguments are sourced by bash (so the quoting is really the shell's) and parsed
by argparse declared with Megatron-LM's own argument names; its layer split is divided back
by Megatron-LM's documented rules (even, first/last, or the layout string, parsed as
Megatron-core parses it). torchtitan's TOML is read by tomllib, its keys checked against
torchtitan's JobConfig field names; DeepSpeed's JSON keys against DeepSpeed's. Plans come
from real solves on shipped profiles and from ``tests.plan_factory`` for shapes a solve
rarely gives. A plan a target cannot run is one line, exit 2, nothing written;
``--best-expressible`` gives a plan the target runs and prints the ratio of iteration times.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.errors import InputError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.export.megatron import ARRAY_NAME, megatron_layer_split
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import AsyncPB, Plan
from autoplan.schedule.names import ScheduleName
from tests.plan_factory import CPU_GPU, ReplicaSpec, make_plan, make_stages_plan

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
runner = CliRunner()

# --- Reading each launcher's file back -------------------------------------------------------


def _megatron_parser() -> argparse.ArgumentParser:
    """The Megatron-LM arguments export may write, declared as megatron/training/arguments.py
    declares them (allow_abbrev=False, as Megatron-LM parses): an unknown one fails."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for name in (
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--num-layers",
        "--micro-batch-size",
        "--global-batch-size",
        "--seq-length",
        "--recompute-num-layers",
        "--context-parallel-size",
    ):
        parser.add_argument(name, type=int, default=None)
    parser.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    parser.add_argument("--recompute-granularity", choices=["full", "selective"])
    parser.add_argument("--recompute-method", choices=["uniform", "block"])
    for flag in ("--bf16", "--fp16", "--use-distributed-optimizer", "--sequence-parallel"):
        parser.add_argument(flag, action="store_true")
    return parser


def _sourced_argv(text: str, tmp_path: Path) -> list[str]:
    """The words of MEGATRON_ARGS as bash sees them after sourcing the file."""
    path = tmp_path / "megatron_args.sh"
    path.write_text(text)
    script = f'source "$1" && printf "%s\\0" "${{{ARRAY_NAME}[@]}}"'
    done = subprocess.run(
        ["bash", "-c", script, "bash", str(path)], capture_output=True, check=True, timeout=30
    )
    return done.stdout.decode().split("\0")[:-1]


def _megatron_layout_blocks(layout: str) -> list[int]:
    """Transformer layers per stage of a layout string, parsed as Megatron-core's
    PipelineParallelLayerLayout.parse_str_to_list parses it."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert all(set(stage) <= set("EtL") for stage in stages)
    return [stage.count("t") for stage in stages]


def _megatron_blocks(args: argparse.Namespace) -> list[int]:
    """Transformer layers per virtual stage as Megatron-LM divides them from its arguments
    (TransformerConfig's rules, written out here independently of autoplan.export)."""
    pp = args.pipeline_model_parallel_size
    if args.pipeline_model_parallel_layout is not None:
        return _megatron_layout_blocks(args.pipeline_model_parallel_layout)
    vpp = args.num_virtual_stages_per_pipeline_rank or 1
    if args.num_layers_per_virtual_pipeline_stage is not None:
        vpp = args.num_layers // pp // args.num_layers_per_virtual_pipeline_stage
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    middle_ranks = pp - (first is not None) - (last is not None)
    middle_layers = args.num_layers - (first or 0) - (last or 0)
    each = middle_layers // middle_ranks if middle_ranks else 0
    assert not middle_ranks or middle_layers % middle_ranks == 0
    per_rank = [each] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    assert all(count % vpp == 0 for count in per_rank)
    return [per_rank[i % pp] // vpp for i in range(pp * vpp)]


# torchtitan's JobConfig fields of the sections export writes (torchtitan/config/job_config.py).
TORCHTITAN_FIELDS = {
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "module_fqns_per_model_part",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "context_parallel_degree",
    },
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
# DeepSpeed's config keys export may write (config-json docs, deepspeed/runtime/config.py).
DEEPSPEED_KEYS = {
    "train_batch_size": None,
    "train_micro_batch_size_per_gpu": None,
    "gradient_accumulation_steps": None,
    "zero_optimization": {"stage"},
    "bf16": {"enabled"},
    "fp16": {"enabled"},
    "pipeline": {"stages", "partition", "activation_checkpoint_interval"},
    "tensor_parallel": {"autotp_size"},
}


def _shape(plan: Plan) -> dict:
    first = plan.stages[0]
    return {
        "pp": plan.parallelism.pipeline_degree,
        "dp": first.data_parallel_degree,
        "tp": first.replicas[0].tensor_parallel_degree,
        "share": first.replicas[0].micro_batch_size,
        "m": plan.parallelism.num_micro_batches,
        "batch": plan.inputs.global_batch_size,
        "recompute": first.replicas[0].recompute,
        "zero1": first.zero1 and first.data_parallel_degree > 1,
        "zero": first.zero_stage if first.data_parallel_degree > 1 else 0,
        "layers": [s.layer_end - s.layer_start for s in plan.stages],
    }


def _plan_blocks(plan: Plan) -> list[int]:
    """Transformer blocks per stage under the zoo's layout (embedding first, head last)."""
    last = plan.inputs.model.num_layers - 1
    return [sum(1 for i in range(s.layer_start, s.layer_end) if 0 < i < last) for s in plan.stages]


def check_megatron(plan: Plan, text: str, tmp_path: Path) -> argparse.Namespace:
    args = _megatron_parser().parse_args(_sourced_argv(text, tmp_path))
    shape = _shape(plan)
    assert args.tensor_model_parallel_size == shape["tp"]
    assert args.pipeline_model_parallel_size == shape["pp"]
    assert args.micro_batch_size == shape["share"]
    assert args.global_batch_size == shape["batch"]
    # Megatron-LM derives dp from the world size and the micro-batch count from the batches.
    assert shape["batch"] // (args.micro_batch_size * shape["dp"]) == shape["m"]
    assert args.num_layers == plan.inputs.model.num_layers - 2
    assert args.seq_length == plan.inputs.seq_len
    assert args.use_distributed_optimizer == shape["zero1"]
    assert args.sequence_parallel == (plan.parallelism.sequence_parallel and shape["tp"] > 1)
    assert args.bf16 == (plan.inputs.dtype == "bf16")
    if shape["recompute"] == "full":
        assert (args.recompute_granularity, args.recompute_method) == ("full", "uniform")
        assert args.recompute_num_layers == 1
    else:
        expected = None if shape["recompute"] == "none" else "selective"
        assert args.recompute_granularity == expected
    if shape["pp"] > 1:
        assert _megatron_blocks(args) == _plan_blocks(plan)
    return args


def check_torchtitan(plan: Plan, text: str) -> dict:
    config = tomllib.loads(text)
    for section, keys in config.items():
        assert set(keys) <= TORCHTITAN_FIELDS[section], section
    par, training = config["parallelism"], config["training"]
    shape = _shape(plan)
    assert par["tensor_parallel_degree"] == shape["tp"]
    assert par["pipeline_parallel_degree"] == shape["pp"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == shape["dp"]
    assert (par["data_parallel_shard_degree"] > 1) == shape["zero1"]
    if shape["zero1"]:
        # ZeRO-3 regathers the weights for the backward (FSDP's reshard after forward).
        expected = "always" if shape["zero"] == 3 else "never"
        assert par["fsdp_reshard_after_forward"] == expected
    assert training["global_batch_size"] == shape["batch"]
    assert training["seq_len"] == plan.inputs.seq_len
    if shape["pp"] > 1:
        # torchtitan: micro-batches = local_batch_size / microbatch size, no accumulation.
        assert par["pipeline_parallel_microbatch_size"] == shape["share"]
        assert training["local_batch_size"] // shape["share"] == shape["m"]
        assert training["local_batch_size"] * shape["dp"] == shape["batch"]
        parts = par["module_fqns_per_model_part"]
        counts = [sum(1 for n in part if n != "norm") for part in parts]
        assert counts == shape["layers"]
        names = [n for part in parts for n in part]
        blocks = [f"layers.{i}" for i in range(plan.inputs.model.num_layers - 2)]
        assert names == ["tok_embeddings", *blocks, "norm", "output"]
    else:
        # Gradient accumulation over the micro-batches.
        assert training["local_batch_size"] == shape["share"]
        steps = shape["batch"] // (training["local_batch_size"] * shape["dp"])
        assert steps == shape["m"]
    assert config["activation_checkpoint"]["mode"] == shape["recompute"]
    return config


def check_deepspeed(plan: Plan, text: str) -> dict:
    config = json.loads(text)
    for key, value in config.items():
        assert key in DEEPSPEED_KEYS, key
        if isinstance(value, dict):
            assert set(value) <= DEEPSPEED_KEYS[key], key
    shape = _shape(plan)
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert (micro, steps) == (shape["share"], shape["m"])
    # DeepSpeed's own invariant: batch = micro × accumulation × data-parallel world.
    world = plan.world_size // (shape["pp"] * shape["tp"])
    assert config["train_batch_size"] == micro * steps * world == shape["batch"]
    assert config["zero_optimization"]["stage"] == shape["zero"]
    assert config["bf16"]["enabled"] == (plan.inputs.dtype == "bf16")
    if shape["pp"] > 1:
        assert config["pipeline"]["stages"] == shape["pp"]
        interval = config["pipeline"]["activation_checkpoint_interval"]
        assert interval == (1 if shape["recompute"] == "full" else 0)
    assert config.get("tensor_parallel", {}).get("autotp_size", 1) == shape["tp"]
    return config


CHECKS = {
    "megatron": lambda plan, text, tmp: check_megatron(plan, text, tmp),
    "torchtitan": lambda plan, text, tmp: check_torchtitan(plan, text),
    "deepspeed": lambda plan, text, tmp: check_deepspeed(plan, text),
}

# --- Plans -----------------------------------------------------------------------------------


def _solve(tmp: Path, profile: str, cluster: str, batch: int, *extra: str) -> Path:
    out = tmp / f"{profile}-{cluster}-{batch}{''.join(extra)}.json".replace(" ", "")
    result = runner.invoke(
        app,
        [
            "solve",
            str(PROFILES / f"{profile}.profile.json"),
            "--cluster",
            cluster,
            "--global-batch",
            str(batch),
            "-o",
            str(out),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real solves: an embedding-only first stage on V100s (llama2-7b, pp 2), an interleaved
    pp 2 × tp 2 pipeline (megatron-1.7b), pure data parallelism, and a heterogeneous plan that
    mixes A100 and V100 replicas with uneven shares in its one stage (gpt2-small)."""
    tmp = tmp_path_factory.mktemp("solved")
    # Megatron-LM's export writes ZeRO-1 at most (ZeRO-2/3 plans are refused): pin it; the
    # ZeRO-3 solve is the data-parallel plan torchtitan and DeepSpeed take at level 3.
    zero = ("--zero", "1")
    return {
        # 1F1B pinned: with blocking transfers the free choice interleaves instead.
        "edge": _solve(tmp, "llama2-7b", "a100-v100", 64, "--pp", "2", "--schedule", "1f1b", *zero),
        "interleaved": _solve(tmp, "megatron-1.7b", "a100x8", 64, "--pp", "2", "--tp", "2", *zero),
        "data": _solve(tmp, "gpt2-small", "a100x8", 32, *zero),
        "mixed": _solve(tmp, "gpt2-small", "a100-v100", 512, *zero),
        "zero3": _solve(tmp, "llama2-7b", "a100x8", 128, "--pp", "1", "--zero", "3"),
    }


def _export(plan_path: Path, target: str, out: Path, *extra: str):
    return runner.invoke(app, ["export", str(plan_path), "--to", target, "-o", str(out), *extra])


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output
    return lines[0]


# --- Exports of real solves ------------------------------------------------------------------


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
@pytest.mark.parametrize("name", ["edge", "interleaved", "data", "zero3"])
def test_solved_plans_export_and_read_back_as_the_plan(
    solved: dict[str, Path], name: str, target: str, tmp_path: Path
) -> None:
    plan = read_json_model(solved[name], Plan)
    out = tmp_path / f"out.{target}"
    result = _export(solved[name], target, out)
    refused = {
        ("edge", "deepspeed"): "uneven",
        ("interleaved", "deepspeed"): "interleaves",
        ("zero3", "megatron"): "ZeRO-3",
    }
    if (name, target) in refused:
        assert refused[(name, target)] in _one_error_line(result)
        assert not out.exists()
        return
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    CHECKS[target](plan, out.read_text(), tmp_path)


def test_megatron_writes_the_layout_where_first_and_last_cannot_say_it(
    solved: dict[str, Path], tmp_path: Path
) -> None:
    # llama2-7b pp 2: stage 0 is the embedding alone (on V100s), stage 1 all 32 blocks.
    out = tmp_path / "args.sh"
    assert _export(solved["edge"], "megatron", out).exit_code == 0
    args = check_megatron(read_json_model(solved["edge"], Plan), out.read_text(), tmp_path)
    assert args.pipeline_model_parallel_layout == "E|t*32,L"
    assert args.decoder_first_pipeline_num_layers is None


def test_without_output_the_file_goes_to_stdout(solved: dict[str, Path]) -> None:
    result = runner.invoke(app, ["export", str(solved["data"]), "--to", "deepspeed"])
    assert result.exit_code == 0, result.output
    check_deepspeed(read_json_model(solved["data"], Plan), result.stdout)


# --- Hand-made shapes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "virtual", "expected"),
    [
        ([3, 2, 2, 3], 1, {}),  # blocks 2,2,2,2: even
        (
            [3, 4, 4, 3],  # blocks 2,4,4,2
            1,
            {"decoder_first_pipeline_num_layers": 2, "decoder_last_pipeline_num_layers": 2},
        ),
        ([2, 5, 5, 6], 1, {"decoder_first_pipeline_num_layers": 1}),  # blocks 1,5,5,5
        ([5, 4, 4, 3], 1, {"decoder_last_pipeline_num_layers": 2}),  # blocks 4,4,4,2
        ([3, 2, 2, 3], 2, {"num_layers_per_virtual_pipeline_stage": 2}),  # pp 2, v 2, even
        ([2, 3, 4, 5], 1, {"pipeline_model_parallel_layout": "E,t|t*3|t*4|t*4,L"}),
    ],
)
def test_megatron_splits_use_the_simplest_arguments_that_say_them(
    split: list[int], virtual: int, expected: dict, tmp_path: Path
) -> None:
    schedule = "interleaved_1f1b" if virtual > 1 else "1f1b"
    plan = make_plan(
        split, virtual_stages_per_rank=virtual, schedule=schedule, dtype="bf16", data_parallel=1
    )
    text = export_plan(plan, "megatron", layer_kinds(plan, None)).text
    args = check_megatron(plan, text, tmp_path)
    split_flags = {
        key: value
        for key, value in vars(args).items()
        if value is not None
        and (key.startswith(("decoder_", "num_layers_per", "num_virtual")) or "layout" in key)
    }
    assert split_flags == expected


def test_megatron_layer_split_follows_megatrons_rules() -> None:
    # Megatron-LM's own example: 61 layers on pp 16 as 3, 4 × 14, 2.
    assert megatron_layer_split(61, 16, 1, first=3, last=2) == [3, *[4] * 14, 2]
    assert megatron_layer_split(24, 4, 1) == [6, 6, 6, 6]
    assert megatron_layer_split(24, 2, 2) == [6, 6, 6, 6]
    assert megatron_layer_split(25, 4, 1) is None  # uneven without first/last
    assert megatron_layer_split(10, 2, 1, first=0) is None  # first must be positive
    assert megatron_layer_split(12, 2, 2, first=3) is None  # 3 does not divide over 2 chunks
    assert megatron_layer_split(6, 2, 1, first=2, last=4) == [2, 4]


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recompute_and_zero1_reach_every_target(mode: str, tmp_path: Path) -> None:
    plan = make_plan([2, 2], data_parallel=2, recompute=mode, zero1=True, dtype="bf16")
    kinds = layer_kinds(plan, None)
    check_megatron(plan, export_plan(plan, "megatron", kinds).text, tmp_path)
    config = check_torchtitan(plan, export_plan(plan, "torchtitan", kinds).text)
    assert config["parallelism"]["fsdp_reshard_after_forward"] == "never"
    if mode == "selective":
        assert config["activation_checkpoint"]["selective_ac_option"] == "op"
        with pytest.raises(NotExpressibleError, match="selective recompute"):
            export_plan(plan, "deepspeed", kinds)
    else:
        check_deepspeed(plan, export_plan(plan, "deepspeed", kinds).text)


@pytest.mark.parametrize(
    ("target", "how"),
    [
        ("megatron", "Megatron-LM trains fp32 without a precision flag"),
        ("torchtitan", "torchtitan trains float32"),
        ("deepspeed", "DeepSpeed trains fp32 with neither bf16 nor fp16"),
    ],
)
def test_a_tf32_plan_tells_how_each_target_trains_it(target: str, how: str) -> None:
    plan = make_plan([4], data_parallel=4, dtype="tf32")
    notes = export_plan(plan, target, layer_kinds(plan, None)).notes
    assert (
        f"the plan trains in tf32: {how}; enable TF32 matmuls in PyTorch "
        "(torch.backends.cuda.matmul.allow_tf32 = True)"
    ) in notes


@pytest.mark.parametrize("level", [2, 3])
def test_zero_2_and_3_reach_torchtitan_and_deepspeed_without_a_pipeline(level: int) -> None:
    plan = make_plan([4], data_parallel=4, zero_stage=level, dtype="bf16")
    assert plan.stages[0].zero_stage == level
    kinds = layer_kinds(plan, None)
    config = check_torchtitan(plan, export_plan(plan, "torchtitan", kinds).text)
    assert config["parallelism"]["data_parallel_shard_degree"] == 4
    assert check_deepspeed(plan, export_plan(plan, "deepspeed", kinds).text)[
        "zero_optimization"
    ] == {"stage": level}
    with pytest.raises(NotExpressibleError, match=f"ZeRO-{level};"):
        export_plan(plan, "megatron", kinds)


@pytest.mark.parametrize("level", [2, 3])
def test_zero_2_and_3_with_a_pipeline_are_fsdp_in_torchtitan_and_refused_by_deepspeed(
    level: int,
) -> None:
    plan = make_plan([2, 2], data_parallel=2, zero_stage=level, dtype="bf16")
    kinds = layer_kinds(plan, None)
    result = export_plan(plan, "torchtitan", kinds)
    check_torchtitan(plan, result.text)
    assert any("last micro-batch" in note for note in result.notes)
    with pytest.raises(NotExpressibleError, match="pipeline engine runs ZeRO stages 0 and 1"):
        export_plan(plan, "deepspeed", kinds)


def test_deepspeed_autotp_takes_zero_2_but_not_zero_3() -> None:
    kinds = None
    two = make_plan([4], tensor_parallel=2, data_parallel=2, zero_stage=2, dtype="bf16")
    config = check_deepspeed(two, export_plan(two, "deepspeed", kinds).text)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    three = make_plan([4], tensor_parallel=2, data_parallel=2, zero_stage=3, dtype="bf16")
    with pytest.raises(NotExpressibleError, match="AutoTP training runs with ZeRO stages 0 to 2"):
        export_plan(three, "deepspeed", kinds)


def test_stages_of_different_zero_levels_are_refused_in_one_line() -> None:
    plan = make_plan([2, 2], data_parallel=2, zero_stage=2, dtype="bf16")
    mixed = plan.model_copy(
        update={"stages": [plan.stages[0], plan.stages[1].model_copy(update={"zero_stage": 3})]}
    )
    for target in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(NotExpressibleError, match="different ZeRO levels"):
            export_plan(mixed, target, layer_kinds(mixed, None))


def test_tensor_parallel_without_a_pipeline_is_autotp_in_deepspeed() -> None:
    plan = make_plan([4], tensor_parallel=2, data_parallel=2, dtype="bf16")
    config = check_deepspeed(plan, export_plan(plan, "deepspeed", None).text)
    assert config["tensor_parallel"] == {"autotp_size": 2}


def _two_type_cluster() -> Cluster:
    fast = CPU_GPU.model_copy(update={"name": "gpu-fast"})
    slow = CPU_GPU.model_copy(update={"name": "gpu-slow"})
    return Cluster(
        name="two-types",
        gpu_types=[fast, slow],
        node_groups=[
            NodeGroup(
                name="fast", gpu="gpu-fast", gpus_per_node=2, intra_node_bandwidth_gb_per_s=5
            ),
            NodeGroup(
                name="slow", gpu="gpu-slow", gpus_per_node=2, intra_node_bandwidth_gb_per_s=5
            ),
        ],
        inter_node_bandwidth_gb_per_s=1,
    )


R = ReplicaSpec
BF16 = {"dtype": "bf16"}
UNEXPRESSIBLE = {
    "mixed_types": (
        lambda: make_stages_plan(
            [2, 2],
            [[R(node=0), R(node=1)], [R(node=0), R(node=1)]],
            cluster=_two_type_cluster(),
            **BF16,
        ),
        "stage 0 mixes GPU types (gpu-fast, gpu-slow)",
    ),
    "uneven_shares": (
        lambda: make_plan([2, 2], data_parallel=2, replica_micro_batch_sizes=[3, 1], **BF16),
        "stage 0's replicas take uneven shares of each micro-batch (3, 1 samples)",
    ),
    "tp_per_stage": (
        lambda: make_stages_plan([2, 2], [[R(tp=2, share=2)], [R(tp=1, share=2)]], **BF16),
        "stages differ in tensor-parallel degree (stage 0: tp 2, stage 1: tp 1)",
    ),
    "dp_per_stage": (
        lambda: make_stages_plan([2, 2], [[R(share=2)], [R(), R()]], **BF16),
        "stages differ in data-parallel degree (stage 0: dp 1, stage 1: dp 2)",
    ),
    "recompute_per_stage": (
        lambda: make_stages_plan([2, 2], [[R(recompute="full")], [R(recompute="none")]], **BF16),
        "stages use different recompute (stage 0: full, stage 1: none)",
    ),
    "fp64": (lambda: make_plan([2, 2]), "its dtype is fp64"),
}


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
@pytest.mark.parametrize("case", sorted(UNEXPRESSIBLE))
def test_a_plan_the_target_cannot_run_is_one_line_exit_2_and_nothing_written(
    case: str, target: str, tmp_path: Path
) -> None:
    build, part = UNEXPRESSIBLE[case]
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, build())
    out = tmp_path / "out"
    line = _one_error_line(_export(plan_path, target, out))
    assert line.startswith(f"error: {target} cannot run this plan: ")
    assert part in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("target", "plan", "part"),
    [
        (
            "deepspeed",
            lambda: make_plan([2, 2], tensor_parallel=2, **BF16),
            "combines tp 2 with pp 2",
        ),
        ("deepspeed", lambda: make_plan([2, 2], recompute="full", **BF16), None),
        (
            "deepspeed",
            lambda: make_plan([4], recompute="full", **BF16),
            "full recompute without a pipeline",
        ),
        ("torchtitan", lambda: make_plan([2, 2], dtype="fp16"), "its dtype is fp16"),
    ],
)
def test_each_target_refuses_what_only_it_cannot_run(target, plan, part, tmp_path) -> None:
    built = plan()
    if part is None:  # the control: the same shape that target does run
        check_deepspeed(built, export_plan(built, target, None).text)
        return
    with pytest.raises(NotExpressibleError, match=re.escape(part)):
        export_plan(built, target, layer_kinds(built, None))


def test_a_factory_model_needs_its_profile_to_name_the_blocks() -> None:
    plan = make_plan([2, 2], model="mypkg.models:build", **BF16)
    assert layer_kinds(plan, None) is None
    with pytest.raises(InputError, match="pass --profile"):
        export_plan(plan, "megatron", None)
    # DeepSpeed counts layers, not blocks: no profile needed.
    check_deepspeed(plan, export_plan(plan, "deepspeed", None).text)


def test_flags_that_do_not_go_together_are_refused(solved: dict[str, Path], tmp_path) -> None:
    profile = str(PROFILES / "gpt2-small.profile.json")
    plan = solved["data"]
    cases = [
        (["--plan-out", str(tmp_path / "p.json")], "needs --best-expressible"),
        (["--profile", profile, "--best-expressible", profile], "drop --profile"),
        (["--profile", str(PROFILES / "llama2-7b.profile.json")], "not that of the profile"),
    ]
    for extra, part in cases:
        assert part in _one_error_line(_export(plan, "megatron", tmp_path / "o", *extra))
    assert "is this command's input" in _one_error_line(_export(plan, "megatron", plan))
    assert not (tmp_path / "o").exists()


# --- Best expressible ------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_best_expressible_resolves_a_plan_the_target_runs_and_prints_the_ratio(
    solved: dict[str, Path], target: str, tmp_path: Path
) -> None:
    mixed = solved["mixed"]
    original = read_json_model(mixed, Plan)
    assert "mixes GPU types" in _one_error_line(_export(mixed, target, tmp_path / "x"))
    out, plan_out = tmp_path / "out", tmp_path / "best.json"
    profile = PROFILES / "gpt2-small.profile.json"
    result = _export(
        mixed, target, out, "--best-expressible", str(profile), "--plan-out", str(plan_out)
    )
    assert result.exit_code == 0, result.output
    best = read_json_model(plan_out, Plan)
    assert runner.invoke(app, ["validate", str(plan_out), "--profile", str(profile)]).exit_code == 0
    ratio = best.prediction.iteration_time_ms / original.prediction.iteration_time_ms
    # The original was solved in the larger heterogeneous space, which holds every uniform plan.
    assert ratio >= 1.0
    assert f"ratio {ratio:.3f} to the plan's" in result.stdout
    CHECKS[target](best, out.read_text(), tmp_path)


def test_best_expressible_keeps_a_plan_the_target_already_runs(
    solved: dict[str, Path], tmp_path: Path
) -> None:
    profile = PROFILES / "gpt2-small.profile.json"
    result = _export(solved["data"], "megatron", tmp_path / "o", "--best-expressible", str(profile))
    assert result.exit_code == 0, result.output
    assert "the plan itself is the best plan Megatron-LM runs: ratio 1.000" in result.stdout


def test_best_expressible_of_a_pinned_plan_may_beat_it(tmp_path: Path) -> None:
    # The original's pins are not carried over: pp 2 on one node of A100s is slower than what
    # Megatron-LM runs without it, so the ratio is below 1.
    pinned = _solve(tmp_path, "gpt2-small", "a100x8", 32, "--pp", "2")
    profile = PROFILES / "gpt2-small.profile.json"
    plan_out = tmp_path / "best.json"
    result = _export(
        pinned,
        "megatron",
        tmp_path / "o",
        "--best-expressible",
        str(profile),
        "--plan-out",
        str(plan_out),
    )
    assert result.exit_code == 0, result.output
    ratio = (
        read_json_model(plan_out, Plan).prediction.iteration_time_ms
        / read_json_model(pinned, Plan).prediction.iteration_time_ms
    )
    assert ratio < 1.0
    assert f"ratio {ratio:.3f} to the plan's" in result.stdout


SCHEDULE_SHAPES: dict[str, dict[str, Any]] = {
    "gpipe": {"layer_split": [2, 2]},
    "1f1b": {"layer_split": [2, 2]},
    "interleaved_1f1b": {"layer_split": [1, 1, 1, 1], "virtual_stages_per_rank": 2},
    "interleaved_zero_bubble": {"layer_split": [1, 1, 1, 1], "virtual_stages_per_rank": 2},
    "zbv": {"layer_split": [1, 1, 1, 1], "virtual_stages_per_rank": 2},
    "dualpipev": {"layer_split": [1, 1, 1, 1], "virtual_stages_per_rank": 2},
}
RUNS = {
    "megatron": {"gpipe", "1f1b", "interleaved_1f1b"},
    "torchtitan": set(SCHEDULE_SHAPES),
    "deepspeed": {"gpipe", "1f1b"},
}


@pytest.mark.parametrize("target", sorted(RUNS))
@pytest.mark.parametrize("schedule", sorted(SCHEDULE_SHAPES))
def test_every_schedule_is_exported_under_its_own_name_or_refused(
    schedule: ScheduleName, target: str
) -> None:
    # A launcher given a schedule it lacks would run another one: refused, never mapped.
    plan = make_plan(schedule=schedule, dtype="bf16", **SCHEDULE_SHAPES[schedule])
    kinds = layer_kinds(plan, None)
    if schedule not in RUNS[target]:
        refusal = f"its schedule is {schedule}|interleaves the pipeline"
        with pytest.raises(NotExpressibleError, match=refusal):
            export_plan(plan, target, kinds)
        return
    text = export_plan(plan, target, kinds).text
    if target != "torchtitan":
        return  # exported without refusal; their files are checked by the tests above
    config = check_torchtitan(plan, text)
    names = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
    names.update(
        interleaved_zero_bubble="InterleavedZeroBubble", zbv="ZBVZeroBubble", dualpipev="DualPipeV"
    )
    parallelism = config["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == names[schedule]
    # Every stage in stage order; torchtitan places V schedules' stages in a V itself.
    assert len(parallelism["module_fqns_per_model_part"]) == len(plan.stages)


@pytest.mark.parametrize("target", sorted(RUNS))
def test_an_asynchronous_plan_is_refused_by_every_target(target: str) -> None:
    plan = make_plan([2, 2], dtype="bf16")
    parallelism = plan.parallelism.model_dump()
    parallelism.update(schedule="async_pb", async_pb=AsyncPB(momentum=0.9).model_dump())
    plan = Plan.model_validate({**plan.model_dump(), "parallelism": parallelism})
    with pytest.raises(NotExpressibleError, match="its schedule is async_pb"):
        export_plan(plan, target, layer_kinds(plan, None))


def test_sequence_parallelism_reaches_megatron_only(tmp_path: Path) -> None:
    """SP with tp: Megatron-LM's flag; DeepSpeed's AutoTP has none (the plan's activation
    memory would not hold there: refused); torchtitan shards the sequence with any tp, which
    a plan without SP is told of."""
    plan = make_plan([4], data_parallel=2, tensor_parallel=2, sequence_parallel=True, dtype="bf16")
    kinds = layer_kinds(plan, None)
    check_megatron(plan, export_plan(plan, "megatron", kinds).text, tmp_path)
    with pytest.raises(NotExpressibleError, match="AutoTP keeps every rank's whole sequence"):
        export_plan(plan, "deepspeed", kinds)
    on = export_plan(plan, "torchtitan", kinds).notes
    plain = make_plan([4], data_parallel=2, tensor_parallel=2, dtype="bf16")
    off = export_plan(plain, "torchtitan", layer_kinds(plain, None)).notes
    assert not any("always shards the sequence" in note for note in on)
    assert any("always shards the sequence" in note for note in off)
    check_deepspeed(plain, export_plan(plain, "deepspeed", layer_kinds(plain, None)).text)
