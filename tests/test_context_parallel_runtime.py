"""Context parallelism executed (autoplan.runtime.context_parallel): ring attention over a cp
group of 2 real processes on gloo, float64, against one process on whole sequences:
loss, logits and every gradient within 1e-10, for learned positions (gpt-tiny) and RoPE with
grouped-query attention (llama-tiny), with equal chunks and with a 3:1 split (uneven chunks,
as a cp group across two GPU types runs); and the load-balanced chunks worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.errors import InputError
from autoplan.plan.schema import IdleGpus, Plan
from autoplan.plan.validate import plan_problems
from autoplan.runtime.check import check_runnable
from autoplan.runtime.context_parallel import chunk_positions
from autoplan.runtime.data import training_batches
from autoplan.view.plan_tables import replicas_text
from tests.cp_driver import SPLITS, SPLITS_OF_3, result_key
from tests.distributed_driver import STEPS
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans, run_ranks
from tests.runtime_models import HF_DECODER_LAYERS
from tests.single_process_reference import assert_run_equals_reference
from tests.test_context_span_family import solved_family_dp_plan, solved_family_plan

TOLERANCE = 1e-10


def test_chunks_pair_the_head_of_the_sequence_with_its_tail() -> None:
    # 16 tokens, cp 2: four pieces of 4; rank 0 holds pieces 0 and 3, rank 1 pieces 1 and 2.
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    with pytest.raises(InputError, match="2 × 3 chunks do not divide the sequence length 16"):
        chunk_positions(16, 3, 0)


def test_uneven_chunks_mirror_pieces_of_each_ranks_half() -> None:
    # 16 tokens split 12:4: rank 0 holds 6 from the start and 6 from the end, rank 1 the
    # middle 4 (2 + 2), so each rank's causal work is its tokens × 16 / 2.
    assert chunk_positions(16, 2, 0, (12, 4)).tolist() == [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1, (12, 4)).tolist() == [6, 7, 8, 9]
    assert chunk_positions(16, 2, 0, (4, 12)).tolist() == [0, 1, 14, 15]
    for tokens in [(6, 2, 8), (2, 12, 2)]:
        pieces = [chunk_positions(16, 3, r, tokens) for r in range(3)]
        assert sorted(torch.cat(pieces).tolist()) == list(range(16))
        for r, piece in enumerate(pieces):
            # Query i sees i + 1 keys: the pair's work is t_r × (s + 1) / 2, whatever its offset.
            assert int((piece + 1).sum()) == tokens[r] * 17 // 2
    # Equal counts are the even chunks exactly.
    for r in range(3):
        assert torch.equal(chunk_positions(24, 3, r, (8, 8, 8)), chunk_positions(24, 3, r))
    for bad in [(10, 4), (11, 5), (16,), (16, 0)]:
        with pytest.raises(InputError, match="positive even counts"):
            chunk_positions(16, 2, 0, bad)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp")
    run_ranks("cp_driver.py", [str(out)], 2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.parametrize("tokens", SPLITS)
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_cp2_step_equals_one_process(
    results: list[dict], model: str, tokens: tuple[int, ...] | None
) -> None:
    key = result_key(model, tokens)
    for rank, found in enumerate(r[key] for r in results):
        assert found["loss"] <= TOLERANCE
        assert found["logits"] <= TOLERANCE
        assert found["gradients"] <= TOLERANCE
        assert found["parameters"] > 10
        assert found["tokens"] == (8 if tokens is None else tokens[rank])
        # Without the ring the rank's tokens would see only each other: far off.
        assert found["control_logits"] > 1e-3
    assert results[0][key]["loss_value"] == results[1][key]["loss_value"]


@pytest.fixture(scope="module")
def results_of_3(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp3")
    run_ranks("cp_driver.py", [str(out)], 3)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]


@pytest.mark.distributed
@pytest.mark.parametrize("tokens", SPLITS_OF_3)
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_cp3_of_three_chunk_sizes_equals_one_process(
    results_of_3: list[dict], model: str, tokens: tuple[int, ...]
) -> None:
    key = result_key(model, tokens)
    for rank, found in enumerate(r[key] for r in results_of_3):
        assert found["tokens"] == tokens[rank]
        assert max(found["loss"], found["logits"], found["gradients"]) <= TOLERANCE
        assert found["control_logits"] > 1e-3


# ---- plans with cp through ``autoplan.runtime.train`` (the mesh executor) -------------------


def _as_cp(plan: Plan) -> Plan:
    """``plan`` (dp 2) with its two replicas as the two cp ranks of one replica: the same
    ranks, in the same (pp, dp, cp, tp) order, one replica taking the whole micro-batch."""
    stages = []
    for stage in plan.stages:
        first, second = stage.replicas
        merged = first.model_copy(
            update={
                "context_parallel_degree": 2,
                "ranks": first.ranks + second.ranks,
                "micro_batch_size": first.micro_batch_size + second.micro_batch_size,
            }
        )
        stages.append(stage.model_copy(update={"replicas": [merged]}))
    entries = [
        entry.model_copy(update={"dp_index": 0, "cp_index": entry.dp_index})
        for entry in plan.rank_map
    ]
    prediction = plan.prediction.model_copy(
        update={
            "memory": [
                m.model_copy(update={"micro_batch_size": plan.parallelism.micro_batch_size})
                for m in plan.prediction.memory
            ],
            "stage_timings": [
                t.model_copy(update={"replicas": t.replicas[:1]})
                for t in plan.prediction.stage_timings
            ],
        }
    )
    return plan.model_copy(update={"stages": stages, "rank_map": entries, "prediction": prediction})


# ---- a cp group across two GPU types (uneven chunks, the faster type holding more) ---------


def _spanning_plan() -> Plan:
    """One stage on cpu-hetero: a cp group of a cpu-fast and a cpu-slow rank (two nodes,
    consecutive ranks: one (pp, dp, cp, tp) mesh), 12 of the 16 tokens on the fast one."""
    plan = make_stages_plan(
        [6],
        [[ReplicaSpec(1, 2, node=0), ReplicaSpec(1, 2, node=1)]],
        num_micro_batches=2,
        cluster=load_cluster(example_cluster_path("cpu-hetero")),
    )
    idle = [
        IdleGpus(gpu_type=t, count=1, reason="one GPU of each type is enough for the test")
        for t in ("cpu-fast", "cpu-slow")
    ]
    plan = plan.model_copy(
        update={"prediction": plan.prediction.model_copy(update={"idle_gpus": idle})}
    )
    return _uneven(_as_cp(plan), [12, 4])


def test_a_spanning_cp_group_is_a_valid_mesh_and_shown_by_type() -> None:
    plan = _spanning_plan()
    (replica,) = plan.stages[0].replicas
    assert [plan.rank_map[r].gpu_type for r in replica.ranks] == ["cpu-fast", "cpu-slow"]
    assert plan_problems(plan) == []
    assert plan.mesh_shape() == (1, 2, 1)
    text = replicas_text(plan.stages[0], {e.rank: e.gpu_type for e in plan.rank_map})
    assert text == "cpu-fast tp1 cp2 (cpu-fast 12 + cpu-slow 4 tokens) × 1 (micro-batch 4)"
    # Without the rank map the types are unknown: the counts alone.
    assert "cp2 (12 + 4 tokens)" in replicas_text(plan.stages[0])
    # Without context_tokens the cp group must sit on one node.
    even = plan.model_copy(
        update={
            "stages": [
                plan.stages[0].model_copy(
                    update={"replicas": [replica.model_copy(update={"context_tokens": None})]}
                )
            ]
        }
    )
    message = "\n".join(plan_problems(even))
    assert "rank 1 says (pipeline 0, dp 0, cp 1, tp 0, slow-0, cpu-slow)" in message


def _uneven(plan: Plan, tokens: list[int]) -> Plan:
    """``plan`` with every cp replica's chunks of ``tokens`` (the same at every stage)."""
    stages = [
        stage.model_copy(
            update={
                "replicas": [
                    r.model_copy(update={"context_tokens": tokens}) for r in stage.replicas
                ]
            }
        )
        for stage in plan.stages
    ]
    return plan.model_copy(update={"stages": stages})


