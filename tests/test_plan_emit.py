"""The emitter writes memory estimates whose parts add up to their total, byte for byte, and
figures the validator accepts however small they are."""

import pytest

from autoplan.cost.model import RankMemory
from autoplan.plan.validate import plan_problems
from autoplan.solve import SolveOptions, solve
from autoplan.solve.emit import _memory_estimate
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile


def test_rounded_memory_parts_add_up_to_the_total() -> None:
    # Each part rounds down while the float total (4.2) would round to 4: the sum of the
    # rounded parts is 3, and the written total must say 3, or the validator rejects the plan.
    memory = RankMemory(
        pipeline_rank=0,
        gpu_type="A100-80GB",
        weights_bytes=1.4,
        gradients_bytes=1.4,
        optimizer_bytes=1.4,
        activations_bytes=0.0,
        transient_bytes=0.0,
        capacity_bytes=100,
    )
    estimate = _memory_estimate(memory)
    assert estimate.total_bytes == 3
    parts = (
        estimate.weights_bytes,
        estimate.gradients_bytes,
        estimate.optimizer_bytes,
        estimate.activations_bytes,
        estimate.transient_bytes,
    )
    assert sum(parts) == estimate.total_bytes


@pytest.mark.parametrize("peak_tflops", [3.1e-5, 3.3e-5])
def test_a_tiny_throughput_keeps_the_digits_the_validator_checks(peak_tflops: float) -> None:
    # A GPU this slow (a loaded CPU, measured) runs at ~1.5e-5 TFLOP/s: six decimals alone
    # wrote 1.5e-05 for 1.549e-05, 3% off, and `autoplan run` refused the plan solve wrote.
    profile = transformer_profile(blocks=2, hidden=64, seq_len=16, vocab=256, heads=4)
    cluster = make_cluster([("slow", gpu("SLOW", peak_tflops, 1, bandwidth=1), 4, 1)])
    plan = solve(profile, cluster, 8, SolveOptions())
    assert plan.prediction.tflops_per_gpu < 1e-4
    assert plan_problems(plan, profile) == []
