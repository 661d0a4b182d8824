"""Memory model vs a real CPU run for recompute and activation offload (issue 12: predicted
saved-activation bytes within 10% of what the run holds), in process on one rank: gpt-tiny in
fp32, the runtime's own recompute and offload applied to every pipeline layer, the runtime's
loss.

What the forward leaves alive is measured with MemTracker (``bytes_held_after``), a mechanism
apart from the profiler's saved-tensor count. On a CPU machine the offload's "host" copies are
CPU buffers too, so they are in that figure; what the hooks copied (their counter) is taken off
to get what stays on the device. The model's figures: ``resident_saved_bytes`` (the device)
and ``parked_bytes`` (host memory) summed over the layers.

- none / full: the device holds the saved bytes of that mode (full: the blocks' inputs, and
  what the embedding and the head keep, which the runtime does not recompute);
- none+offload / full+offload: the device holds only the loss's log-softmax (saved outside
  the head's forward, where the hooks are), host memory the rest.

The SP (tp 2) and ZeRO-2/3 (model states) checks are in test_runtime_sequence_parallel.py and
test_runtime_zero.py.
"""

from __future__ import annotations

import pytest
import torch

from autoplan.cost.layers import layer_cost
from autoplan.cost.offload import mode_key, parked_bytes, resident_saved_bytes
from autoplan.profile import profile_model
from autoplan.profile.live_memory import bytes_held_after
from autoplan.runtime.loss import loss_function
from autoplan.runtime.offload import apply_offload
from autoplan.runtime.recompute import apply_recompute
from autoplan.zoo import get_model_spec
from tests.synthetic_profiles import gpu

BATCH, SEQ = 4, 64


@pytest.fixture(scope="module")
def layers():
    profile = profile_model("gpt-tiny", SEQ, BATCH, "fp32")
    return [
        layer_cost(
            layer,
            gpu("A", 100.0, 80.0),
            100.0,
            tp=1,
            micro_batch_size=BATCH,
            profile_micro_batch_size=BATCH,
        )
        for layer in profile.layers
    ]


@pytest.mark.parametrize(
    ("recompute", "offload"), [("none", False), ("full", False), ("none", True), ("full", True)]
)
def test_device_and_host_bytes_match_the_model(layers, recompute: str, offload: bool) -> None:
    spec = get_model_spec("gpt-tiny")
    ids = spec.example_input(BATCH, SEQ)
    targets = torch.zeros(BATCH, SEQ, dtype=torch.long)
    torch.manual_seed(0)
    model = spec.build()
    apply_recompute(model, recompute)  # type: ignore[arg-type]
    counter = apply_offload(model, offload)
    loss = loss_function("cross_entropy")
    held, value = bytes_held_after(model, lambda: loss(model(ids), targets))
    value.backward()  # the graph was real
    host = counter.packed_bytes if counter is not None else 0
    device = held - host

    mode = mode_key(recompute, offload)
    predicted_device = sum(resident_saved_bytes(c, mode) for c in layers)
    predicted_host = sum(parked_bytes(c, mode) for c in layers)
    if not offload:
        # The profile counts the token ids the embedding saves; the run allocated them before.
        predicted_device -= ids.numel() * ids.element_size()
    assert device == pytest.approx(predicted_device, rel=0.10), (device, predicted_device)
    assert host == pytest.approx(predicted_host, rel=0.10), (host, predicted_host)
    assert device > 100_000  # real figures: the loss's log-softmax alone is 128 KiB
    if offload:
        assert host > 200_000 and device < held / 2
