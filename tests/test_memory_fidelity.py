"""Predicted peak memory against what real runs took: the fidelity report's memory columns,
and the memory terms of the cost model by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.calibrate.fidelity import predicted_peak_bytes
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.solve import SolveOptions, cost_model
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

GIB = 1024**3
ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT.parent / "shared" / "calibration"
OPT_350 = ROOT / "profiles" / "calibration" / "opt-350.megatron.tf32.profile.json"

needs_calibration = pytest.mark.skipif(
    not (CALIBRATION / "measured_runs.csv").is_file(),
    reason="../shared/calibration/measured_runs.csv is absent (the calibration data)",
)


def _typed(name: str, reserve_gib: float):
    return gpu(name, tflops=100.0, memory_gib=40.0).model_copy(
        update={"memory_reserve_gib": reserve_gib}
    )


def test_the_peak_is_the_largest_gpu_with_and_without_its_reserve() -> None:
    # Two stages of two layers (10^8 bf16 parameters, 16 bytes each with Adam: 3.2e9 bytes of
    # states per stage), 1F1B over 4 micro-batches: stage 0 holds 2 micro-batches' saved
    # 2 × 10^7 bytes, stage 1 one; both the transient 2 × 10^6 (twice a layer's output).
    layers = [layer(i, flops=10**12, params=10**8, saved=10**7, output=10**6) for i in range(4)]
    cluster = make_cluster([("a", _typed("A", 1.0), 1, 1), ("b", _typed("B", 3.0), 1, 1)])
    model = cost_model(make_profile(layers), cluster, SolveOptions())
    a, b = (next(c.index for c in model.classes if c.gpu.name == n) for n in "AB")
    stages = (
        StageChoice(0, 2, (ReplicaGroup(a, 1, 1, 1, "none"),)),
        StageChoice(2, 4, (ReplicaGroup(b, 1, 1, 1, "none"),)),
    )
    cost = model.evaluate(PlanConfig(4, "1f1b", 1, stages))
    first = 3.2e9 + 2 * 2e7 + 2e6
    second = 3.2e9 + 1 * 2e7 + 2e6
    without, with_reserve = predicted_peak_bytes(cost)
    # The most bytes are stage 0's; with the reserves, stage 1's 3 GiB makes it the largest.
    assert without == pytest.approx(first)
    assert with_reserve == pytest.approx(second + 3 * GIB)


@needs_calibration
def test_the_report_sets_every_measured_peak_beside_the_model() -> None:
    from autoplan.calibrate.fidelity import fidelity_report
    from autoplan.calibrate.measured_runs import read_measured_runs
    from autoplan.files import read_json_model
    from autoplan.profile.schema import Profile

    runs = read_measured_runs(CALIBRATION / "measured_runs.csv")
    report = fidelity_report(runs, {"OPT-350": read_json_model(OPT_350, Profile)})
    measured = {r.name: r.measured_max_memory_gib for r in runs}
    assert all(v is not None for v in measured.values())
    for r in report.runs:
        assert r.measured_memory_gib == measured[r.run]
        assert r.predicted_memory_with_reserve_gib > r.predicted_memory_gib > 0
        assert r.memory_error == pytest.approx(
            r.predicted_memory_with_reserve_gib / measured[r.run] - 1
        )
    overall = report.summaries[-1]
    assert overall.group == "all"
    assert overall.memory_runs == len(runs)
    errors = [r.memory_error for r in report.runs]
    assert overall.memory_worst_error == max(errors, key=lambda e: abs(e or 0))