def _cp_plans() -> dict[str, Plan]:
    return {
        # world 4: cp 2 x pp 2 with uneven chunks, 12 of the 16 tokens on cp rank 0 (as the
        # faster GPU type of a cp group across two would hold), 1F1B over 4 micro-batches
        "cp2_pp2_uneven": _uneven(
            _as_cp(make_plan([3, 3], data_parallel=2, num_micro_batches=4)), [12, 4]
        ),
        # world 2: a cp group across a cpu-fast and a cpu-slow node, by hand (12:4) and as
        # autoplan solve chooses it where no node holds the sequence (64 tokens, written by
        # autoplan.solve.context_span_plan: tests/test_context_span_family.py)
        "span_fast_slow": _spanning_plan(),
        "span_solved": solved_family_plan(),
        # world 4: two such groups as data-parallel replicas on two node pairs, as autoplan
        # solve chooses them for two samples (DDP over the 2 x 2 cp ranks)
        "span_solved_dp2": solved_family_dp_plan(),
        # world 2: a factory decoder (a plain-sum loss: each rank's part weighted by cp, so
        # that DDP's average over the cp ranks is the sum's gradient, not half of it; its
        # unused targets not split), equal chunks and 12:4
        "factory_cp2": _factory_cp2(),
        "factory_cp2_uneven": _uneven(_factory_cp2(), [12, 4]),
        # world 2: cp 2 alone, full recompute (the ring reruns inside backward)
        "cp2_full_recompute": _as_cp(
            make_plan([6], data_parallel=2, num_micro_batches=2, recompute="full")
        ),
        # world 8: cp 2 x tp 2 x pp 2, with sequence parallelism in the tp groups (the ring
        # runs on the heads of the rank's tp shard; SP's all-gathers rebuild the chunk)
        "cp2_tp2_pp2_sp": _as_cp(
            make_plan(
                [3, 3],
                data_parallel=2,
                tensor_parallel=2,
                num_micro_batches=4,
                sequence_parallel=True,
            )
        ),
    }


