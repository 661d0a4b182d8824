"""The search over sub-block units (issue 13, DawnPiper's finer grain) is as exact as over blocks.

- Oracle: on random small sub-block profiles (an embedding, then blocks of two parts each whose
  boundary is the residual stream) the solver's best equals brute force over the whole space
  (uniform and heterogeneous), as tests/test_solver_oracle.py proves for block profiles.
- Finer is never worse: every block split is a sub-block split, so the best plan over the
  parts of a model is never slower than the best over its blocks (random instances, where the
  block profile is the parts merged, and gpt-tiny profiled for real at both grains). Two
  things make it hold with offload and every ZeRO level in the space: a stage holding both
  parts of a block is costed as the block (``autoplan.cost.block_parts``: the launch floor
  and offload's overlap are a max per pass, not a sum over the parts), and the search at
  sub-block grain starts from the block plan (``autoplan.solve.granularity``), so a ZeRO level
  picked per stage by its per-micro-batch work cannot land a finer split on a slower plan.
  tests/test_sub_block_seed.py checks the same with launch floors that bind.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.profile.schema import LayerProfile, Profile, TensorParallelProfile
from autoplan.solve import cost_model, solve_candidates
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

# The oracle's own options: the space its brute force enumerates (the exact one).
from tests.test_solver_oracle import OPTIONS, brute_force, brute_force_hetero


def _part(index: int, block: int, part: str, draw, residual: int, tp: int | None) -> LayerProfile:
    base = layer(
        index,
        flops=draw(st.integers(1, 50)) * 10**10,
        params=draw(st.integers(1, 40)) * 10**6,
        saved=draw(st.integers(1, 40)) * 10**7,
        output=residual,
        tp_divides=tp,
    )
    update: dict[str, object] = {"name": f"layers.block_{block}:{part}", "block_index": block + 1}
    update["part"] = part
    if base.tensor_parallel is not None:
        # One all-reduce per part and direction (Megatron: after out, after down).
        update["tensor_parallel"] = base.tensor_parallel.model_copy(
            update={"forward_allreduce_count": 1, "backward_allreduce_count": 1}
        )
    return base.model_copy(update=update)


@st.composite
def sub_block_profiles(draw) -> Profile:
    """An embedding and one or two blocks as attn and mlp units (3 or 5 units)."""
    residual = draw(st.integers(1, 20)) * 10**6
    tp = draw(st.sampled_from([None, 2, 4]))
    units = [
        layer(
            0,
            flops=draw(st.integers(1, 10)) * 10**9,
            params=draw(st.integers(1, 40)) * 10**6,
            saved=draw(st.integers(1, 10)) * 10**6,
            output=residual,
            tp_divides=tp,
            kind="embedding",
        )
    ]
    for block in range(draw(st.integers(1, 2))):
        for part in ("attn", "mlp"):
            units.append(_part(len(units), block, part, draw, residual, tp))
    profile = make_profile(units)
    model = profile.model.model_copy(update={"granularity": "sub-block"})
    return profile.model_copy(update={"model": model})


@st.composite
def clusters(draw, max_types: int = 2):
    groups = []
    for index in range(draw(st.integers(1, max_types))):
        spec = gpu(
            f"G{index}",
            tflops=draw(st.sampled_from([10.0, 25.0, 60.0])),
            memory_gib=draw(st.sampled_from([0.3, 0.6, 1.5, 8.0])),
            bandwidth=draw(st.sampled_from([100.0, 1000.0])),
        )
        groups.append((f"g{index}", spec, draw(st.sampled_from([1, 2])), draw(st.integers(1, 2))))
    return make_cluster(
        groups,
        intra_gb_per_s=draw(st.sampled_from([5.0, 100.0])),
        inter_gb_per_s=draw(st.sampled_from([0.5, 10.0])),
    )


def _best_ms(
    profile: Profile, cluster, batch: int, space: str = "heterogeneous", **pins: object
) -> float:
    model = cost_model(profile, cluster, OPTIONS)
    options = OPTIONS.model_copy(update={"space": space, **pins})
    found = [c for c in solve_candidates(model, batch, options).candidates if c.cost.feasible]
    return found[0].iteration_ms if found else math.inf


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(sub_block_profiles(), clusters(), st.sampled_from([1, 2, 4]))
def test_solver_on_sub_block_units_equals_brute_force(profile, cluster, batch) -> None:
    model = cost_model(profile, cluster, OPTIONS)
    uniform = brute_force(model, batch, OPTIONS)
    hetero = brute_force_hetero(model, batch)
    for space, expected in (("uniform", uniform), ("heterogeneous", min(uniform, hetero))):
        found = _best_ms(profile, cluster, batch, space)
        if math.isinf(expected):
            assert math.isinf(found), space
            continue
        assert math.isclose(found, expected, rel_tol=1e-9), (space, found, expected)


def _merged(attn: LayerProfile, mlp: LayerProfile, index: int) -> LayerProfile:
    """The block the two parts make: figures summed, the attn part's input, the mlp's output."""
    summed = {
        field: getattr(attn, field) + getattr(mlp, field)
        for field in (
            "forward_flops",
            "backward_flops",
            "forward_bytes_moved",
            "backward_bytes_moved",
            "param_count",
            "param_bytes",
            "saved_activation_bytes",
            "selective_recompute_saved_bytes",
            "selective_recompute_flops",
        )
    }
    tp: TensorParallelProfile | None = None
    if attn.tensor_parallel is not None and mlp.tensor_parallel is not None:
        a, m = attn.tensor_parallel, mlp.tensor_parallel
        tp = a.model_copy(
            update={
                "sharded_param_count": a.sharded_param_count + m.sharded_param_count,
                "sharded_saved_activation_bytes": a.sharded_saved_activation_bytes
                + m.sharded_saved_activation_bytes,
                "forward_allreduce_count": a.forward_allreduce_count + m.forward_allreduce_count,
                "backward_allreduce_count": a.backward_allreduce_count + m.backward_allreduce_count,
            }
        )
    return attn.model_copy(
        update={
            **summed,
            "index": index,
            "name": f"layers.block_{attn.block_index}",
            "block_index": None,
            "part": None,
            "input_activation_bytes": attn.input_activation_bytes,
            "output_activation_bytes": mlp.output_activation_bytes,
            "tensor_parallel": tp,
        }
    )


def _block_profile(sub: Profile) -> Profile:
    units = sub.layers
    layers = [units[0].model_copy()]
    for i in range(1, len(units), 2):
        layers.append(_merged(units[i], units[i + 1], len(layers)))
    return make_profile(layers)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(sub_block_profiles(), clusters(max_types=2), st.sampled_from([2, 4]))
def test_sub_block_plan_is_never_slower_than_the_block_plan(profile, cluster, batch) -> None:
    block_ms = _best_ms(_block_profile(profile), cluster, batch)
    sub_ms = _best_ms(profile, cluster, batch)
    assert sub_ms <= block_ms * (1 + 1e-9), (sub_ms, block_ms)


@pytest.fixture(scope="module")
def gpt_tiny_profiles() -> tuple[Profile, Profile]:
    from autoplan.profile.profiler import profile_model

    return (
        profile_model("gpt-tiny", 16, 1, "fp32"),
        profile_model("gpt-tiny", 16, 1, "fp32", granularity="sub-block"),
    )


def test_profiled_parts_add_up_to_their_blocks(gpt_tiny_profiles) -> None:
    block, sub = gpt_tiny_profiles
    assert sub.model.granularity == "sub-block" and block.model.granularity == "block"
    assert len(sub.layers) == 2 + 2 * (len(block.layers) - 2)
    assert [(u.block_index, u.part) for u in sub.layers[:3]] == [
        (None, None),
        (1, "attn"),
        (1, "mlp"),
    ]
    assert sub.layers[1].name == "layers.block_0:attn"
    for whole in block.layers[1:-1]:
        attn, mlp = (u for u in sub.layers if u.block_index == whole.index)
        for field in ("forward_flops", "backward_flops", "param_count", "saved_activation_bytes"):
            assert getattr(attn, field) + getattr(mlp, field) == getattr(whole, field), field
        # What crosses mid-block is the residual stream: the block's boundary activation.
        assert attn.output_activation_bytes == whole.output_activation_bytes
        assert attn.input_activation_bytes == mlp.input_activation_bytes
        assert attn.tensor_parallel is not None and mlp.tensor_parallel is not None
        assert attn.tensor_parallel.forward_allreduce_count == 1
        assert mlp.tensor_parallel.forward_allreduce_count == 1
    assert sub.totals == block.totals


def test_profiled_sub_block_plan_is_never_slower(gpt_tiny_profiles) -> None:
    block, sub = gpt_tiny_profiles
    # Three GPUs of different speeds: 4 blocks split 3 ways balance better by halves.
    cluster = make_cluster(
        [
            ("fast", gpu("F", 60.0, 8.0), 1, 1),
            ("mid", gpu("M", 25.0, 8.0), 1, 1),
            ("slow", gpu("S", 10.0, 8.0), 1, 1),
        ],
        inter_gb_per_s=100.0,
    )
    block_ms = _best_ms(block, cluster, 4)
    sub_ms = _best_ms(sub, cluster, 4)
    assert sub_ms <= block_ms * (1 + 1e-9), (sub_ms, block_ms)
