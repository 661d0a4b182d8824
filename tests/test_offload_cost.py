"""Activation offload in the cost model and the search (autoplan.cost.offload).

- the model: exposed copy time = what the copies take beyond the compute they hide behind,
  per layer and direction; no saved activations resident; the layers in transit counted;
- the catalog and cluster file carry the host-link bandwidth (per-node-group override, one-line
  errors for bad values);
- the search: where only offload fits, the solver finds it and equals brute force (both
  spaces); pinned off, nothing fits; pinned on, every group offloads; offload with selective
  recompute is refused in one line.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import NodeGroup
from autoplan.cost.model import CostModel
from autoplan.cost.offload import (
    copy_ms,
    mode_backward_ms,
    mode_forward_ms,
    offload_exposed_ms,
    resident_saved_bytes,
    searched_modes,
    split_mode,
    transit_bytes,
)
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import brute_force, brute_force_hetero


def _model(host_link: float, memory_gib: float, saved: int = 4 * 10**8, gpus: int = 2) -> CostModel:
    layers = [layer(i, flops=2 * 10**11, params=10**6, saved=saved, output=10**6) for i in range(3)]
    spec = gpu("G0", tflops=25.0, memory_gib=memory_gib, host_link=host_link)
    cluster = make_cluster([("g0", spec, gpus, 1)])
    return cost_model(make_profile(layers), cluster, SolveOptions())


def test_exposed_time_is_the_copy_beyond_the_compute() -> None:
    for host in (1.0, 5.0, 500.0):
        model = _model(host, 8.0)
        c = model.tables(0, 1, 1).layers[1]
        copy = copy_ms(c.saved_bytes["none"], host)
        assert copy == pytest.approx(c.saved_bytes["none"] / host / 1e6)
        fwd, bwd = offload_exposed_ms(c, "none", host)
        assert fwd == pytest.approx(max(0.0, copy - c.forward_ms()))
        assert bwd == pytest.approx(max(0.0, copy - c.backward_ms("none")))
        assert mode_forward_ms(c, "none+offload", host) == pytest.approx(c.forward_ms() + fwd)
        assert mode_backward_ms(c, "none+offload", host) == pytest.approx(
            c.backward_ms("none") + bwd
        )
        # Full recompute offloads only the block inputs, behind a backward that redoes forward.
        fwd_full, bwd_full = offload_exposed_ms(c, "full", host)
        assert bwd_full == max(0.0, copy_ms(c.saved_bytes["full"], host) - c.backward_ms("full"))
        assert fwd_full <= fwd
        assert resident_saved_bytes(c, "none+offload") == 0.0
        assert resident_saved_bytes(c, "none") == c.saved_bytes["none"]
        assert transit_bytes(c, "none+offload") == 2 * c.saved_bytes["none"]
    # A slow link exposes time; a fast one hides it all.
    slow, fast = _model(1.0, 8.0), _model(500.0, 8.0)
    slow_c, fast_c = slow.tables(0, 1, 1), fast.tables(0, 1, 1)
    assert slow_c.work["none+offload"][-1] > slow_c.work["none"][-1]
    assert fast_c.work["none+offload"][-1] == pytest.approx(fast_c.work["none"][-1])


def test_tables_and_the_layer_by_layer_path_agree() -> None:
    from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice

    model = _model(2.0, 8.0)
    for recompute in ("none", "full"):
        group = ReplicaGroup(0, 1, 1, 1, recompute, offload=True)
        stage = StageChoice(0, 3, (group,))
        cost = model.group_cost(stage, group)
        tables = model.tables(0, 1, 1)
        mode = f"{recompute}+offload"
        assert cost.work_ms == pytest.approx(tables.work[mode][3])
        assert cost.saved_bytes == 0.0
        plain = model.group_cost(stage, ReplicaGroup(0, 1, 1, 1, recompute))
        memory = model.evaluate(PlanConfig(1, "1f1b", 1, (stage,))).memory[0]
        assert memory.activations_bytes == 0.0
        assert cost.transient_bytes > plain.transient_bytes  # the layers in transit


def test_host_link_in_catalog_and_cluster_file() -> None:
    from autoplan.cluster.catalog import load_catalog

    catalog = load_catalog()
    assert catalog["A100-80GB"].host_link_bandwidth_gb_per_s == 25
    assert catalog["V100-32GB"].host_link_bandwidth_gb_per_s == 12
    assert catalog["H100"].host_link_bandwidth_gb_per_s == 50
    spec = gpu("G0", tflops=25.0, memory_gib=8.0, host_link=30.0)
    cluster = make_cluster([("g0", spec, 2, 1)])
    assert (
        CostModel(
            make_profile([layer(0, flops=10**9, params=10, saved=10, output=10)]),
            cluster,
            gpu_specs(cluster),
        )
        .classes[0]
        .host_link_bandwidth_gb_per_s
        == 30.0
    )
    override = cluster.model_copy(
        update={
            "node_groups": [
                cluster.node_groups[0].model_copy(update={"host_link_bandwidth_gb_per_s": 6.0})
            ]
        }
    )
    model = CostModel(
        make_profile([layer(0, flops=10**9, params=10, saved=10, output=10)]),
        override,
        gpu_specs(override),
    )
    assert model.classes[0].host_link_bandwidth_gb_per_s == 6.0
    with pytest.raises(ValidationError, match="host_link_bandwidth_gb_per_s"):
        NodeGroup(
            name="n",
            gpu="G0",
            gpus_per_node=1,
            intra_node_bandwidth_gb_per_s=5,
            host_link_bandwidth_gb_per_s=0,
        )


def test_only_offload_fits_and_the_solver_equals_brute_force() -> None:
    # 3 layers of 0.4 GB saved each on 1 GiB GPUs: without recompute only offload fits (0.8 GB
    # in transit), and it is faster than full recompute (the link hides most copies).
    model = _model(host_link=20.0, memory_gib=1.0, gpus=1)
    batch = 2
    for space in ("uniform", "heterogeneous"):
        options = SolveOptions(top_k=1, space=space)
        found = solve_candidates(model, batch, options)
        assert found.candidates, space
        best = found.candidates[0].config
        assert all(g.offload for s in best.stages for g in s.groups), best.summary()
        expected = brute_force(model, batch, options) if space == "uniform" else None
        if space == "heterogeneous":
            expected = brute_force_hetero(model, batch)
        assert math.isfinite(expected)
        assert model.evaluate(best).iteration_ms == pytest.approx(expected, rel=1e-9)
        # Without offload only full recompute fits, and it is slower.
        off = solve_candidates(model, batch, options.model_copy(update={"offload": False}))
        assert all(g.recompute == "full" for s in off.candidates[0].config.stages for g in s.groups)
        assert off.candidates[0].iteration_ms > model.evaluate(best).iteration_ms
        plain = options.model_copy(update={"offload": False, "recompute": "none"})
        assert not solve_candidates(model, batch, plain).candidates
    # Where everything fits, a slow link makes offload lose and the solver avoids it.
    roomy = _model(host_link=0.5, memory_gib=8.0)
    best = solve_candidates(roomy, batch, SolveOptions(top_k=1)).candidates[0].config
    assert not any(g.offload for s in best.stages for g in s.groups)
    forced = (
        solve_candidates(roomy, batch, SolveOptions(top_k=1, offload=True)).candidates[0].config
    )
    assert all(g.offload for s in forced.stages for g in s.groups)
    assert roomy.evaluate(forced).iteration_ms > roomy.evaluate(best).iteration_ms


def test_modes_and_pins() -> None:
    assert searched_modes(("none", "selective", "full"), None) == (
        "none",
        "selective",
        "full",
        "none+offload",
        "full+offload",
    )
    assert searched_modes(("none", "selective", "full"), True) == ("none+offload", "full+offload")
    assert searched_modes(("selective",), False) == ("selective",)
    assert split_mode("full+offload") == ("full", True)
    with pytest.raises(ValidationError, match="offload pairs with recompute none or full"):
        SolveOptions(offload=True, recompute="selective")
    assert SolveOptions(offload=False).pinned() == {"offload": "False"}