def _factory_cp2() -> Plan:
    """A factory decoder (Hugging Face layout, a plain-sum loss) as one cp 2 replica."""
    return _as_cp(
        make_plan(
            [7],
            model="tests.runtime_models:hf_decoder",
            layer_modules=HF_DECODER_LAYERS,
            data_parallel=2,
            num_micro_batches=2,
        )
    )


def test_a_factory_input_without_the_sequence_is_refused_in_one_line() -> None:
    # mlp_stack takes (batch, 8 features): nothing along which to split a sequence.
    plan = _as_cp(make_plan([2, 2], model="tests.runtime_models:mlp_stack", data_parallel=2))
    check_runnable(plan)  # the plan is well formed; its data is what cp cannot split
    with pytest.raises(InputError, match=r"cp 2\) splits inputs along a second dimension"):
        next(training_batches(plan, 1))
    # A factory of token sequences takes equal and uneven chunks alike (a plain sum adds up).
    check_runnable(_uneven(_factory_cp2(), [12, 4]))


@pytest.fixture(scope="module")
def cp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_cp_plans(), tmp_path_factory.mktemp("cp_runs"), timeout_s=400)


def test_cp_plans_are_valid_cp_meshes() -> None:  # (dp, cp, tp): cp 2 in every plan
    for plan in _cp_plans().values():
        assert plan_problems(plan) == []
        shape = plan.mesh_shape()
        assert shape is not None and shape[1] == 2 and plan.uniform_shape() is None


@pytest.mark.distributed
@pytest.mark.parametrize("name", list(_cp_plans()))
def test_cp_plan_trains_as_one_process(cp_runs: Path, name: str) -> None:
    plan = _cp_plans()[name]
    report = assert_run_equals_reference(plan, cp_runs / name, STEPS, TOLERANCE)
    assert report.executor == "mesh"
