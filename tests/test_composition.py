"""How the cost model composes an iteration: each term against a hand-worked case, the solver
against the event simulator, and the whole model against real measured runs."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from autoplan.api import cost_plan, solve
from autoplan.cost.comm import p2p_ms
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.schedule import blocking_stage_times, pipeline_time_ms
from autoplan.simulate.engine import simulate_plan
from autoplan.solve import SolveOptions, cost_model
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT.parent / "shared" / "calibration"
OPT_350 = ROOT / "profiles" / "calibration" / "opt-350.megatron.tf32.profile.json"


def test_blocking_transfers_by_hand() -> None:
    """Three stages, work 3, 2, 4 ms; transfers 1 ms (s0-s1) and 0.5 ms (s1-s2). Each stage
    pays both directions of each of its boundaries: 3 + 2, 2 + 2 + 1, 4 + 1."""
    assert blocking_stage_times([3.0, 2.0, 4.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.5]) == [
        5.0,
        5.0,
        5.0,
    ]
    # m = 4: (m - 1) × 5 + 15.
    assert pipeline_time_ms([5.0] * 3, 4, 1, [5.0] * 3) == 30.0


def _two_nodes(inter: float):
    layers = [layer(i, flops=10**12, params=10**7, saved=10**6, output=4 * 10**6) for i in range(4)]
    profile = make_profile(layers)
    cluster = make_cluster(
        [("a", gpu("A", 100.0, 40.0), 1, 2), ("b", gpu("B", 50.0, 40.0), 1, 2)],
        inter_gb_per_s=inter,
    )
    return profile, cluster


def test_a_pinned_pipeline_by_hand() -> None:
    """Two stages on single-GPU nodes of two types joined by a 1 GB/s network, m = 3: the
    boundary's transfer is one latency plus 4 MB / 1 GB/s, each stage pays it twice, the
    pipeline is (m - 1) × max a + Σ a, and the tail is the slower optimizer step (dp 1)."""
    profile, cluster = _two_nodes(1.0)
    model = cost_model(profile, cluster, SolveOptions())
    a, b = (model.classes[0].index, model.classes[1].index)
    config = PlanConfig(
        3,
        "1f1b",
        1,
        (
            StageChoice(0, 2, (ReplicaGroup(a, 1, 1, 1, "none"),)),
            StageChoice(2, 4, (ReplicaGroup(b, 1, 1, 1, "none"),)),
        ),
    )
    cost = model.evaluate(config)
    latency = cluster.inter_node_latency_us + model.classes[0].gpu.collective_step_overhead_us
    transfer = p2p_ms(4 * 10**6, 1.0, latency)
    assert transfer == pytest.approx(4.0 + latency / 1e3)
    assert cost.stages[0].send_ms == pytest.approx(transfer)
    work = [stage.work_ms for stage in cost.stages]
    steady = [work[0] + 2 * transfer, work[1] + 2 * transfer]
    assert cost.pipeline_ms == pytest.approx(2 * max(steady) + sum(steady))
    assert cost.iteration_ms == pytest.approx(cost.pipeline_ms + cost.optimizer_ms)
    # The breakdown names the transfers as pipeline communication of the slowest stage.
    assert cost.pp_comm_ms == pytest.approx(3 * 2 * transfer)


def test_the_gradient_all_reduce_hides_under_one_backward_at_most() -> None:
    """One stage, two replicas on two nodes: what the last backward does not hide of the
    all-reduce is added to the tail."""
    profile, cluster = _two_nodes(0.1)
    model = cost_model(profile, cluster, SolveOptions())
    a = model.classes[0].index
    group = ReplicaGroup(a, 1, 2, 1, "none")
    cost = model.evaluate(PlanConfig(2, "1f1b", 1, (StageChoice(0, 4, (group,)),)))
    hidden = max(0.0, cost.dp_allreduce_ms - cost.stages[0].backward_ms)
    assert cost.dp_allreduce_ms > cost.stages[0].backward_ms > 0
    assert cost.tail_ms == pytest.approx(hidden + cost.optimizer_ms)
    assert cost.dp_comm_ms == pytest.approx(hidden)


def test_megatron_deepspeed_reduces_gradients_after_the_last_backward() -> None:
    """The same stage priced as Megatron-DeepSpeed runs it: ReduceGrads after the schedule's
    last backward, so the whole all-reduce is added; the passes and the pipeline are the
    same as autoplan's own runtime's."""
    profile, cluster = _two_nodes(0.1)
    model = cost_model(profile, cluster, SolveOptions())
    group = ReplicaGroup(model.classes[0].index, 1, 2, 1, "none")
    config = PlanConfig(2, "1f1b", 1, (StageChoice(0, 4, (group,)),))
    ours = model.evaluate(config)
    theirs = model.with_engine("megatron-deepspeed").evaluate(config)
    assert theirs.pipeline_ms == pytest.approx(ours.pipeline_ms)
    assert theirs.dp_comm_ms == pytest.approx(ours.dp_allreduce_ms)
    assert theirs.iteration_ms == pytest.approx(
        ours.pipeline_ms + ours.dp_allreduce_ms + ours.optimizer_ms
    )
    assert theirs.iteration_ms - ours.iteration_ms == pytest.approx(ours.stages[0].backward_ms)
    with pytest.raises(ValueError, match="unknown engine"):
        model.with_engine("horovod")  # type: ignore[arg-type]


def test_solver_and_simulator_agree_on_the_plans_it_emits() -> None:
    """A slow network (sends matter), plans the solver picks freely: its predicted iteration
    is within 2% of the event simulator's play of the same plan."""
    profile, cluster = _two_nodes(0.5)
    for batch in (8, 24):
        plan = solve(profile, cluster, batch, time_limit_s=20)
        played = simulate_plan(plan).iteration_time_ms
        assert plan.prediction.iteration_time_ms == pytest.approx(played, rel=0.02), batch


