"""The interleaved uniform path chooses each rank's (recompute, offload) mode as the rest of
the search does: the fastest that fits, not the first that fits in the list's order (where
none+offload comes after full recompute, so a rank that only fits with recompute or offload
got full recompute even where offload hides its copies and is faster).

The oracle is ``tests.test_solver_oracle.brute_force``: every mode per rank of the interleaved
split, each configuration costed by ``evaluate`` (host-memory bound included).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.solve import cost_model, solve_candidates
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import OPTIONS, brute_force

INTERLEAVED = OPTIONS.model_copy(
    update={"space": "uniform", "schedule": "interleaved_1f1b", "pp": 2}
)


def _model(saved: list[int], memory_gib: float, host_link: float, host_gib: float, per_node: int):
    layers = [
        layer(i, flops=2 * 10**11, params=10**6, saved=s, output=10**6, tp_divides=None)
        for i, s in enumerate(saved)
    ]
    spec = gpu("G0", tflops=25.0, memory_gib=memory_gib, host_link=host_link).model_copy(
        update={"host_memory_gib_per_gpu": host_gib}
    )
    cluster = make_cluster([("g0", spec, per_node, 2 // per_node)])
    return cost_model(make_profile(layers), cluster, INTERLEAVED)


def _check(model, batch: int) -> list:
    expected = brute_force(model, batch, INTERLEAVED)
    found = [c for c in solve_candidates(model, batch, INTERLEAVED).candidates if c.cost.feasible]
    if math.isinf(expected):
        assert not found
        return []
    assert found, f"brute force found {expected} ms; the solver found nothing"
    assert found[0].config.chunks == 2
    assert found[0].iteration_ms == pytest.approx(expected, rel=1e-9), found[0].config.summary()
    return found


def test_offload_beats_full_recompute_where_the_link_hides_it() -> None:
    # 4 layers of 0.4 GB saved, two chunks a rank, 1 GiB GPUs: no rank fits without recompute
    # or offload; a fast host link hides the copies, so none+offload is the fastest that fits
    # (the list order took full recompute).
    model = _model([4 * 10**8] * 4, 1.0, 50.0, 64.0, per_node=2)
    found = _check(model, 4)
    modes = {(g.recompute, g.offload) for s in found[0].config.stages for g in s.groups}
    assert modes == {("none", True)}


@st.composite
def instances(draw):
    saved = [draw(st.integers(1, 60)) * 10**7 for _ in range(4)]
    return (
        saved,
        draw(st.sampled_from([0.3, 0.6, 1.0, 1.5, 8.0])),
        draw(st.sampled_from([1.0, 5.0, 50.0])),
        draw(st.sampled_from([0.0, 0.5, 2.0, 64.0])),
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([2, 4])),
    )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(instances())
def test_interleaved_solver_equals_brute_force(instance) -> None:
    saved, memory_gib, host_link, host_gib, per_node, batch = instance
    _check(_model(saved, memory_gib, host_link, host_gib, per_node), batch)
