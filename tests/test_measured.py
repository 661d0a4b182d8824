"""Measured layer times: lookup by (GPU type, tp, micro-batch), interpolation, and that the
cost model prefers them to its model where both exist (autoplan.cost.measured, layers)."""

from __future__ import annotations

import pytest

from autoplan.cost.layers import layer_cost
from autoplan.cost.measured import interpolate, matches_device, measured_pass
from autoplan.profile.schema import MeasuredTimes
from autoplan.solve import SolveOptions, cost_model
from tests.layer_time import layer_time_ms
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

A100 = gpu("A100-80GB", tflops=300.0, memory_gib=80, bandwidth=2000.0)


def _entry(device: str, tp: int, mbs: int | None, forward: float, backward: float):
    return MeasuredTimes(
        device_name=device,
        forward_ms=forward,
        backward_ms=backward,
        tensor_parallel_degree=tp,
        micro_batch_size=mbs,
    )


def test_interpolation_between_and_beyond_measured_sizes() -> None:
    points = [(1, 3.0), (2, 5.0), (8, 17.0)]
    assert interpolate(points, 2) == 5.0  # measured
    assert interpolate(points, 4) == pytest.approx(9.0)  # linear between 2 and 8
    assert interpolate(points, 16) == pytest.approx(34.0)  # per-sample time of the largest
    # Below the smallest: proportional with one point; else the line through the two
    # smallest, kept between proportional scaling and the smallest's time.
    assert interpolate([(4, 8.0)], 2) == pytest.approx(4.0)  # proportional
    assert interpolate([(2, 5.0), (4, 9.0)], 1) == pytest.approx(3.0)  # affine, within bounds
    assert interpolate([(2, 5.0), (4, 6.0)], 1) == pytest.approx(4.5)  # affine
    assert interpolate([(2, 2.0), (4, 8.0)], 1) == pytest.approx(1.0)  # not below proportional


def test_measured_time_is_preferred_over_the_model() -> None:
    base = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**6)
    modelled = layer_cost(base, A100, 300.0, tp=1, micro_batch_size=4, profile_micro_batch_size=1)
    assert not modelled.measured
    measured_layer = base.model_copy(
        update={
            "measured": [
                _entry("A100-80GB", 1, 2, 7.0, 9.0),
                _entry("A100-80GB", 1, 8, 25.0, 33.0),
            ]
        }
    )
    cost = layer_cost(
        measured_layer, A100, 300.0, tp=1, micro_batch_size=4, profile_micro_batch_size=1
    )
    assert cost.measured
    assert cost.forward_compute_ms == pytest.approx(7.0 + 18.0 * 2 / 6)
    assert cost.backward_compute_ms == pytest.approx(9.0 + 24.0 * 2 / 6)
    assert cost.forward_compute_ms != pytest.approx(modelled.forward_compute_ms)
    # Another GPU type has no measurement: modelled.
    other = gpu("H100", tflops=900.0, memory_gib=80)
    assert not layer_cost(
        measured_layer, other, 900.0, tp=1, micro_batch_size=4, profile_micro_batch_size=1
    ).measured


def test_a_measurement_at_the_same_tp_includes_its_communication() -> None:
    base = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**8)
    entries = [_entry("A100-80GB", 1, 1, 8.0, 16.0), _entry("A100-80GB", 4, 1, 3.0, 5.0)]
    measured_layer = base.model_copy(update={"measured": entries})
    at_tp4 = layer_cost(
        measured_layer,
        A100,
        300.0,
        tp=4,
        micro_batch_size=1,
        profile_micro_batch_size=1,
        intra_node_bandwidth_gb_per_s=100.0,
    )
    assert (at_tp4.forward_ms(), at_tp4.backward_ms("none")) == pytest.approx((3.0, 5.0))
    assert at_tp4.forward_tp_comm_ms == 0.0
    # At tp 2 only the single-GPU time exists: its share of the work plus modelled comm.
    at_tp2 = layer_cost(
        measured_layer,
        A100,
        300.0,
        tp=2,
        micro_batch_size=1,
        profile_micro_batch_size=1,
        intra_node_bandwidth_gb_per_s=100.0,
    )
    assert at_tp2.measured
    assert at_tp2.forward_compute_ms == pytest.approx(4.0)
    assert at_tp2.forward_tp_comm_ms > 0


def test_old_entries_are_at_the_profiles_micro_batch_and_tp_1() -> None:
    base = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**6)
    old = MeasuredTimes(device_name="NVIDIA A100-SXM4-80GB", forward_ms=7.0, backward_ms=9.0)
    found = measured_pass(base.model_copy(update={"measured": [old]}), "A100-80GB", 1, 6, 2)
    assert found is not None and not found.exact
    assert (found.forward_ms, found.backward_ms) == pytest.approx((21.0, 27.0))
    assert matches_device("A100-80GB", "A100-80GB")
    assert not matches_device("A100-40GB", "NVIDIA A100-SXM4-80GB")


def test_the_plan_cost_model_uses_measured_layers_and_says_so() -> None:
    layers = [layer(i, flops=10**12, params=10**6, saved=10**6, output=10**6) for i in range(3)]
    layers[1] = layers[1].model_copy(update={"measured": [_entry("A100-80GB", 1, 1, 50.0, 100.0)]})
    profile = make_profile(layers)
    model = cost_model(profile, make_cluster([("a", A100, 8, 1)]), SolveOptions())
    table = model.tables(0, 1, 1)
    assert [c.measured for c in table.layers] == [False, True, False]
    assert table.layers[1].forward_compute_ms == 50.0
    assert table.layers[0].forward_compute_ms == pytest.approx(
        layer_time_ms(layers[0], A100, "bf16", 1, 1)[0]
    )


def test_the_plan_says_which_stages_are_measured_and_show_prints_it() -> None:
    """Layer 1 of 3 measured on the A100: a one-stage plan's replicas report 1 measured layer,
    and ``show``'s stage table marks the stage 'measured 1/3'; a profile with every layer
    measured reads 'measured', one with none 'modelled'."""
    from autoplan.solve import solve
    from autoplan.view.plan_tables import stages_section

    def plan_for(measured: set[int]):
        layers = [layer(i, flops=10**12, params=10**6, saved=10**6, output=10**6) for i in range(3)]
        for i in measured:
            entry = _entry("A100-80GB", 1, 1, 50.0, 100.0)
            layers[i] = layers[i].model_copy(update={"measured": [entry]})
        options = SolveOptions(pp=1, dp=1, tp=1, micro_batch_size=1)
        return solve(make_profile(layers), make_cluster([("a", A100, 1, 1)]), 4, options)

    for measured, expected in (({1}, "measured 1/3"), ({0, 1, 2}, "measured"), (set(), "modelled")):
        plan = plan_for(measured)
        (timing,) = plan.prediction.stage_timings
        assert [r.measured_layers for r in timing.replicas] == [len(measured)]
        section = stages_section(plan)
        assert section.columns[-1] == "times"
        assert [row[-1] for row in section.rows] == [expected]
