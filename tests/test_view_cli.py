"""autoplan show / simulate / compare on real plan files: printed rows, trace JSON, PNG, the
narrow layout (no '…' at 80 columns), Markdown and JSON."""

from __future__ import annotations

import itertools
import json
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.catalog import load_catalog
from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import (
    Alternative,
    IdleGpus,
    MemoryEstimate,
    Plan,
    ReplicaTiming,
    StageTiming,
)
from autoplan.schedule import Action
from autoplan.simulate import simulate_plan
from autoplan.simulate.chrome_trace import chrome_trace
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan

runner = CliRunner()
WIDE = {"COLUMNS": "200"}  # rich wraps table cells to the terminal width


def _demo_plan(schedule: str = "interleaved_1f1b", v: int = 2, m: int = 4) -> Plan:
    stages = 2 * v
    timings = [
        StageTiming(stage=s, forward_ms=1.0 + s % 2, backward_ms=2.0 + s % 2, send_ms=0.25)
        for s in range(stages)
    ]
    plan = make_plan(
        [3] * stages,
        schedule=schedule,  # type: ignore[arg-type]
        virtual_stages_per_rank=v,
        num_micro_batches=m,
        data_parallel=2,
        dp_allreduce_ms=1.5,
        stage_timings=timings,
    )
    memory = [
        MemoryEstimate(
            pipeline_rank=rank,
            gpu_type="cpu",
            weights_bytes=2**30,
            gradients_bytes=2**30,
            optimizer_bytes=2 * 2**30,
            activations_bytes=2**30,
            transient_bytes=2**28,
            total_bytes=5 * 2**30 + 2**28,
            capacity_bytes=8 * 2**30,
            micro_batch_size=2,
        )
        for rank in range(2)
    ]
    alternative = Alternative(
        rank=1,
        summary="pp=1 dp=4 tp=1 mbs=2 m=4 1f1b",
        layer_split=[3 * stages],
        gpu_types=["cpu"],
        iteration_time_ms=plan.prediction.iteration_time_ms * 2,
        samples_per_s=plan.prediction.samples_per_s / 2,
    )
    prediction = plan.prediction.model_copy(update={"memory": memory})
    return plan.model_copy(update={"prediction": prediction, "alternatives": [alternative]})


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    write_json_model(path, _demo_plan())
    return path


def test_show_prints_stages_memory_breakdown_and_alternatives(plan_file: Path) -> None:
    result = runner.invoke(app, ["show", str(plan_file)], env=WIDE)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    stage_rows = [line for line in lines if "cpu tp1 × 2 (micro-batch 2 each)" in line]
    assert len(stage_rows) == 4  # 2 ranks × 2 virtual stages
    assert any(
        "0-2 (3 layers)" in line and "1.00 ms" in line and "2.00 ms" in line for line in stage_rows
    )
    assert any("9-11 (3 layers)" in line for line in stage_rows)
    memory_rows = [line for line in lines if "5.25 GiB" in line and "66%" in line]
    assert len(memory_rows) == 2
    assert "█" in memory_rows[0]
    assert any("data-parallel all-reduce" in line and "1.50 ms" in line for line in lines)
    assert any("pp=1 dp=4 tp=1 mbs=2 m=4 1f1b" in line and "0.50×" in line for line in lines)
    assert "2 ranks × 2 virtual stages, 4 stages, interleaved_1f1b" in result.output
    assert "every GPU of the cluster is used" in result.output


