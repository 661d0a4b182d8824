"""Writes the corpus of bad inputs in this folder and its manifest, ``expected.tsv``.

Regenerate after a schema change with ``python -m tests.bad_inputs.generate`` (from the
repository root) and review the diff: every file must still be refused for its reason.

Kinds (one folder each):

- ``cluster/*.yaml``: run as ``solve PROFILE --cluster FILE``;
- ``profile/*.json``: run as ``solve FILE --cluster cpu-local``;
- ``plan/*.json``: run by every command that reads a plan (validate, show, simulate,
  compare, launch, run, export), unless the manifest names the commands;
- ``flags/*.args`` and ``outputs/*.args``: one command line each (shell words with
  placeholders, see ``tests/test_bad_inputs.py``).

Each manifest row: file, the text the last line of stderr must contain, and optionally the
commands ('|'-separated templates) and 'subprocess' to run it through the installed
``autoplan`` rather than in-process.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoplan.plan.schema import PLAN_SCHEMA_VERSION
from tests.plan_factory import make_plan

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

Row = tuple[str, str, str, str]
rows: list[Row] = []


def _write(
    kind: str, name: str, text: str | bytes, expect: str, commands: str = "", how: str = ""
) -> None:
    path = HERE / kind / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    rows.append((f"{kind}/{name}", expect, commands, how))


# --- Clusters --------------------------------------------------------------------------------

CLUSTER = """\
schema_version: 1
name: {name}
node_groups:
  - name: {group}
    gpu: {gpu}
    gpus_per_node: {gpus}
    count: {count}
    intra_node_bandwidth_gb_per_s: {bw}
    intra_node_latency_us: {latency}