needs_calibration = pytest.mark.skipif(
    not (CALIBRATION / "measured_runs.csv").is_file(),
    reason="../shared/calibration (measured runs) is not present on this machine",
)


@needs_calibration
def test_a_mixed_type_run_prices_and_plays_alike() -> None:
    """run-31's plan (stages mixing RTX-2080 with RTX-3090 and with Titan RTX, tp 8, dp 2) on
    its own cluster: pinned through ``cost_plan`` and played by the simulator within 2%."""
    plan = cost_plan(
        OPT_350,
        CALIBRATION / "runs" / "run-31.yaml",
        stages="RTX-2080+RTX-3090:L0-11:tp8:dp2 | RTX-2080+Titan-RTX:L12-25:tp8:dp2",
        global_batch=256,
        micro_batch_size=2,
    )
    played = simulate_plan(plan).iteration_time_ms
    assert plan.prediction.iteration_time_ms == pytest.approx(played, rel=0.02)


@needs_calibration
def test_measured_runs_are_predicted_within_the_bench_bounds() -> None:
    """Every run of measured_runs.csv is costed with its plan pinned (none skipped): from the
    catalog alone each within 25% of the measured iteration, and with layer_times.csv attached
    each within 25% and the median within 10% (``make bench`` prints the table)."""
    from autoplan.calibrate.fidelity import fidelity_report
    from autoplan.calibrate.measured_runs import read_measured_runs
    from autoplan.files import read_json_model
    from autoplan.profile.schema import Profile

    runs = read_measured_runs(CALIBRATION / "measured_runs.csv")
    profile = read_json_model(OPT_350, Profile)
    report = fidelity_report(runs, {"OPT-350": profile}, CALIBRATION / "layer_times.csv")
    assert [r.run for r in report.runs] == [r.name for r in runs]
    catalog = [r.catalog_error for r in report.runs]
    layers = [r.measured_layers_error for r in report.runs]
    assert all(e is not None and math.isfinite(e) for e in layers)
    assert max(abs(e) for e in catalog) <= 0.25, catalog
    assert max(abs(e) for e in layers if e is not None) <= 0.25, layers
    assert statistics.median(abs(e) for e in layers if e is not None) <= 0.10
    # The gradient all-reduce alone, where it is most of the iteration (runs 31 and 34: tp 8
    # replicas reducing over 2.9 GB/s between nodes): within 10% of the measured term.
    by_name = {r.run: r for r in report.runs}
    for name in ("run-31", "run-34"):
        run = by_name[name]
        assert run.measured_grad_allreduce_s is not None
        ratio = run.predicted_grad_allreduce_s / run.measured_grad_allreduce_s
        assert abs(ratio - 1) <= 0.10, (name, ratio)
    # The runs' own simulator from the same table, beside ours: on every run whose stages are
    # of one GPU type, the two compositions agree within 1.5% (they differ on stages mixing
    # types: runs 28, 31, 34); the report's reference errors are its figures over measured.
    for run, row in zip(report.runs, runs, strict=True):
        assert row.reference_simulator_s is not None and run.reference_simulator_error is not None
        assert math.isclose(
            run.reference_simulator_error, row.reference_simulator_s / row.measured_iteration_s - 1
        )
        if "+" not in run.stages:
            assert run.measured_layers_s is not None
            assert abs(run.measured_layers_s / row.reference_simulator_s - 1) <= 0.015, run.run
    whole = report.summaries[-1]
    assert whole.group == "all" and whole.reference_median_abs_error is not None
    assert math.isclose(
        whole.reference_median_abs_error,
        statistics.median(abs(r.reference_simulator_error or 0.0) for r in report.runs),
    )


