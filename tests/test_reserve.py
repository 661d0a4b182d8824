"""Memory headroom: no plan may use a GPU type's reserve (CUDA context, NCCL buffers,
fragmentation), whatever sets it: the catalog, the cluster file or --reserve-gb."""

from __future__ import annotations

import itertools

import pytest

from autoplan.cluster.catalog import gpu_specs, load_catalog
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.solve import SolveOptions, cost_model
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

GIB = 1024**3


# Reserves measured on real runs instead of the rule (profiles/gpus.yaml says how).
MEASURED_RESERVES_GIB = {"GH200": 4.25}


def test_every_catalog_type_reserves_what_the_catalog_rule_gives() -> None:
    # profiles/gpus.yaml: 0.75 GiB (CUDA context, NCCL buffers) + 2% of the device's memory,
    # to the nearest 0.25 GiB: 1 GiB on 8-16 GiB cards, 4.5 GiB on the 192 GiB MI300X; or
    # what real runs measured, never less than the rule.
    for name, spec in load_catalog().items():
        rule = round((0.75 + 0.02 * spec.memory_gib) * 4) / 4
        assert spec.memory_reserve_gib == MEASURED_RESERVES_GIB.get(name, rule), name
        assert rule <= spec.memory_reserve_gib < 0.15 * spec.memory_gib, name


def _model(reserve_gib: float, memory_gib: float = 10.0, **options: object):
    spec = gpu("G", tflops=100.0, memory_gib=memory_gib).model_copy(
        update={"memory_reserve_gib": reserve_gib}
    )
    # 4 layers of 10^8 parameters: 16 bytes each in bf16 with Adam, 1.6 GB per layer.
    layers = [layer(i, flops=10**12, params=10**8, saved=10**7, output=10**6) for i in range(4)]
    return cost_model(
        make_profile(layers), make_cluster([("g", spec, 4, 1)]), SolveOptions(**options)
    )


def _config(pp: int, recompute: str = "none", mbs: int = 1) -> PlanConfig:
    group = (ReplicaGroup(0, 1, 1, mbs, recompute),)
    bounds = [round(i * 4 / pp) for i in range(pp + 1)]
    stages = tuple(StageChoice(bounds[i], bounds[i + 1], group) for i in range(pp))
    return PlanConfig(4, "1f1b", 1, stages)


def test_usable_memory_is_capacity_less_reserve() -> None:
    model = _model(2.0)
    assert model.capacity_bytes(0) == 10 * GIB
    assert model.reserved_bytes(0) == 2 * GIB
    assert model.usable_bytes(0) == 8 * GIB


def test_a_plan_that_needs_the_reserve_does_not_fit() -> None:
    # One stage of all 4 layers: 6.4 GB (6.0 GiB) of model state and activations, under
    # 10 GiB but over 10 - 5 GiB.
    config = _config(1)
    without = _model(0.0).evaluate(config)
    assert without.feasible
    need = max(m.total_bytes for m in without.memory)
    assert 5 * GIB < need < 10 * GIB
    with_reserve = _model(5.0).evaluate(config)
    assert not with_reserve.feasible
    assert "reserved" in with_reserve.violations[0]
    memory = with_reserve.memory[0]
    assert not memory.fits and memory.reserved_bytes == 5 * GIB
    assert memory.total_bytes <= memory.capacity_bytes  # it would fit, were nothing reserved


@pytest.mark.parametrize("reserve", [0.0, 1.0, 2.5, 4.0, 6.0])
def test_no_feasible_configuration_uses_the_reserve(reserve: float) -> None:
    model = _model(reserve)
    for pp, recompute, mbs in itertools.product((1, 2, 4), ("none", "full"), (1, 2, 4)):
        cost = model.evaluate(_config(pp, recompute, mbs))
        for memory in cost.memory:
            assert memory.fits == (memory.total_bytes + memory.reserved_bytes <= 10 * GIB)
            if cost.feasible:
                assert memory.total_bytes <= model.usable_bytes(0)


def test_reserve_overrides_cluster_file_and_solve_option() -> None:
    spec = gpu("G", tflops=100.0, memory_gib=10.0).model_copy(update={"memory_reserve_gib": 1.0})
    cluster = make_cluster([("g", spec, 4, 1)])
    assert gpu_specs(cluster)["G"].memory_reserve_gib == 1.0
    assert (
        gpu_specs(cluster)["H100"].memory_reserve_gib == load_catalog()["H100"].memory_reserve_gib
    )
    wide = cluster.model_copy(update={"memory_reserve_gib": 3.0})
    assert {s.memory_reserve_gib for s in gpu_specs(wide).values()} == {3.0}
    # --reserve-gb (GB, not GiB) wins over both.
    model = _model(1.0, reserve_gb=5.0)
    assert model.reserved_bytes(0) == int(5e9)
