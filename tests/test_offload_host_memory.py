"""Offload's host-memory bound (autoplan.cost.offload): what a GPU parks in host memory is at
most its share of the node's RAM less the headroom.

- the catalog and the cluster file carry the figure (per GPU in the catalog, per node in a
  node group, shared by its GPUs);
- the cost model: parked bytes = micro-batches in flight × the stage's offloaded saved bytes,
  a violation naming host memory when they exceed the share;
- the search: the solver equals brute force (every mode per stage, costed by ``evaluate``)
  with host memory from nothing to plenty, in both spaces, and the mode it takes moves from
  none+offload to full recompute as host memory shrinks;
- where only host memory leaves no plan, the one-line error says so.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from autoplan.cluster.catalog import gpu_specs, load_catalog
from autoplan.cluster.schema import NodeGroup
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel
from autoplan.cost.offload import HOST_MEMORY_HEADROOM
from autoplan.errors import InfeasibleError
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import OPTIONS, brute_force, brute_force_hetero

GIB = 1024**3
SAVED = 4 * 10**8  # per layer and sample: three layers of it do not fit a 1 GiB GPU


def _inputs(host_gib_per_gpu: float, gpus: int = 1):
    layers = [layer(i, flops=2 * 10**11, params=10**6, saved=SAVED, output=10**6) for i in range(3)]
    spec = gpu("G0", tflops=25.0, memory_gib=1.0, host_link=20.0).model_copy(
        update={"host_memory_gib_per_gpu": host_gib_per_gpu}
    )
    return make_profile(layers), make_cluster([("g0", spec, gpus, 1)])


def _model(host_gib_per_gpu: float, gpus: int = 1) -> CostModel:
    profile, cluster = _inputs(host_gib_per_gpu, gpus)
    return cost_model(profile, cluster, OPTIONS)


def test_catalog_and_cluster_file_carry_host_memory() -> None:
    catalog = load_catalog()
    assert catalog["A100-80GB"].host_memory_gib_per_gpu == 256  # DGX A100: 2 TB / 8
    assert catalog["A100-40GB"].host_memory_gib_per_gpu == 128  # DGX A100 320GB: 1 TB / 8
    assert catalog["H100"].host_memory_gib_per_gpu == 256
    assert all(spec.host_memory_gib_per_gpu > 0 for spec in catalog.values())
    profile, cluster = _inputs(8.0, gpus=4)
    model = CostModel(profile, cluster, gpu_specs(cluster))
    budget = 8.0 * GIB * (1 - HOST_MEMORY_HEADROOM)
    assert model.host_budget_bytes(0) == pytest.approx(budget)
    # A node group's own RAM is shared by its GPUs.
    group = cluster.node_groups[0].model_copy(update={"host_memory_gib": 64.0})
    node = cluster.model_copy(update={"node_groups": [group]})
    model = CostModel(profile, node, gpu_specs(node))
    assert model.host_budget_bytes(0) == pytest.approx(16 * GIB * (1 - HOST_MEMORY_HEADROOM))
    assert math.isinf(model.without_host_limit().host_budget_bytes(0))
    with pytest.raises(ValidationError, match="host_memory_gib"):
        NodeGroup(
            name="n", gpu="G0", gpus_per_node=1, intra_node_bandwidth_gb_per_s=5, host_memory_gib=-1
        )


def _two_stages(group: ReplicaGroup) -> PlanConfig:
    return PlanConfig(4, "1f1b", 1, (StageChoice(0, 2, (group,)), StageChoice(2, 3, (group,))))


def test_parked_bytes_are_the_micro_batches_in_flight_times_the_offloaded_saved_bytes() -> None:
    model = _model(1.0, gpus=2)
    # pp 2, 1F1B over 4 micro-batches: rank 0 holds 2 in flight, rank 1 one.
    for recompute, per_layer in (("none", SAVED), ("full", 10**6)):
        group = ReplicaGroup(0, 1, 1, 1, recompute, offload=True)
        config = _two_stages(group)
        cost = model.evaluate(config)
        first, second = cost.memory
        assert first.host_bytes == pytest.approx(2 * 2 * per_layer)
        assert second.host_bytes == pytest.approx(1 * per_layer)
        # Offload parks the saved activations; torch pipelining's receive buffers (of the
        # output gradients, every micro-batch) stay on the device.
        stage = config.stages[0]
        buffers = model.transfer_buffer_bytes(
            stage.groups[0].micro_batch_size, stage.layer_start, stage.layer_end, 4
        )
        assert buffers > 0
        assert first.activations_bytes == pytest.approx(buffers)
        budget = GIB * (1 - HOST_MEMORY_HEADROOM)
        assert first.host_fits == (first.host_bytes <= budget)
    # none+offload parks 1.6 GB on rank 0 of a 0.86 GB share: refused, and the message says so.
    group = ReplicaGroup(0, 1, 1, 1, "none", offload=True)
    config = _two_stages(group)
    cost = model.evaluate(config)
    assert not cost.feasible
    assert cost.memory[0].device_fits and not cost.memory[0].host_fits
    assert cost.memory[1].fits  # 0.4 GB parked
    assert any("host memory" in v and "pipeline rank 0" in v for v in cost.violations)
    assert model.without_host_limit().evaluate(config).feasible


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("host_gib", [0.0, 0.001, 1.0, 2.0, 64.0])
def test_solver_equals_brute_force_under_the_host_bound(host_gib: float, gpus: int) -> None:
    model = _model(host_gib, gpus)
    batch = 2
    uniform = brute_force(model, batch, OPTIONS)
    hetero = min(uniform, brute_force_hetero(model, batch))
    modes = set()
    for space, expected in (("uniform", uniform), ("heterogeneous", hetero)):
        options = OPTIONS.model_copy(update={"space": space})
        found = [c for c in solve_candidates(model, batch, options).candidates if c.cost.feasible]
        assert found and math.isfinite(expected), space
        assert found[0].iteration_ms == pytest.approx(expected, rel=1e-9), space
        for stage in found[0].config.stages:
            for group in stage.groups:
                modes.add((group.recompute, group.offload))
                assert found[0].cost.memory[0].host_fits
    if host_gib == 64.0 and gpus == 1:
        assert modes == {("none", True)}  # plenty: no recompute, everything parked
    if host_gib == 1.0 and gpus == 1:
        assert all(recompute == "full" for recompute, _ in modes)  # none+offload parks too much
    if host_gib <= 0.001:
        assert all(not offload for _, offload in modes)  # nothing parks in no host memory


def test_infeasible_message_names_host_memory() -> None:
    profile, cluster = _inputs(1.0)
    pinned = SolveOptions(recompute="none", offload=True)
    with pytest.raises(InfeasibleError, match="host memory") as caught:
        solve(profile, cluster, 2, pinned)
    assert "\n" not in str(caught.value)
    # With room on the host the same pins solve.
    profile, roomy = _inputs(64.0)
    assert solve(profile, roomy, 2, pinned).parallelism is not None