inter_node_bandwidth_gb_per_s: 25
"""
GOOD = {
    "name": "c",
    "group": "a100",
    "gpu": "A100-80GB",
    "gpus": 8,
    "count": 2,
    "bw": 300,
    "latency": 5,
}


def cluster(file: str, expect: str, **changes: Any) -> None:
    _write("cluster", file, CLUSTER.format(**{**GOOD, **changes}), expect)


def clusters() -> None:
    _write("cluster", "empty.yaml", "", "Input should be a valid dictionary")
    _write("cluster", "not_yaml.yaml", "name: [a, b\n", "not YAML")
    _write("cluster", "top_level_list.yaml", "- a\n- b\n", "Input should be a valid dictionary")
    _write("cluster", "binary.yaml", b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not UTF-8")
    cluster("count_true.yaml", "count: Input should be a valid integer", count="true")
    cluster("count_string.yaml", "count: Input should be a valid integer", count="'4'")
    cluster("count_float.yaml", "count: Input should be a valid integer", count="2.5")
    cluster("count_zero.yaml", "count: Input should be greater than or equal to 1", count=0)
    cluster("count_10e12.yaml", "count: Input should be less than or equal to 65536", count=10**12)
    cluster("count_10e400.yaml", "number too large", count=10**400)
    cluster("gpus_per_node_huge.yaml", "gpus_per_node: Input should be less than", gpus=100000)
    cluster("gpus_per_node_negative.yaml", "gpus_per_node: Input should be greater", gpus=-8)
    cluster("bandwidth_inf.yaml", "inf is not a finite number", bw=".inf")
    cluster("bandwidth_nan.yaml", "nan is not a finite number", bw=".nan")
    cluster("bandwidth_zero.yaml", "greater than or equal to 0.001", bw=0)
    cluster("bandwidth_tiny.yaml", "greater than or equal to 0.001", bw="1e-300")
    cluster("bandwidth_huge.yaml", "number too large", bw="1e300")
    cluster("bandwidth_1e20.yaml", "less than or equal to 1000000000000", bw="1e20")
    cluster("bandwidth_text.yaml", "Input should be a valid number", bw="fast")
    cluster("latency_negative.yaml", "intra_node_latency_us: Input should be greater", latency=-1)
    cluster("group_name_newline.yaml", "name must be", group='"a\\ntouch /tmp/autoplan-pwned"')
    cluster("group_name_semicolon.yaml", "name must be", group="'a;touch /tmp/autoplan-pwned'")
    cluster("group_name_subshell.yaml", "name must be", group="'$(touch /tmp/autoplan-pwned)'")
    cluster("group_name_backtick.yaml", "name must be", group="'`touch /tmp/autoplan-pwned`'")
    cluster("group_name_slash.yaml", "name must be", group="rack/1")
    cluster("group_name_dotdot.yaml", "name must be", group="'..'")
    cluster("group_name_dash.yaml", "name must be", group="'-rf'")
    cluster("group_name_empty.yaml", "name must be", group="''")
    cluster("group_name_long.yaml", "name must be", group="a" * 65)
    cluster("group_name_number.yaml", "Input should be a valid string", group=12)
    cluster("cluster_name_escape.yaml", "control character", name='"\\e]0;pwned\\a"')
    cluster("gpu_unknown.yaml", "unknown GPU type 'Z100'", gpu="Z100")
    cluster("gpu_injection.yaml", "name must be", gpu="'A100;id'")
    good = CLUSTER.format(**GOOD)
    _write(
        "cluster",
        "schema_version_2.yaml",
        good.replace("schema_version: 1", "schema_version: 2"),
        "schema_version 2 is not one",
    )
    _write(
        "cluster",
        "schema_version_true.yaml",
        good.replace("schema_version: 1", "schema_version: true"),
        "schema_version True is not one",
    )
    _write(
        "cluster", "unknown_field.yaml", good + "gpu_count: 16\n", "Extra inputs are not permitted"
    )
    _write("cluster", "duplicate_key.yaml", good + "name: again\n", "appears twice")
    _write(
        "cluster",
        "reserve_whole_memory.yaml",
        good + "memory_reserve_gib: 80\n",
        "memory reserve (80 GiB) leaves nothing of A100-80GB's 80 GiB",
    )
    group = good[good.index("  - name") : good.index("inter_node")]
    _write(
        "cluster",
        "duplicate_group.yaml",
        good.replace(group, group + group),
        "node group names must be unique",
    )
    _write(
        "cluster",
        "link_unknown_group.yaml",
        good + "inter_node_links:\n  - {groups: [nope], bandwidth_gb_per_s: 50}\n",
        "unknown node groups",
    )
    many = "".join(
        f"  - {{name: g{i}, gpu: H100, gpus_per_node: 8, count: 60000, "
        "intra_node_bandwidth_gb_per_s: 450}\n"
        for i in range(3)
    )
    _write(
        "cluster",
        "too_many_nodes.yaml",
        f"name: big\nnode_groups:\n{many}inter_node_bandwidth_gb_per_s: 50\n",
        "nodes; autoplan takes at most 65536",
    )
    # 'Billion laughs': each level refers to the one before 100 times (1,100 aliases).
    levels = [f"l{i}" for i in range(12)]
    laughs = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 100) + "]\n"
        for previous, name in itertools.pairwise(levels)
    )
    _write("cluster", "billion_laughs.yaml", laughs, "alias references")
    small = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]\n"
        for previous, name in itertools.pairwise(levels[:10])
    )
    _write("cluster", "laughs_under_the_alias_cap.yaml", small, "Field required")
    _write(
        "cluster", "deep_nesting.yaml", "name: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper"
    )
    _write(
        "cluster",
        "python_tag.yaml",
        "name: !!python/object/apply:os.system ['touch /tmp/autoplan-pwned']\n",
        "not YAML",
    )
    _write(
        "cluster",
        "date_value.yaml",
        good.replace("name: c\n", "name: 2024-01-01\n"),
        "date value is not allowed",
    )
    gpu_types = (
        "gpu_types:\n  - name: mine\n    memory_gib: {mem}\n    memory_bandwidth_gb_per_s: 900\n"
        "    peak_tflops: {{fp32: {peak}, fp16: 10, fp64: 1}}\n    efficiency: {eff}\n"
    )
    mine = good.replace("gpu: A100-80GB", "gpu: mine")
    _write(
        "cluster",
        "gpu_memory_zero.yaml",
        mine + gpu_types.format(mem=0, peak=10, eff=0.5),
        "memory_gib: Input should be greater than or equal to",
    )
    _write(
        "cluster",
        "gpu_peak_inf.yaml",
        mine + gpu_types.format(mem=16, peak=".inf", eff=0.5),
        "inf is not a finite number",
    )
    _write(
        "cluster",
        "gpu_efficiency_2.yaml",
        mine + gpu_types.format(mem=16, peak=10, eff=2),
        "efficiency: Input should be less than or equal to 1",
    )


# --- Profiles --------------------------------------------------------------------------------


def profiles() -> None:
    base = json.loads((REPO / "profiles" / "gpt2-small.profile.json").read_text())
    text = json.dumps(base, indent=1)

    def profile(name: str, expect: str, edit: Callable[[dict[str, Any]], None]) -> None:
        data = copy.deepcopy(base)
        edit(data)
        _write("profile", name, json.dumps(data, indent=1), expect)

    def setter(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            target = data
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return edit

    _write("profile", "empty.json", "", "not JSON")
    _write("profile", "truncated.json", text[: len(text) // 2], "not JSON")
    _write("profile", "bom.json", "\ufeff" + text, "not JSON")
    _write(
        "profile",
        "nan.json",
        text.replace('"forward_flops": ', '"forward_flops": NaN, "x": ', 1),
        "NaN is not a number",
    )
    _write(
        "profile",
        "infinity.json",
        text.replace('"seq_len": 1024', '"seq_len": Infinity'),
        "Infinity is not a number",
    )
    _write(
        "profile",
        "duplicate_key.json",
        text.replace('"seq_len": 1024', '"seq_len": 1024, "seq_len": 8'),
        "appears twice",
    )
    _write(
        "profile",
        "int_5000_digits.json",
        text.replace('"seq_len": 1024', '"seq_len": ' + "9" * 5000),
        "not JSON autoplan reads",
    )
    _write(
        "profile",
        "deep_nesting.json",
        '{"model": ' + "[" * 2000 + "]" * 2000 + "}",
        "nested deeper",
    )
    _write("profile", "top_level_list.json", "[1, 2, 3]", "Input should be a valid dictionary")
    profile(
        "seq_len_huge.json",
        "seq_len: Input should be less than or equal to",
        setter("seq_len", value=10**9),
    )
    profile(
        "seq_len_true.json",
        "seq_len: Input should be a valid integer",
        setter("seq_len", value=True),
    )
    profile(
        "seq_len_string.json",
        "seq_len: Input should be a valid integer",
        setter("seq_len", value="1024"),
    )
    profile(
        "micro_batch_zero.json",
        "micro_batch_size: Input should be greater",
        setter("micro_batch_size", value=0),
    )
    profile(
        "flops_huge.json", "number too large", setter("layers", 1, "forward_flops", value=10**30)
    )
    profile(
        "flops_negative.json",
        "forward_flops: Input should be greater than or equal to 0",
        setter("layers", 1, "forward_flops", value=-1),
    )
    profile(
        "layers_empty.json", "layers: List should have at least 1 item", setter("layers", value=[])
    )
    profile(
        "num_layers_mismatch.json",
        "model.num_layers (15) != len(layers) (14)",
        setter("model", "num_layers", value=15),
    )
    profile(
        "layer_index_wrong.json", "indices must be 0..n-1", setter("layers", 3, "index", value=7)
    )
    profile(
        "replica_of_unknown.json",
        "which was not profiled",
        setter("layers", 3, "replica_of", value=99),
    )
    profile("dtype_fp8.json", "dtype: Input should be", setter("dtype", value="fp8"))
    profile(
        "dtype_bytes_huge.json",
        "dtype_bytes: Input should be less than or equal to 8",
        setter("dtype_bytes", value=1000),
    )
    profile(
        "dtype_bytes_mismatch.json",
        "dtype_bytes 4 is not the size of bf16",
        setter("dtype_bytes", value=4),
    )
    profile(
        "replica_of_itself.json",
        "layer 3 names itself as the layer it replicates",
        setter("layers", 3, "replica_of", value=3),
    )
    profile(
        "profiled_index_outside.json",
        "profiled_layer_indices names layers [99], which do not exist",
        setter("profiled_layer_indices", value=[0, 1, 99]),
    )
    profile(
        "schema_version_99.json", "schema_version 99 is not one", setter("schema_version", value=99)
    )
    profile("unknown_field.json", "Extra inputs are not permitted", setter("flops_total", value=1))
    profile(
        "model_name_injection.json",
        "is not a zoo name or a factory",
        setter("model", "name", value="gpt2;touch /tmp/autoplan-pwned"),
    )
    profile(
        "model_name_escape.json", "control character", setter("model", "name", value="\x1b[2Jgpt2")
    )
    profile(
        "measured_negative.json",
        "forward_ms: Input should be greater than or equal to 0",
        setter(
            "layers",
            1,
            "measured",
            value=[{"device_name": "x", "forward_ms": -1.0, "backward_ms": 1.0, "repeats": 3}],
        ),
    )


# --- Plans -----------------------------------------------------------------------------------


def plans() -> None:
    base = json.loads(make_plan([2, 2], data_parallel=2).model_dump_json())
    text = json.dumps(base, indent=1)

    def plan(
        name: str, expect: str, edit: Callable[[dict[str, Any]], None], commands: str = ""
    ) -> None:
        data = copy.deepcopy(base)
        edit(data)
        _write("plan", name, json.dumps(data, indent=1), expect, commands)

    def setter(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            target = data
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return edit

    def rename_node(new: str) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            for node in data["nodes"]:
                node["name"] = new
            for entry in data["rank_map"]:
                entry["node"] = new
            for stage in data["stages"]:
                for replica in stage["replicas"]:
                    replica["node"] = new

        return edit

    _write("plan", "empty.json", "", "not JSON")
    _write("plan", "truncated.json", text[: len(text) * 2 // 3], "not JSON")
    _write("plan", "null.json", "null", "Input should be a valid dictionary")
    _write("plan", "deep_nesting.json", "[" * 100000 + "]" * 100000, "nested deeper")
    _write(
        "plan",
        "duplicate_key.json",
        text.replace('"strategy": ', '"strategy": "x", "strategy": ', 1),
        "appears twice",
    )
    future = PLAN_SCHEMA_VERSION + 1  # a version this autoplan does not read yet
    plan(
        "schema_version_future.json",
        f"schema_version {future} is not one",
        setter("schema_version", value=future),
    )
    plan(
        "v1_unconvertible.json",
        "a version-1 plan that cannot be converted",
        setter("schema_version", value=1),
    )
    plan("duplicated_rank.json", "rank", setter("rank_map", 1, "rank", value=0))
    plan("node_not_in_cluster.json", "not in the plan's cluster", rename_node("elsewhere-0"))
    plan(
        "node_name_injection.json",
        "not a node or GPU type name",
        rename_node("local-0;touch /tmp/autoplan-pwned"),
    )
    plan(
        "node_name_newline.json",
        "not a node or GPU type name",
        rename_node("local-0\ntouch /tmp/autoplan-pwned"),
    )
    plan("node_name_slash.json", "not a node or GPU type name", rename_node("../../etc/passwd"))
    plan(
        "stages_do_not_cover_layers.json",
        "layers",
        setter("inputs", "model", "num_layers", value=10),
    )
    plan(
        "micro_batches_10e8.json",
        "num_micro_batches: Input should be less than or equal to 65536",
        setter("parallelism", "num_micro_batches", value=10**8),
    )
    plan(
        "global_batch_10e23.json",
        "global_batch_size: Input should be less than or equal to",
        setter("inputs", "global_batch_size", value=10**23),
    )
    plan(
        "micro_batches_true.json",
        "num_micro_batches: Input should be a valid integer",
        setter("parallelism", "num_micro_batches", value=True),
    )
    plan(
        "pipeline_degree_zero.json",
        "pipeline_degree: Input should be greater than or equal to 1",
        setter("parallelism", "pipeline_degree", value=0),
    )
    plan(
        "iteration_time_null.json",
        "iteration_time_ms: Input should be a valid number",
        setter("prediction", "iteration_time_ms", value=None),
    )
    _write(
        "plan",
        "iteration_time_nan.json",
        text.replace('"iteration_time_ms": ', '"iteration_time_ms": NaN, "x": ', 1),
        "NaN is not a number",
    )
    plan(
        "model_unknown.json",
        "unknown model 'gpt-5'",
        setter("inputs", "model", "name", value="gpt-5"),
    )
    plan(
        "model_injection.json",
        "is not a zoo name or a factory",
        setter("inputs", "model", "name", value="os:system;touch /tmp/autoplan-pwned"),
    )
    plan(
        "model_factory_malformed.json",
        "is not a zoo name or a factory",
        setter("inputs", "model", "name", value="a..b:c"),
    )
    plan(
        "cluster_count_10e12.json",
        "count: Input should be less than or equal to 65536",
        setter("inputs", "cluster", "node_groups", 0, "count", value=10**12),
    )
    plan(
        "cluster_bandwidth_null.json",
        "inter_node_bandwidth_gb_per_s: Input should be a valid number",
        setter("inputs", "cluster", "inter_node_bandwidth_gb_per_s", value=None),
    )
    plan("gpu_type_mismatch.json", "GPU type", setter("nodes", 0, "gpu_type", value="A100-80GB"))
    plan(
        "replica_ranks_mismatch.json",
        "lists 2 ranks; its tensor_parallel_degree is 1",
        setter("stages", 0, "replicas", 0, "ranks", value=[0, 1]),
    )
    plan(
        "replicas_empty.json",
        "replicas: List should have at least 1 item",
        setter("stages", 0, "replicas", value=[]),
    )
    plan(
        "extra_field.json",
        "Extra inputs are not permitted",
        setter("parallelism", "data_parallel_degree", value=2),
    )
    plan(
        "dtype_unknown.json",
        "training dtype 'fp8' is not one of",
        setter("inputs", "dtype", value="fp8"),
    )
    plan(
        "strategy_escape.json",
        "control character",
        setter("inputs", "strategy", value="\x1b]52;c;cHduZWQ=\x07"),
    )
    plan(
        "factory_untrusted.json",
        "--trust-factory",
        setter("inputs", "model", "name", value="tests.runtime_models:mlp_stack"),
        "run {input} --local|launch {input} -o {outdir}",
    )
    # Valid, but beyond what simulate plays in bounded time (2 x 65536 x 2 actions).
    big = copy.deepcopy(base)
    big["parallelism"]["num_micro_batches"] = 65536
    big["inputs"]["global_batch_size"] = 65536 * big["parallelism"]["micro_batch_size"]
    seconds = big["prediction"]["iteration_time_ms"] / 1000 * 16384
    big["prediction"]["iteration_time_ms"] *= 16384
    big["prediction"]["breakdown"]["compute_ms"] *= 16384
    big["prediction"]["samples_per_s"] = big["inputs"]["global_batch_size"] / seconds
    big["prediction"]["tokens_per_s"] = (
        big["prediction"]["samples_per_s"] * big["inputs"]["seq_len"]
    )
    _write(
        "plan",
        "simulate_too_many_actions.json",
        json.dumps(big, indent=1),
        "simulate plays at most",
        "simulate {input}",
    )


# --- Command lines ---------------------------------------------------------------------------

SOLVE = "solve {profile} --cluster {cluster} --global-batch 8 -o {out}"
FLAGS = {
    "launch_port_0": ("launch {plan} -o {outdir} --master-port 0", "'--master-port'"),
    "launch_port_70000": ("launch {plan} -o {outdir} --master-port 70000", "'--master-port'"),
    "launch_steps_negative": ("launch {plan} -o {outdir} --steps -1", "'--steps'"),
    "launch_master_addr": (
        "launch {plan} -o {outdir} --master-addr 'a;touch /tmp/autoplan-pwned'",
        "not a host name",
    ),
    "launch_rdzv_etcd": ("launch {plan} -o {outdir} --rdzv-backend etcd", "'--rdzv-backend'"),
    "launch_gres_bad": ("launch {plan} -o {outdir} --gres 'cpu=a b'", "--gres takes GPU_TYPE=NAME"),
    "launch_constraint_unknown": (
        "launch {plan} -o {outdir} --constraint H100=h100",
        "the plan uses no GPU type",
    ),
    "launch_cpus_zero": ("launch {plan} -o {outdir} --cpus-per-task 0", "'--cpus-per-task'"),
    "launch_report_newline": (
        "launch {plan} -o {outdir} --report 'a{nl}b'",
        "is not a usable path",
    ),
    "launch_missing_output": ("launch {plan}", "Missing option '--output'"),
    "run_steps_negative": ("run {plan} --local --steps -1", "'--steps'"),
    "run_steps_zero": ("run {plan} --local --steps 0", "'--steps'"),
    "run_not_local": ("run {plan}", "needs --local"),
    "run_device_tpu": ("run {plan} --local --device tpu", "--device must be"),
    "run_factory_malformed": ("run {plan} --local --factory 'x;y'", "is not of the form"),
    "solve_batch_10e23": (
        SOLVE.replace("8", "100000000000000000000000"),
        "--global-batch 100000000000000000000000 exceeds the maximum",
    ),
    "solve_batch_zero": (SOLVE.replace("8", "0"), "--global-batch must be at least 1, got 0"),
    "solve_batch_float": (SOLVE.replace("8", "1e23"), "'--global-batch'"),
    "solve_tp_zero": (SOLVE + " --tp 0", "--tp must be at least 1, got 0"),
    "solve_pp_huge": (SOLVE + " --pp 100000", "--pp 100000 exceeds the maximum"),
    "solve_time_limit_nan": (SOLVE + " --time-limit nan", "--time-limit must be a number, got nan"),
    "solve_time_limit_inf": (SOLVE + " --time-limit inf", "--time-limit inf exceeds the maximum"),
    "solve_top_k_zero": (SOLVE + " --top-k 0", "--top-k must be at least 1, got 0"),
    "solve_schedule_bogus": (SOLVE + " --schedule zigzag", "schedule"),
    "solve_layer_split_empty": (
        SOLVE + " --layer-split 1,,2",
        "--layer-split must be comma-separated integers",
    ),
    "solve_layer_split_zero": (SOLVE + " --layer-split 0,14", "--layer-split takes 1 to"),
    "solve_efficiency_2": (
        SOLVE + " --efficiency A100-80GB=2",
        "--efficiency A100-80GB 2.0 exceeds the maximum, 1",
    ),
    "solve_efficiency_nan": (
        SOLVE + " --efficiency A100-80GB=nan",
        "--efficiency A100-80GB must be a number",
    ),
    "solve_efficiency_text": (SOLVE + " --efficiency A100", "--efficiency takes GPU=FRACTION"),
    "solve_engine_unknown": (SOLVE + " --engine horovod", "--engine must be one of autoplan"),
    "solve_cluster_unknown": (
        SOLVE.replace("{cluster}", "no-such-cluster"),
        "no example cluster 'no-such-cluster'",
    ),
    "solve_profile_missing": (SOLVE.replace("{profile}", "{tmp}/missing.json"), "no such file"),
    "solve_profile_fifo": (SOLVE.replace("{profile}", "{fifo}"), "not a regular file"),
    "profile_seq_zero": ("profile gpt-tiny --seq 0 -o {out}", "--seq must be at least 1, got 0"),
    "profile_seq_huge": (
        "profile gpt-tiny --seq 99999999999 -o {out}",
        "--seq 99999999999 exceeds the maximum, 1,048,576",
    ),
    "profile_micro_batch_zero": (
        "profile gpt-tiny --seq 8 --micro-batch 0 -o {out}",
        "--micro-batch must be at least 1, got 0",
    ),
    "profile_unknown_model": ("profile gpt-5 --seq 8 -o {out}", "unknown model 'gpt-5'"),
    "profile_factory_missing": (
        "profile no_such_pkg.mod:build --seq 8 -o {out}",
        "cannot import module 'no_such_pkg.mod'",
    ),
    "export_target_unknown": ("export {plan} --to nemo -o {out}", "'--to'"),
    "export_missing_target": ("export {plan} -o {out}", "Missing option '--to'"),
    "export_plan_out_alone": (
        "export {plan} --to megatron -o {out} --plan-out {tmp}/best.json",
        "--plan-out writes the re-solved plan: it needs --best-expressible",
    ),
    "export_fp64_plan": (
        "export {plan} --to megatron -o {out}",
        "megatron cannot run this plan: its dtype is fp64",
    ),
    "export_profile_not_the_plans": (
        "export {plan} --to deepspeed -o {out} --best-expressible {profile}",
        "is not that of the profile the plan was solved from",
    ),
    "export_time_limit_nan": (
        "export {plan} --to megatron -o {out} --time-limit nan",
        "--time-limit must be a number, got nan",
    ),
    "show_unknown_option": ("show {plan} --bogus", "No such option: --bogus"),
    "validate_missing_argument": ("validate", "Missing argument"),
    "schema_unknown": ("schema nosuch", "'nosuch'"),
    "top_level_unknown_command": ("frobnicate", "No such command 'frobnicate'"),
    "installed_bad_flag": (
        "launch {plan} -o {outdir} --master-port 0",
        "'--master-port'",
        "subprocess",
    ),
    "installed_bad_plan_path": ("show {tmp}/nope.json", "no such file", "subprocess"),
}
OUTPUTS = {
    "solve_output_is_folder": (SOLVE.replace("{out}", "{tmp}"), "is a folder"),
    "solve_output_under_file": (
        SOLVE.replace("{out}", "{plan}/plan.json"),
        "is a file, not a folder",
    ),
    "solve_output_dev_full": (SOLVE.replace("{out}", "/dev/full"), "not a regular file"),
    "solve_output_is_its_profile": (SOLVE.replace("{out}", "{profile}"), "is this command's input"),
    "solve_output_is_its_cluster": (SOLVE.replace("{out}", "{cluster}"), "is this command's input"),
    "solve_output_is_the_catalog": (SOLVE.replace("{out}", "{catalog}"), "is this command's input"),
    "solve_output_unwritable": (
        SOLVE.replace("{out}", "/proc/self/nope/plan.json"),
        "cannot write in",
    ),
    "profile_output_is_folder": ("profile gpt-tiny --seq 8 -o {tmp}", "is a folder"),
    "profile_output_dev_full": ("profile gpt-tiny --seq 8 -o /dev/full", "not a regular file"),
    "profile_output_under_file": (
        "profile gpt-tiny --seq 8 -o {plan}/p.json",
        "is a file, not a folder",
    ),
    "launch_output_is_file": ("launch {plan} -o {plan}", "is a file; give a folder"),
    "launch_output_dev_full": ("launch {plan} -o /dev/full", "is a file; give a folder"),
    "launch_output_under_file": ("launch {plan} -o {plan}/scripts", "is a file, not a folder"),
    "simulate_trace_folder": ("simulate {plan} --trace {tmp}", "is a folder"),
    "simulate_png_under_file": ("simulate {plan} --png {plan}/x.png", "is a file, not a folder"),
    "simulate_out_is_its_plan": ("simulate {plan} --out {plan}", "is this command's input"),
    "simulate_trace_and_png_same": (
        "simulate {plan} --trace {out} --png {out}",
        "are the same file",
    ),
    "simulate_out_dev_full": ("simulate {plan} --out /dev/full", "not a regular file"),
    "run_report_is_its_plan": ("run {plan} --local --report {plan}", "is this command's input"),
    "run_report_folder": ("run {plan} --local --report {tmp}", "is a folder"),
    "run_report_under_file": (
        "run {plan} --local --report {plan}/r.json",
        "is a file, not a folder",
    ),
    "run_log_dir_is_file": ("run {plan} --local --log-dir {plan}", "is a file; give a folder"),
    "export_output_is_its_plan": (
        "export {plan} --to deepspeed -o {plan}",
        "is this command's input",
    ),
    "export_output_is_its_profile": (
        "export {plan} --to deepspeed -o {profile} --profile {profile}",
        "is this command's input",
    ),
    "export_plan_out_is_folder": (
        "export {plan} --to deepspeed -o {out} --best-expressible {profile} --plan-out {tmp}",
        "is a folder",
    ),
    "export_output_dev_full": ("export {plan} --to deepspeed -o /dev/full", "not a regular file"),
}


def command_lines() -> None:
    for kind, table in (("flags", FLAGS), ("outputs", OUTPUTS)):
        for name, (line, expect, *how) in table.items():
            _write(kind, f"{name}.args", line + "\n", expect, "", how[0] if how else "")


def main() -> None:
    for kind in ("cluster", "profile", "plan", "flags", "outputs"):
        folder = HERE / kind
        if folder.is_dir():
            for old in folder.iterdir():
                old.unlink()
    clusters()
    profiles()
    plans()
    command_lines()
    lines = ["# file\texpected in the last stderr line\tcommands (default: by kind)\thow"]
    lines += ["\t".join(row) for row in rows]
    (HERE / "expected.tsv").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(rows)} bad inputs to {HERE}")


if __name__ == "__main__":
    main()
