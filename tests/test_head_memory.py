"""The head's memory under tensor parallelism: its logits stay split by vocabulary (the loss
runs under loss_parallel), so its output and the loss's temporaries are one tp rank's shard,
as the long-context bench's terms read them (bench/bench_long_context.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.model import CostModel
from autoplan.profile.profiler import profile_model
from tests.synthetic_profiles import gpu, make_cluster

A = gpu("A", 100.0, 80.0)
LLAMA = Path(__file__).parent / "data" / "hf" / "llama-3.1-8b" / "config.json"


def test_a_vocabulary_split_head_holds_its_shard_of_the_logits() -> None:
    # Llama-3.1-8B's head (vocabulary 128,256) at 128 tokens: its logits dwarf the rest.
    profile = profile_model(f"hf:{LLAMA}", 128, 1, "bf16")
    cluster = make_cluster([("a", A, 8, 1)])
    model = CostModel(profile, cluster, gpu_specs(cluster))
    head = len(profile.layers) - 1
    assert profile.layers[head].kind == "head"
    whole = model.tables(0, 1, 1).layers[head]
    split = model.tables(0, 8, 1).layers[head]
    logits = profile.layers[head].output_activation_bytes  # [1, 128, 128256] in bf16
    assert logits == 128 * 128_256 * 2
    assert whole.output_bytes == pytest.approx(logits)
    assert split.output_bytes == pytest.approx(logits / 8)
    # The loss keeps the fp32 log-softmax of its shard.
    loss = profile.layers[head].loss_saved_activation_bytes
    assert split.loss_saved_bytes == pytest.approx(loss / 8)
    # The transient is the loss's two fp32 temporaries of the shard (each about a quarter of
    # the whole bf16 logits at tp 8), not two copies of the whole logits (what the head's
    # output counted before it was split: 2 × 32.8 MB).
    assert model.transient_bytes(split, "none") == pytest.approx(2 * split.logits_bytes)
    assert model.transient_bytes(split, "none") < 0.7 * logits
