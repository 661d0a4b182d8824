"""The parallelize step in one process: its order, and that it changes no numerics.

The executors' numerics under real parallelism (tp, cp, ep, DDP, FSDP2 over gloo) are the
torchrun tests' (test_runtime*.py, test_*_parallel_runtime.py); here, on a world of one rank,
what the step applies to a stage and in which order can be read off the modules it returns.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from autoplan.runtime.model_stage import build_full_model
from autoplan.runtime.parallelize import parallelize, stage_layouts
from autoplan.runtime.placement import rank_place
from autoplan.runtime.process_groups import ProcessGroups, build_mesh
from tests.plan_factory import make_plan

SEED = 3


@pytest.fixture(autouse=True)
def one_rank_world() -> Iterator[None]:
    """A gloo group of this process alone; none is left behind."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _wrappers(forward: object) -> list[str]:
    # functools.wraps leaves each wrapper's inner function in __wrapped__ (and copies its
    # names: the wrapper's own is its code's).
    names = []
    while hasattr(forward, "__wrapped__"):
        names.append(forward.__code__.co_qualname.split(".")[0])  # type: ignore[attr-defined]
        forward = forward.__wrapped__  # type: ignore[attr-defined]
    return names


def test_offload_wraps_recompute_on_every_block_and_only_blocks() -> None:
    plan = make_plan([6], recompute="full", offload=True)
    ranks = parallelize(plan, rank_place(plan, 0), ProcessGroups([]), torch.device("cpu"), SEED)
    (model,) = ranks.models
    assert ranks.modules == ranks.models  # one replica: no data-parallel wrapper
    layers = dict(model.layers.named_children())
    for name in ("block_0", "block_1", "block_2", "block_3"):
        assert _wrappers(layers[name].forward) == ["_offloaded", "_checkpointed"], name
    # Embedding and head keep their activations (recompute), offload still moves them.
    assert _wrappers(layers["embed"].forward) == ["_offloaded"]
    assert _wrappers(layers["head"].forward) == ["_offloaded"]


def test_a_parallelized_stage_computes_what_the_whole_model_does() -> None:
    plan = make_plan([6], recompute="selective", offload=True)
    ranks = parallelize(plan, rank_place(plan, 0), ProcessGroups([]), torch.device("cpu"), SEED)
    reference = build_full_model("gpt-tiny", "fp64", SEED)
    tokens = torch.randint(0, 128, (2, plan.inputs.seq_len))
    (model,) = ranks.modules
    ours, theirs = model(tokens), reference(tokens)
    assert torch.equal(ours, theirs)
    ours.square().mean().backward()
    theirs.square().mean().backward()
    for (name, mine), (_, other) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert mine.grad is not None and other.grad is not None
        torch.testing.assert_close(mine.grad, other.grad, rtol=0, atol=1e-15, msg=name)


def test_the_layouts_of_both_worlds_on_one_rank_apply_nothing_but_the_replicas_own() -> None:
    plan = make_plan([6], zero_stage=3)
    place = rank_place(plan, 0)
    cpu = torch.device("cpu")
    uniform = build_mesh(plan, cpu, plan.rank_map[0])
    for world in (uniform, ProcessGroups([])):
        (layout,) = stage_layouts(plan, place, world, [], cpu)
        assert layout.stage is plan.stages[0]
        # One replica of one GPU: no tp, no ring, no experts, nothing to shard over.
        assert (layout.tp_mesh, layout.cp_group, layout.expert) == (None, None, None)
        assert layout.data_parallel is None
