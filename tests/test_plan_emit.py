"""The emitter writes memory estimates whose parts add up to their total, byte for byte."""

from autoplan.cost.model import RankMemory
from autoplan.plan.emit import _memory_estimate


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