def test_megatron_table_1_within_ten_percent() -> None:
    """Megatron-LM SC'21 Table 1 (GPT 1.7B to 1T on A100-80GB, the paper's t/p/d and batch,
    full recompute): predicted TFLOP/s per GPU within 10% of the published figure on every row
    (``bench/megatron_table1.py`` says how each row is configured)."""
    from bench import megatron_table1 as megatron

    profiles = megatron.megatron_profiles()
    for row in megatron.MEGATRON_TABLE1:
        predicted = megatron.predict_row(row, profiles[row.model])
        assert abs(predicted.error) <= 0.10, (row.model, predicted.tflops_per_gpu)


def test_collectives_pay_the_stack_overhead_and_pcie_cards_their_bus() -> None:
    """A GPU type's per-step overhead adds to the cluster's link latency, and on PCIe cards a
    collective among more GPUs than one bridge joins runs at the type's PCIe bandwidth:
    a ring all-reduce of 1 MB over 4 GPUs then takes 6 steps × (5 + 20) µs + 1.5 × 1 MB / 5 GB/s."""
    from autoplan.cost.comm import ring_allreduce_ms
    from autoplan.cost.devices import device_classes

    card = gpu("CARD", 50.0, 24.0).model_copy(
        update={
            "pcie_collective_bandwidth_gb_per_s": 5.0,
            "nvlink_bridge_gpus": 2,
            "collective_step_overhead_us": 20.0,
        }
    )
    cluster = make_cluster([("n", card, 8, 1)], intra_gb_per_s=25.0)
    (dc,) = device_classes(cluster, {"CARD": card})
    assert dc.intra_node_latency_us == 5.0 + 20.0
    assert dc.collective_bandwidth_gb_per_s(2) == 25.0  # a bridged pair
    assert dc.collective_bandwidth_gb_per_s(4) == 5.0
    expected = 6 * 25e-3 + 1.5 * 1e6 / 5e9 * 1e3
    assert ring_allreduce_ms(1e6, 4, 5.0, dc.intra_node_latency_us) == pytest.approx(expected)


def test_cost_prices_a_configuration_for_both_engines() -> None:
    """One stage of 16 replicas over two nodes: the plan's prediction is autoplan's runtime's
    (the all-reduce's part the last backward hides is not paid); Megatron-DeepSpeed's pays
    the whole all-reduce after it."""
    from autoplan.api import price

    priced = price(
        ROOT / "profiles" / "gpt2-small.profile.json",
        "a100-v100",
        stages="A100-80GB*8+V100-32GB*8:L0-13:tp1",
        global_batch=32,
        micro_batch_size=1,
    )
    prediction = priced.plan.prediction
    ours, theirs = (
        priced.iteration_ms_by_engine["autoplan"],
        priced.iteration_ms_by_engine["megatron-deepspeed"],
    )
    assert ours == pytest.approx(prediction.iteration_time_ms)
    hidden = prediction.dp_allreduce_ms - prediction.breakdown.dp_comm_ms
    assert hidden > 0
    assert theirs == pytest.approx(ours + hidden)
