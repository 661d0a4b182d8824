"""Predicted peak memory against what real runs took: the fidelity report's memory columns,
and the memory terms of the cost model by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    # 2 × 10^7 bytes, stage 1 one; both the transient 2 × 10^6 (twice a layer's output) and
    # torch pipelining's 4 receive buffers of 10^6 (stage 0's output gradients, stage 1's
    # inputs: CostModel.transfer_buffer_bytes).
    layers = [layer(i, flops=10**12, params=10**8, saved=10**7, output=10**6) for i in range(4)]
    cluster = make_cluster([("a", _typed("A", 1.0), 1, 1), ("b", _typed("B", 3.0), 1, 1)])
    model = cost_model(make_profile(layers), cluster, SolveOptions())
    a, b = (next(c.index for c in model.classes if c.gpu.name == n) for n in "AB")
    stages = (
        StageChoice(0, 2, (ReplicaGroup(a, 1, 1, 1, "none"),)),
        StageChoice(2, 4, (ReplicaGroup(b, 1, 1, 1, "none"),)),
    )
    cost = model.evaluate(PlanConfig(4, "1f1b", 1, stages))
    first = 3.2e9 + 2 * 2e7 + 2e6 + 4 * 1e6
    second = 3.2e9 + 1 * 2e7 + 2e6 + 4 * 1e6
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


def _head_model(engine: str):
    # A block, then a head whose forward ends in the per-token loss (10^3 bytes out) and
    # saves its input (10^6 bytes) and the logits' fp32 softmax (10^8 bytes) per sample.
    block = layer(0, flops=10**12, params=10**6, saved=10**7, output=10**6, tp_divides=None)
    head = layer(1, flops=10**12, params=10**6, saved=10**8 + 10**6, output=10**3, kind="head")
    head = head.model_copy(
        update={"input_activation_bytes": 10**6, "tensor_parallel": None}, deep=True
    )
    cluster = make_cluster([("a", _typed("A", 1.0), 1, 1)])
    return cost_model(make_profile([block, head]), cluster, SolveOptions()).with_engine(engine)


@pytest.mark.parametrize(
    ("engine", "samples", "copies"),
    [
        # F.cross_entropy's backward: nll_loss's and log_softmax's gradients at once.
        ("autoplan", 1, 2),
        ("autoplan", 2, 2),
        # Megatron's cross-entropy: the max-shifted copy; with 2 samples, also the
        # contiguous [samples, sequence, vocabulary] copy of its [s, b, v] logits.
        ("megatron-deepspeed", 1, 1),
        ("megatron-deepspeed", 2, 2),
    ],
)
def test_the_loss_temporaries_by_engine_by_hand(engine: str, samples: int, copies: int) -> None:
    model = _head_model(engine)
    block, head = model.tables(0, 1, samples).layers
    assert head.logits_bytes == pytest.approx(samples * 10**8)
    assert block.logits_bytes == 0
    assert model.transient_bytes(head, "none") == pytest.approx(copies * samples * 10**8)
    # Under full recompute a layer's transient is at least all it saves (the head is not
    # recomputed: its softmax and input, 10^8 + 10^6 bytes per sample).
    full = max(copies * 10**8, 10**8 + 10**6)
    assert model.transient_bytes(head, "full") == pytest.approx(samples * full)
    # Other layers keep twice their output (the gradients in and out of their backward).
    assert model.transient_bytes(block, "none") == pytest.approx(2 * samples * 10**6)
    # The one stage holds both layers: its largest transient is the loss's.
    stage = StageChoice(0, 2, (ReplicaGroup(0, 1, 1, samples, "none"),))
    memory = model.evaluate(PlanConfig(2, "1f1b", 1, (stage,))).memory[0]
    assert memory.transient_bytes == pytest.approx(copies * samples * 10**8)


def _fidelity():
    from autoplan.calibrate.fidelity import fidelity_report
    from autoplan.calibrate.measured_runs import read_measured_runs
    from autoplan.files import read_json_model
    from autoplan.profile.schema import Profile

    runs = read_measured_runs(CALIBRATION / "measured_runs.csv")
    return runs, fidelity_report(runs, {"OPT-350": read_json_model(OPT_350, Profile)})


@needs_calibration
def test_every_gh200_run_fits_what_the_model_predicts_within_five_percent() -> None:
    """Predicted peak per GPU with the reserve against measured_max_memory_gib, as
    Megatron-DeepSpeed ran them: on the 15 GH200 runs never below measured − 5% and never
    above measured + 10% (today: −3.4% to +4.2%). The mixed RTX runs are not bounded here:
    runs 27 and 28 took less than their activations alone without recompute (next test), and
    on runs 30, 31 and 34 (tp 8 over 8-GPU PCIe nodes) the model is 22-26% under the
    measurement, which no term of it explains yet."""
    _, report = _fidelity()
    assert report.engine == "megatron-deepspeed"
    gh200 = [r for r in report.runs if r.site == "clariden"]
    assert len(gh200) == 15
    for r in gh200:
        assert r.memory_error is not None
        assert -0.05 <= r.memory_error <= 0.10, (r.run, r.memory_error)


@needs_calibration
def test_runs_27_and_28_held_less_than_their_activations_without_recompute() -> None:
    """The two 4-GPU RTX runs (tp 2) measured 3.85 and 5.54 GiB, less than the activations
    their plans keep in flight without recompute alone (8.95 and 10.17 GiB: 2 samples of 11
    to 26 fp32 layers at tp 2): they must have checkpointed activations, which the table does
    not record. Costed with full recompute, the model gives them above the measurement and
    within 15% (with reserve; today +11% and +6.5%: the head, which checkpointing leaves
    alone, holds its logits and the loss's two copies of them)."""
    import dataclasses

    from autoplan.calibrate.measured_runs import pinned_config, run_cluster
    from autoplan.cluster.catalog import gpu_specs
    from autoplan.cost.model import CostModel
    from autoplan.files import read_json_model
    from autoplan.profile.schema import Profile

    profile = read_json_model(OPT_350, Profile)
    runs, _ = _fidelity()
    for run in (r for r in runs if r.name in ("run-27", "run-28")):
        cluster = run_cluster(run)
        model = CostModel(profile, cluster, gpu_specs(cluster)).with_engine("megatron-deepspeed")
        config = pinned_config(run, model)
        measured = run.measured_max_memory_gib
        assert measured is not None
        plain = model.evaluate(config)
        assert max(m.activations_bytes for m in plain.memory) / GIB > measured
        stages = tuple(
            dataclasses.replace(
                s, groups=tuple(dataclasses.replace(g, recompute="full") for g in s.groups)
            )
            for s in config.stages
        )
        full = model.evaluate(dataclasses.replace(config, stages=stages))
        _, with_reserve = predicted_peak_bytes(full)
        assert -0.05 <= with_reserve / GIB / measured - 1 <= 0.15, (run.name, with_reserve / GIB)


@pytest.mark.parametrize(
    ("replicas", "level", "gradients"),
    [
        (1, 0, 1),  # nothing to all-reduce: no DDP
        (2, 0, 1),  # DDP, its buckets the gradients themselves (gradient_as_bucket_view)
        (2, 1, 1),  # DDP + ZeroRedundancyOptimizer
        (2, 2, 1 / 2),  # FSDP2 reduce-scatters the shard
        (2, 3, 1 / 2),
    ],
)
def test_gradients_by_zero_level_by_hand(replicas: int, level: int, gradients: float) -> None:
    from autoplan.cost import sharding

    # 10^6 fp32 parameters, Adam's 8 bytes each.
    weights, grads, _ = sharding.static_bytes(10**6, replicas, level, 4, 8)
    assert grads == pytest.approx(gradients * 4 * 10**6)
    per_param = sharding.static_bytes_per_param(replicas, level, 4, 8)
    assert per_param * 10**6 == pytest.approx(
        sum(sharding.static_bytes(10**6, replicas, level, 4, 8))
        + sharding.gathered_bytes(10**6, replicas, level, 4)
    )
    assert weights == pytest.approx(4 * 10**6 / (replicas if level >= 2 else 1))


def test_the_runtimes_ddp_holds_the_gradients_once() -> None:
    """The cost model counts a replicated stage's gradients once (``sharding.static_bytes``):
    DDP as the runtime builds it (``data_parallel.replicate``: gradients as views into its
    buckets) allocates no second copy, where a plain DDP holds every gradient once more in its
    25 MiB buckets. A one-process gloo group, in a process of its own
    (``tests/ddp_buckets_driver.py`` says why); the buckets read by the runtime's
    ``gradient_bucket_bytes``, the model states by ``model_state_bytes``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "ddp_buckets_driver.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    params = figures["params"]
    assert figures["plain_bucket_bytes"] == params * 4  # the copy the runtime avoids
    assert figures["runtime_bucket_bytes"] == 0
    # parameters + gradients, each once: nothing else holds them.
    assert figures["runtime_state_bytes"] == 2 * params * 4
