"""Experts placed by speed: an expert group spanning the two GPU types of a mixed stage, each
rank holding its own number of experts (``StageChoice.experts``,
``autoplan.cost.expert_parallel``), costed by hand: the expert work moved to the faster type,
the all-to-all's busiest rank, the routed experts' memory per rank."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.expert_parallel import (
    ExpertMember,
    ExpertSpan,
    alltoall_ms,
    expert_fractions,
    span_alltoall_ms,
)
from autoplan.cost.offload import group_of
from autoplan.profile.schema import ExpertProfile, LayerProfile
from autoplan.solve import SolveOptions, cost_model
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

OPTIONS = SolveOptions(top_k=1, zero_bubble=False, sequence_parallel=False)
EXPERTS = 8
ROUTED_SHARE = 0.9  # of a block's parameters, in its routed experts


def moe_layer(index: int, experts: int = EXPERTS, dispatch_bytes: int = 8 * 10**6) -> LayerProfile:
    """A block of 4e11 forward FLOPs whose routed experts do half of them and hold 90% of its
    80 M parameters (tp leaves them whole, as the zoo's grouped experts)."""
    base = layer(index, flops=4 * 10**11, params=80 * 10**6, saved=10**7, output=10**6)
    routed = int(base.param_count * ROUTED_SHARE)
    tp = base.tensor_parallel
    assert tp is not None
    return base.model_copy(
        update={
            "tensor_parallel": tp.model_copy(
                update={
                    "sharded_param_count": tp.sharded_param_count - routed,
                    "sharded_forward_flops": base.forward_flops // 2,
                    "sharded_backward_flops": base.backward_flops // 2,
                }
            ),
            "experts": ExpertProfile(
                num_experts=experts,
                top_k=2,
                capacity_factor=1.25,
                capacity_tokens=80,
                expert_param_count=routed,
                expert_forward_flops=base.forward_flops // (2 * experts),
                expert_backward_flops=base.backward_flops // (2 * experts),
                dispatch_bytes=dispatch_bytes,
            ),
        }
    )


def mixed_model(inter_gb_per_s: float = 100.0):
    """Two MoE blocks after an embedding on 4 fast (G0, 100 TFLOP/s) and 4 slow (G1, 50)
    GPUs, nodes joined at ``inter_gb_per_s``."""
    layers = [
        layer(0, flops=10**10, params=10**6, saved=10**7, output=10**6, kind="embedding"),
        moe_layer(1),
        moe_layer(2),
    ]
    cluster = make_cluster(
        [
            ("g0", gpu("G0", tflops=100.0, memory_gib=80.0), 4, 1),
            ("g1", gpu("G1", tflops=50.0, memory_gib=80.0), 4, 1),
        ],
        intra_gb_per_s=100.0,
        inter_gb_per_s=inter_gb_per_s,
    )
    profile = make_profile(layers)
    return profile, cost_model(profile, cluster, OPTIONS)


def mixed_stage(experts: tuple[int, ...], ep: int = 2, fast: int = 2, slow: int = 1):
    """One stage of every layer: one G0 replica taking ``fast`` samples and one G1 replica
    taking ``slow``, experts spanning the two at ep 2 (``experts`` per rank, by group)."""
    groups = (group_of(0, 1, 1, fast, "none"), group_of(1, 1, 1, slow, "none"))
    return StageChoice(0, 3, groups, zero_stage=0, ep=ep, experts=experts)


def test_the_all_to_all_waits_for_its_busiest_rank() -> None:
    # E = 8, shares 2 and 1, 5 experts on the fast rank and 3 on the slow, d = 1 MB:
    # fast sends (8 - 5)·2 = 6 MB and receives 5·1 = 5 MB; slow sends 5·1 = 5 MB and receives
    # 3·2 = 6 MB. One pairwise step each: 10 us + 6 MB / 10 GB/s = 0.61 ms.
    span = ExpertSpan((ExpertMember(0, 2, 5, 1), ExpertMember(1, 1, 3, 1)))
    assert (span.ep, span.samples, span.num_experts) == (2, 3, 8)
    links = ((10.0, 10.0), (10.0, 10.0))
    assert span_alltoall_ms(span, 1e6, links) == pytest.approx(0.01 + 6e6 / 10e9 * 1e3)
    # Even experts on equal shares: the even formula, (ep - 1)/ep of the slot buffer.
    even = ExpertSpan((ExpertMember(0, 1, 4, 1), ExpertMember(1, 1, 4, 1)))
    assert span_alltoall_ms(even, 1e6, links) == pytest.approx(alltoall_ms(8e6, 2, 10.0, 10.0))
    # A slower link on one side: that rank's time, which every rank waits for.
    assert span_alltoall_ms(span, 1e6, ((10.0, 10.0), (5.0, 10.0))) == pytest.approx(
        0.01 + 6e6 / 5e9 * 1e3
    )


def test_experts_are_half_of_the_block_on_any_tp() -> None:
    block = moe_layer(1)
    assert expert_fractions(block, 1) == pytest.approx((0.5, 0.5))
    # tp 2 halves the sharded half only: experts are 0.5 / 0.75 of what one GPU runs.
    assert expert_fractions(block, 2) == pytest.approx((0.5 / 0.75, 0.5 / 0.75))
    # A profile without the split shards everything: experts keep their half.
    unsplit = block.model_copy(
        update={
            "tensor_parallel": block.tensor_parallel.model_copy(  # type: ignore[union-attr]
                update={"sharded_forward_flops": None, "sharded_backward_flops": None}
            )
        }
    )
    assert expert_fractions(unsplit, 2) == pytest.approx((0.5, 0.5))


def test_expert_work_follows_the_experts_held() -> None:
    profile, model = mixed_model()
    base = model.evaluate(PlanConfig(1, "1f1b", 1, (dataclasses.replace(mixed_stage(()), ep=1),)))
    uneven = model.evaluate(PlanConfig(1, "1f1b", 1, (mixed_stage((5, 3)),)))
    span = ExpertSpan((ExpertMember(0, 2, 5, 1), ExpertMember(1, 1, 3, 1)))
    per_sample = 8e6 / (EXPERTS * profile.micro_batch_size)
    exchange = 2 * span_alltoall_ms(span, per_sample, model.span_links(span))
    for g, (share, held) in enumerate(((2, 5), (1, 3))):
        plain = model.tables(g, 1, share).layers
        costed = model.group_cost(mixed_stage((5, 3)), mixed_stage((5, 3)).groups[g])
        # Each MoE block: half its compute is experts, now held · S / (E · share) of it.
        ratio = held * 3 / (EXPERTS * share)
        expected = plain[0].forward_compute_ms + sum(
            c.forward_compute_ms * (0.5 + 0.5 * ratio) + exchange for c in plain[1:]
        )
        assert costed.forward_ms - model.pass_overhead_ms(g) == pytest.approx(expected)
        # Parameters: a rank keeps its experts of the 72 M routed per block.
        routed = int(80 * 10**6 * ROUTED_SHARE)
        assert uneven.stages[0].groups[g].params_per_gpu == pytest.approx(
            base.stages[0].groups[g].params_per_gpu - 2 * routed * (1 - held / EXPERTS)
        )
    # The fast rank runs 5/8 of 3 samples' expert slots (15/16 of its own 2's), the slow
    # one 3/8 of 3 (9/8 of its own 1's): the slow one is no longer twice the fast one.
    times = [g.work_ms for g in uneven.stages[0].groups]
    assert times[1] < 1.5 * times[0]


def test_experts_by_speed_beat_even_experts_on_a_fast_link() -> None:
    """G0 is twice G1 and takes twice the samples: 5 + 3 experts (nearest to 2:1 of 8) beat
    4 + 4, where the slow rank runs as many expert slots as the fast one; a split the other
    way (3 + 5) is slower still."""
    _, model = mixed_model()

    def stage_ms(experts: tuple[int, ...]) -> float:
        return model.evaluate(PlanConfig(1, "1f1b", 1, (mixed_stage(experts),))).stages[0].work_ms

    assert stage_ms((5, 3)) < stage_ms((4, 4)) < stage_ms((3, 5))
    assert min(range(1, EXPERTS), key=lambda x: stage_ms((x, EXPERTS - x))) in (5, 6)


def test_a_span_that_does_not_cut_the_groups_is_refused() -> None:
    _, model = mixed_model()
    groups = (group_of(0, 1, 2, 1, "none"), group_of(1, 1, 1, 1, "none"))
    # 3 replicas at ep 2: not a whole number of expert groups.
    stage = StageChoice(0, 3, groups, ep=2, experts=(3, 2))
    with pytest.raises(ValueError, match="must give every one of"):
        model.evaluate(PlanConfig(1, "1f1b", 1, (stage,)))
