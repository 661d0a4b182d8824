"""Context parallelism executed (autoplan.runtime.context_parallel): ring attention over a cp
group of 2 real torchrun processes on gloo, float64, against one process on whole sequences:
loss, logits and every gradient within 1e-10, for learned positions (gpt-tiny) and RoPE with
grouped-query attention (llama-tiny); and the load-balanced chunks worked by hand."""

from __future__ import annotations

import json

import pytest
import torch

from autoplan.errors import InputError
from autoplan.runtime.context_parallel import chunk_positions
from tests.torchrun_plans import torchrun

TOLERANCE = 1e-10


def test_chunks_pair_the_head_of_the_sequence_with_its_tail() -> None:
    # 16 tokens, cp 2: four pieces of 4; rank 0 holds pieces 0 and 3, rank 1 pieces 1 and 2.
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    with pytest.raises(InputError, match="2 × 3 chunks do not divide the sequence length 16"):
        chunk_positions(16, 3, 0)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp")
    torchrun("cp_driver.py", [str(out)], 2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_cp2_step_equals_one_process(results: list[dict], model: str) -> None:
    for rank in results:
        found = rank[model]
        assert found["loss"] <= TOLERANCE
        assert found["logits"] <= TOLERANCE
        assert found["gradients"] <= TOLERANCE
        assert found["parameters"] > 10
        # Without the ring the rank's tokens would see only each other: far off.
        assert found["control_logits"] > 1e-3
    assert results[0][model]["loss_value"] == results[1][model]["loss_value"]
