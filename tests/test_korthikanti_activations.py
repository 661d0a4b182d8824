"""Saved activations per block and tp rank against Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models"), Table 2, for every recompute mode with
sequence parallelism off and on.

Table 2, bytes per layer (s sequence, b micro-batch, h hidden, a heads, t tp degree):

- tensor parallel:                  sbh(10 + 24/t + 5as/(ht))
- tensor + sequence parallel:       sbh(34/t + 5as/(ht))
- tensor parallel + selective:      sbh(10 + 24/t)
- tensor + sequence + selective:    sbh(34/t)
- full recompute:                   2sbh (the block's input), 2sbh/t sequence-sharded

The zoo's GPT has no dropout: the two sbh dropout masks go (10 → 8, 34 → 32), and with the
s×s scores materialised (``attention='math'``, as Megatron-LM 2021 ran) 5as/h becomes 2as/h
(the softmax output, no dropout mask or dropout output). t = 1 is the paper's
"no parallelism" row, sbh(34 + 5as/h).
"""

from __future__ import annotations

import pytest

from autoplan.cost.layers import layer_cost
from autoplan.profile.profiler import profile_model
from tests.synthetic_profiles import gpu

S, B = 512, 1
H, A = 768, 12  # gpt2-small
SBH = S * B * H
SCORES = 2 * A * S / H  # 2as/h: the softmax output, per sbh


@pytest.fixture(scope="module")
def block():
    return profile_model("gpt2-small", S, B, "bf16", attention="math").layers[1]


def _saved(block, tp: int, sp: bool) -> dict[str, float]:
    cost = layer_cost(
        block,
        gpu("A", 100.0, 80.0),
        100.0,
        tp=tp,
        micro_batch_size=B,
        profile_micro_batch_size=B,
        sequence_parallel=sp,
    )
    return {mode: saved / SBH for mode, saved in cost.saved_bytes.items()}


@pytest.mark.parametrize("tp", [1, 2, 4, 6])
def test_table_2_without_sequence_parallelism(block, tp: int) -> None:
    saved = _saved(block, tp, sp=False)
    assert saved["none"] == pytest.approx(8 + 24 / tp + SCORES / tp, rel=2e-3)
    # Selective drops the attention core; what tp leaves replicated (the 8) stays whole.
    assert saved["selective"] == pytest.approx(8 + 24 / tp, rel=2e-3)
    assert saved["full"] == pytest.approx(2)


@pytest.mark.parametrize("tp", [2, 4, 6])
def test_table_2_with_sequence_parallelism(block, tp: int) -> None:
    saved = _saved(block, tp, sp=True)
    assert saved["none"] == pytest.approx(32 / tp + SCORES / tp, rel=2e-3)
    assert saved["selective"] == pytest.approx(32 / tp, rel=2e-3)
    assert saved["full"] == pytest.approx(2 / tp)
