"""autoplan show / simulate / compare on real plan files: printed rows, trace JSON, PNG."""

from __future__ import annotations

import itertools
import json
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import write_json_model
from autoplan.plan.schema import Alternative, MemoryEstimate, Plan, StageTiming
from autoplan.schedule import Action
from autoplan.simulate import simulate_plan
from autoplan.simulate.chrome_trace import chrome_trace
from tests.plan_factory import make_plan

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
    stage_rows = [line for line in lines if "local-0" in line]
    assert len(stage_rows) == 4  # 2 ranks × 2 virtual stages
    assert any("0–2" in line and "1.000" in line and "3.000" in line for line in stage_rows)
    assert any("9–11" in line for line in stage_rows)
    memory_rows = [line for line in lines if "5.25 / 8.00 (66%)" in line]
    assert len(memory_rows) == 2
    assert "█" in memory_rows[0]
    assert any("data-parallel all-reduce" in line for line in lines)
    assert any("pp=1 dp=4 tp=1 mbs=2 m=4 1f1b" in line and "0.50×" in line for line in lines)
    assert "pp=2 dp=2 tp=1 virtual stages/rank=2" in result.output


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
    assert f"simulated {simulated.iteration_time_ms:,.3f} ms" in result.output
    assert f"plan predicts {predicted:,.3f} ms" in result.output

    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == [0, 1]  # one track (process) per pipeline rank
    assert names[1].startswith("pipeline rank 1")
    passes = [e for e in events if e["ph"] == "X" and e["cat"] in ("forward", "backward")]
    expected = [Action(s, k, mb).label for s in range(4) for mb in range(4) for k in ("F", "B")]
    assert Counter(e["name"] for e in passes) == Counter(expected)  # every action once
    for event in passes:
        assert event["tid"] == 0
        assert event["pid"] == int(event["name"].split()[1][1:]) % 2  # stage s on rank s % pp
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
    faster = plan_a.prediction.model_copy(
        update={"samples_per_s": plan_a.prediction.samples_per_s * 1.5}
    )
    write_json_model(first, plan_a)
    write_json_model(second, _demo_plan("1f1b", 1).model_copy(update={"prediction": faster}))
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
    from autoplan.view.plan_tables import micro_batch_sizes_text

    assert micro_batch_sizes_text([1] * 16) == "1 × 16"
    assert micro_batch_sizes_text([11, 11, 5, 5]) == "11 × 2, 5 × 2"
    assert micro_batch_sizes_text([3, 1, 3]) == "3, 1, 3"
