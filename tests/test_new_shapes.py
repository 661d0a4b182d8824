"""The catalog on a shape it was not fitted on (``bench/new_shapes.py``): GPT-Neo-2.7B's block on
GH200 against the per-layer times Sailor's authors published."""

from __future__ import annotations

import pytest

from bench.new_shapes import GPT_NEO_GH200_MS, gpt_neo_gh200_checks


def test_every_published_row_is_priced() -> None:
    checks = gpt_neo_gh200_checks()
    assert {(c.micro_batch, c.tp) for c in checks} == set(GPT_NEO_GH200_MS)
    assert all(min(c.predicted_ms) > 0 for c in checks)


@pytest.mark.parametrize("micro_batch", [1, 16, 32])
def test_a_gh200_node_at_tp_4_within_10_percent(micro_batch: int) -> None:
    """tp 4 (a GH200 node, as every measured GH200 run uses it): forward + backward within 10%
    at micro-batches 1 to 32."""
    (check,) = [c for c in gpt_neo_gh200_checks() if (c.micro_batch, c.tp) == (micro_batch, 4)]
    assert check.ratio == pytest.approx(1.0, abs=0.10), check