def test_show_never_calls_a_searched_plan_optimal_by_its_strategy(tmp_path: Path) -> None:
    """The search's plans record strategy 'optimal' (the schema's name for the search); shown,
    the strategy says whose search it was, and only a certificate may say optimal."""
    plan = _demo_plan()
    searched = plan.model_copy(
        update={"inputs": plan.inputs.model_copy(update={"strategy": "optimal"})}
    )
    path = tmp_path / "searched.json"
    write_json_model(path, searched)
    result = runner.invoke(app, ["show", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    strategy = next(line for line in lines if "strategy" in line)
    assert "autoplan's search" in strategy and "optimal" not in strategy
    search = next(line for line in lines if line.lstrip("│ ").startswith("search "))
    assert "no bound recorded" in search


def test_simulate_writes_trace_and_png_and_prints_both_times(
    plan_file: Path, tmp_path: Path
) -> None:
    trace_path, png_path, out_path = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "r.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            str(plan_file),
            "--trace",
            str(trace_path),
            "--png",
            str(png_path),
            "--out",
            str(out_path),
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    simulated = simulate_plan(_demo_plan())
    predicted = _demo_plan().prediction.iteration_time_ms
    lines = result.output.splitlines()
    assert any(
        "simulated" in line and f"{simulated.iteration_time_ms:.1f} ms" in line for line in lines
    )
    assert any("plan predicts" in line and f"{predicted:.1f} ms" in line for line in lines)
    assert f"{simulated.iteration_time_ms / predicted:.3f}" in result.output

    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1]  # one track (process) per pipeline rank
    assert names[1].startswith("pipeline rank 1")
    passes = [e for e in events if e["ph"] == "X" and e["cat"] in ("forward", "backward")]
    expected = [Action(s, k, mb).label for s in range(4) for mb in range(4) for k in ("F", "B")]
    # Every action once on each of the stage's two replicas.
    assert Counter(e["name"] for e in passes) == Counter(expected * 2)
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    for event in passes:
        assert threads[(event["pid"], event["tid"])].endswith("· compute")
        assert event["pid"] == int(event["name"].split()[1][1:]) % 2  # stage s on rank s % pp
    # A compute thread per replica: 2 ranks × 2 replicas.
    assert sum(name.endswith("· compute") for name in threads.values()) == 4
    assert {e["cat"] for e in events if e["ph"] == "X"} == {"forward", "backward", "communication"}
    last_end_us = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    assert last_end_us == pytest.approx(simulated.iteration_time_ms * 1000)

    png = png_path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 400
    assert len(png) > 20_000  # a drawn chart, not an empty canvas

    assert json.loads(out_path.read_text())["iteration_time_ms"] == pytest.approx(
        simulated.iteration_time_ms
    )


def test_trace_send_threads_never_overlap() -> None:
    """Perfetto draws a thread's X events as a stack: each thread must hold disjoint spans."""
    trace = chrome_trace(simulate_plan(_demo_plan(m=8)))
    spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            spans.setdefault((event["pid"], event["tid"]), []).append(
                (event["ts"], event["ts"] + event["dur"])
            )
    assert len(spans) >= 4  # compute, all-reduce and a send thread per rank at least
    for intervals in spans.values():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert end <= start + 1e-6


def test_compare_prints_both_plans_and_the_throughput_ratio(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    plan_a = _demo_plan()
    plan_b = _demo_plan("1f1b", 1)
    slow = plan_b.prediction
    # Plan b predicted 1.5× plan a's throughput: every figure of its prediction rescaled.
    scale = slow.samples_per_s / (plan_a.prediction.samples_per_s * 1.5)
    faster = slow.model_copy(
        update={
            "iteration_time_ms": slow.iteration_time_ms * scale,
            "samples_per_s": slow.samples_per_s / scale,
            "tokens_per_s": slow.tokens_per_s / scale,
            "breakdown": slow.breakdown.model_copy(
                update={name: value * scale for name, value in slow.breakdown.model_dump().items()}
            ),
        }
    )
    write_json_model(first, plan_a)
    write_json_model(second, plan_b.model_copy(update={"prediction": faster}))
    result = runner.invoke(app, ["compare", str(first), str(second)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "a.json" in result.output and "b.json" in result.output
    ratio_line = next(line for line in result.output.splitlines() if "throughput vs" in line)
    assert "1.00×" in ratio_line and "1.50×" in ratio_line
    schedule_line = next(line for line in result.output.splitlines() if "schedule" in line)
    assert "interleaved_1f1b (v=2)" in schedule_line and "1f1b (v=1)" in schedule_line


@pytest.mark.parametrize("command", ["show", "simulate"])
def test_missing_plan_is_one_line_exit_2(command: str, tmp_path: Path) -> None:
    result = runner.invoke(app, [command, str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'nope.json'}: no such file"


def test_unrunnable_schedule_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "short.json"
    write_json_model(path, make_plan([1, 1, 1], schedule="1f1b", num_micro_batches=2))
    result = runner.invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: 1F1B needs at least as many micro-batches (2) as pipeline stages (3)"
    )


_RUN_WITHOUT_TORCH = """
import importlib.abc, sys

class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            raise ImportError(f"torch is blocked (importing {fullname})")
        return None

sys.meta_path.insert(0, BlockTorch())
import autoplan.schedule, autoplan.simulate, autoplan.view
from autoplan.cli import app
app(sys.argv[1:], standalone_mode=False)
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch loaded"
"""


def test_show_and_simulate_run_with_torch_blocked(plan_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "g.png"
    for arguments in (["show", str(plan_file)], ["simulate", str(plan_file), "--png", str(png)]):
        completed = subprocess.run(
            [sys.executable, "-c", _RUN_WITHOUT_TORCH, *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert completed.returncode == 0, completed.stderr[-2000:]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_grid_prints_the_schedule_like_pytorch(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_json_model(path, make_plan([1, 1], schedule="1f1b", num_micro_batches=2))
    result = runner.invoke(app, ["simulate", str(path), "--grid"], env=WIDE)
    assert result.exit_code == 0, result.output
    grid = [line.rstrip() for line in result.output.splitlines() if line.startswith("Step")]
    assert grid == [
        "Step 0: 0F0",
        "Step 1: 0F1    1F0",
        "Step 2:        1B0",
        "Step 3: 0B0    1F1",
        "Step 4:        1B1",
        "Step 5: 0B1",
    ]


def test_micro_batch_sizes_collapse_runs() -> None:
    from autoplan.view.units import runs_text

    assert runs_text([1] * 16) == "1 × 16"
    assert runs_text([11, 11, 5, 5]) == "11 × 2, 5 × 2"
    assert runs_text([3, 1, 3]) == "3, 1, 3"


# ---- heterogeneous plans -----------------------------------------------------------------------


def _hetero_plan() -> Plan:
    """An OPT-350M-like shape on two A100-40GB and two V100-16GB nodes of 4 GPUs: stage 0 has
    four A100 replicas of 3 samples and one V100 tp-4 replica of 4 (a mixed stage), stage 1
    four A100 replicas of 4 samples on the second A100 node; the second V100 node is idle."""
    catalog = load_catalog()
    a100, v100 = catalog["A100-40GB"], catalog["V100-16GB"]
    cluster = Cluster(
        name="a100-v100-mixed",
        node_groups=[
            NodeGroup(
                name="a100",
                gpu=a100.name,
                gpus_per_node=4,
                count=2,
                intra_node_bandwidth_gb_per_s=300,
            ),
            NodeGroup(
                name="v100",
                gpu=v100.name,
                gpus_per_node=4,
                count=2,
                intra_node_bandwidth_gb_per_s=150,
            ),
        ],
        inter_node_bandwidth_gb_per_s=6,
    )
    replicas = [
        [ReplicaSpec(tp=1, share=3, node=0) for _ in range(4)]
        + [ReplicaSpec(tp=4, share=4, node=2, recompute="full")],
        [ReplicaSpec(tp=1, share=4, node=1) for _ in range(4)],
    ]
    timings = [
        StageTiming(
            stage=0,
            forward_ms=30,
            backward_ms=60,
            send_ms=4,
            replicas=[ReplicaTiming(forward_ms=20, backward_ms=40, saved_activation_bytes=2**30)]
            * 4
            + [ReplicaTiming(forward_ms=30, backward_ms=60, saved_activation_bytes=2**29)],
        ),
        StageTiming(stage=1, forward_ms=25, backward_ms=50, send_ms=0),
    ]
    plan = make_stages_plan(
        [10, 16],
        replicas,
        cluster=cluster,
        model="opt-350m",
        num_micro_batches=16,
        stage_timings=timings,
        dtype="fp32",
        seq_len=2048,
    )
    capacity = {a100.name: a100.memory_bytes, v100.name: v100.memory_bytes}
    memory = [
        m.model_copy(
            update={
                "capacity_bytes": capacity[m.gpu_type],
                "weights_bytes": 2**30,
                "gradients_bytes": 2**30,
                "optimizer_bytes": 2**31,
                "activations_bytes": 3 * 2**30,
                "transient_bytes": 2**28,
                "total_bytes": 7 * 2**30 + 2**28,
                "reserved_bytes": 2**31,
            }
        )
        for m in plan.prediction.memory
    ]
    model = plan.inputs.model.model_copy(update={"parameter_count": 331_196_416})
    idle = [IdleGpus(gpu_type=v100.name, count=4, reason="slower than the stage it would join")]
    return plan.model_copy(
        update={
            "inputs": plan.inputs.model_copy(update={"model": model}),
            "prediction": plan.prediction.model_copy(update={"memory": memory, "idle_gpus": idle}),
        }
    )


@pytest.fixture
def hetero_file(tmp_path: Path) -> Path:
    path = tmp_path / "hetero.json"
    write_json_model(path, _hetero_plan())
    return path


def test_show_prints_each_stages_replicas_idle_gpus_and_reserve(hetero_file: Path) -> None:
    result = runner.invoke(app, ["show", str(hetero_file)], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "A100-40GB tp1 × 4 (micro-batch 3 each) + V100-16GB tp4 × 1 (micro-batch 4)" in out
    assert "A100-40GB tp1 × 4 (micro-batch 4 each)" in out
    assert "a100-0, v100-0" in out  # stage 0's nodes
    assert "none × 4, full" in out  # its recompute per replica
    assert "331 M parameters" in out
    assert "GPUs used 12 of 16 (A100-40GB 8 of 8, V100-16GB 4 of 8)" in out
    assert "4 V100-16GB: slower than the stage it would join" in out
    memory = [line for line in out.splitlines() if "7.25 GiB" in line]
    assert len(memory) == 3  # (rank 0, A100 tp1 3), (rank 0, V100 tp4 4), (rank 1, A100 tp1 4)
    assert all("2.00 GiB" in line for line in memory)  # the reserve is shown
    v100 = next(line for line in memory if "V100-16GB" in line)
    assert "16.0 GiB" in v100 and "58%" in v100  # (7.25 + 2) / 16 GiB, V100-16GB's capacity


@pytest.mark.parametrize("columns", ["80", "50"])
@pytest.mark.parametrize("command", ["show", "simulate", "compare"])
def test_views_never_truncate_when_narrow(
    command: str, columns: str, hetero_file: Path, plan_file: Path
) -> None:
    arguments = [command, str(hetero_file)] + ([str(plan_file)] if command == "compare" else [])
    result = runner.invoke(app, arguments, env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= int(columns)
    if command == "show":
        # Every replica kind and the idle reason are there in full, folded or not.
        # (A table folds a long cell onto more lines of its column: read without borders.)
        words = " ".join(re.sub("[│┃]", " ", result.output).split())
        flat = "".join(line.strip() for line in result.output.splitlines()).replace(" ", "")
        assert "A100-40GBtp1×4(micro-batch3each)+V100-16GBtp4×1(micro-batch4)" in flat
        assert "slower than the stage it would join" in words


def test_narrow_show_stacks_rows_that_do_not_fit(hetero_file: Path) -> None:
    narrow = runner.invoke(app, ["show", str(hetero_file)], env={"COLUMNS": "80"}).output
    wide = runner.invoke(app, ["show", str(hetero_file)], env=WIDE).output
    assert "  replicas:" in narrow and "stage 1" in narrow
    assert "  replicas:" not in wide  # the wide layout is a table


def test_solve_summary_fits_80_columns() -> None:
    from rich.console import Console

    from autoplan.view import print_document, solve_summary

    console = Console(width=80, record=True, file=None)
    with console.capture() as captured:
        print_document(console, solve_summary(_hetero_plan()))
    text = captured.get()
    assert "…" not in text
    assert "A100-40GB tp1 × 4 (micro-batch 3 each)" in " ".join(text.split())
    assert "slower than the stage it would join" in " ".join(text.split())


def test_markdown_parses_into_one_table_per_section(hetero_file: Path) -> None:
    from markdown_it import MarkdownIt

    result = runner.invoke(app, ["show", str(hetero_file), "--format", "markdown"])
    assert result.exit_code == 0, result.output
    tokens = MarkdownIt("commonmark").enable("table").parse(result.output)
    headings = [
        tokens[i + 1].content
        for i, t in enumerate(tokens)
        if t.type == "heading_open" and t.tag == "h3"
    ]
    assert headings[:3] == [
        "Plan",
        "Stages (times per micro-batch, slowest replica)",
        "Memory per GPU, by replica kind",
    ]
    assert sum(t.type == "table_open" for t in tokens) == len(headings)
    cells = [t for t in tokens if t.type == "inline"]
    assert any("V100-16GB tp4 × 1 (micro-batch 4)" in t.content for t in cells)
    # Each table's rows have as many cells as its header.
    widths, current = [], 0
    for token in tokens:
        if token.type == "tr_open":
            current = 0
        elif token.type in ("th_open", "td_open"):
            current += 1
        elif token.type == "tr_close":
            widths.append(current)
        elif token.type == "table_close":
            assert len(set(widths)) == 1, widths
            widths = []


@pytest.mark.parametrize("command", ["show", "simulate", "compare"])
def test_json_format_parses(command: str, hetero_file: Path, plan_file: Path) -> None:
    arguments = [command, str(hetero_file)] + ([str(plan_file)] if command == "compare" else [])
    result = runner.invoke(app, [*arguments, "--format", "json"], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["sections"]
    if command == "compare":
        (iteration,) = [row for row in data["sections"][0]["rows"] if row[""] == "iteration"]
        first = read_json_model(hetero_file, Plan).prediction.iteration_time_ms
        assert iteration[f"{hetero_file.name}_ms"] == first
    if command == "show":
        stages = next(s for s in data["sections"] if s["title"].startswith("Stages"))
        assert stages["rows"][0]["replicas"] == (
            "A100-40GB tp1 × 4 (micro-batch 3 each) + V100-16GB tp4 × 1 (micro-batch 4)"
        )
        memory = next(s for s in data["sections"] if s["title"].startswith("Memory"))
        assert "bar (width = capacity)" not in memory["rows"][0]  # bars are for terminals
        plan_items = data["sections"][0]["items"]
        assert plan_items["model"] == "opt-350m: 26 layers, 331 M parameters"
        # Figures are numbers with their unit in the key, not display strings.
        plan = read_json_model(hetero_file, Plan)
        assert plan_items["iteration_ms"] == plan.prediction.iteration_time_ms
        assert stages["rows"][0]["fwd_ms"] == plan.prediction.stage_timings[0].forward_ms
        first = min(
            plan.prediction.memory,
            key=lambda m: (m.pipeline_rank, m.gpu_type, m.tensor_parallel_degree),
        )
        assert memory["rows"][0]["total_bytes"] == first.total_bytes


def test_gantt_has_a_row_per_distinct_replica(tmp_path: Path) -> None:
    from autoplan.simulate.gantt import gantt_rows, write_gantt_png

    # Equal replicas of a uniform plan share a row: one row per rank.
    uniform = gantt_rows(simulate_plan(_demo_plan()))
    assert [(row[0].pipeline_rank, len(row)) for row in uniform] == [(0, 2), (1, 2)]
    # The mixed stage's replicas receive gradients from different replicas at different
    # times: replicas 0 and 3 fare alike, 1 and 2 each their own, the V100 its own; rank 1's
    # four replicas each wait for other senders.
    result = simulate_plan(_hetero_plan())
    rows = gantt_rows(result)
    assert [(row[0].pipeline_rank, row[0].gpu_type, [r.replica for r in row]) for row in rows] == [
        (0, "A100-40GB", [0, 3]),
        (0, "A100-40GB", [1]),
        (0, "A100-40GB", [2]),
        (0, "V100-16GB", [4]),
        (1, "A100-40GB", [0]),
        (1, "A100-40GB", [1]),
        (1, "A100-40GB", [2]),
        (1, "A100-40GB", [3]),
    ]
    # Past the row limit: one row per rank and replica kind.
    merged = gantt_rows(result, max_rows=4)
    assert [(row[0].pipeline_rank, row[0].kind, len(row)) for row in merged] == [
        (0, ("A100-40GB", 1, 3), 4),
        (0, ("V100-16GB", 4, 4), 1),
        (1, ("A100-40GB", 1, 4), 4),
    ]
    path = tmp_path / "h.png"
    write_gantt_png(path, result, "hetero")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_trace_has_threads_per_replica_and_memory_per_kind() -> None:
    trace = chrome_trace(simulate_plan(_hetero_plan()))
    events = trace["traceEvents"]
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 0]
    computes = [name for name in threads if name.endswith("· compute")]
    assert computes == [f"r{d} A100-40GB tp1, 3 samples · compute" for d in range(4)] + [
        "r4 V100-16GB tp4, 4 samples · compute"
    ]
    assert "r4 V100-16GB tp4, 4 samples · send → rank 1 r3" in threads
    counters = {e["name"] for e in events if e["ph"] == "C" and e["pid"] == 0}
    assert counters == {
        "memory per GPU: A100-40GB tp1, 3 samples",
        "memory per GPU: V100-16GB tp4, 4 samples",
    }
