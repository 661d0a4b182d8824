"""Real processes on gloo, float64: every plan's loss and gradients equal single-process
training's (AdamW steps included: step 1's gradients follow step 0's update).

One launch per world size runs all the plans of that size (tests/distributed_driver.py).
Uniform plans run on the mesh executor (torch's pipelining); plans whose stages differ in
replicas, and uniform plans named ``*_groups``, on the groups executor.

Under tensor parallelism the token embedding and the head are split by vocabulary (evenly for
the zoo's 128 tokens, unevenly for tied_gpt's 33); what each rank holds is checked too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport
from autoplan.runtime.tensor_parallel import vocabulary_shard_rows
from tests.distributed_driver import (
    LOADER_DATA_SEED,
    SPLIT_LOSS_WEIGHT,
    STEPS,
    split_loss_inputs,
)
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.ranks_of_plans import run_plans
from tests.runtime_models import HF_DECODER_LAYERS
from tests.single_process_reference import assert_run_equals_reference, reference_training

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10
HF_GEMMA2 = f"hf:{ROOT / 'tests' / 'data' / 'hf' / 'tiny-gemma2' / 'config.json'}"
HF_QWEN3 = f"hf:{ROOT / 'tests' / 'data' / 'hf' / 'tiny-qwen3' / 'config.json'}"


def _uniform_plans() -> dict[str, Plan]:
    """Name → plan of one (dp, tp) for every stage; gpt-tiny has 6 layers (embed, 4 blocks,
    head)."""
    return {
        # world size 2
        "pp2_uneven_1f1b": make_plan([2, 4], schedule="1f1b", num_micro_batches=4),
        "pp2_uneven_gpipe_selective": make_plan(
            [4, 2],
            schedule="gpipe",
            num_micro_batches=2,
            micro_batch_size=3,
            recompute="selective",
        ),
        # DDP with ZeRO-1 (the optimizer step is checked by step 1's loss and gradients).
        "dp2_uneven_shares_zero1": make_plan(
            [6],
            data_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
            replica_micro_batch_sizes=[3, 1],
            zero1=True,
        ),
        "pp2_interleaved_full_recompute": make_plan(
            [1, 2, 2, 1],
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
            num_micro_batches=4,
            recompute="full",
        ),
        # Tied embedding and head in different stages: one copy each, gradients summed.
        "tied_pp2": make_plan(
            [2, 2], model="tests.runtime_models:tied_gpt", schedule="1f1b", num_micro_batches=2
        ),
        # Tied embedding and head in one stage under tp 2: one parameter, split unevenly by
        # vocabulary (33 = 17 + 16 rows), used by the embedding and the head.
        "tied_tp2": make_plan(
            [4],
            model="tests.runtime_models:tied_gpt",
            tensor_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
        ),
        # A factory's nn.Sequential (pipeline layers = children), its own input, a sum loss.
        "sequential_pp2_gpipe": make_plan(
            [1, 3], model="tests.runtime_models:mlp_stack", schedule="gpipe", num_micro_batches=2
        ),
        # A decoder written like Hugging Face's (embed_tokens, a ModuleList of blocks, norm,
        # lm_head): neither a LayeredModel nor a Sequential, split into the layer modules its
        # profile finds; the reference trains the model through its own forward.
        "hf_decoder_pp2_1f1b": make_plan(
            [3, 4],
            model="tests.runtime_models:hf_decoder",
            layer_modules=HF_DECODER_LAYERS,
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # Its tied variant: lm_head's weight is embed_tokens' (one copy per stage, summed).
        "hf_decoder_tied_pp2_1f1b": make_plan(
            [2, 5],
            model="tests.runtime_models:hf_decoder_tied",
            layer_modules=HF_DECODER_LAYERS,
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # world size 4
        "hf_decoder_pp2_dp2_gpipe": make_plan(
            [5, 2],
            model="tests.runtime_models:hf_decoder",
            layer_modules=HF_DECODER_LAYERS,
            data_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
        ),
        "pp2_dp2_interleaved_zero1": make_plan(
            [2, 1, 1, 2],
            data_parallel=2,
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
            num_micro_batches=2,
            zero1=True,
        ),
        # The 16-bit optimizer (fp32 masters), ZeRO-1 sharded, here on float64 to be exact.
        "pp2_dp2_zero1_masterweights": make_plan(
            [3, 3], data_parallel=2, schedule="1f1b", num_micro_batches=2, zero1=True
        ),
        "tied_pp2_dp2": make_plan(
            [1, 3],
            model="tests.runtime_models:tied_gpt",
            data_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
        ),
        # Uneven shares with a pipeline: each replica's row of the mesh pipelines its own
        # micro-batch size.
        "pp2_dp2_uneven_shares": make_plan(
            [3, 3],
            data_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
            replica_micro_batch_sizes=[3, 1],
        ),
        # Data through train()'s `batches` hook, from a torch DataLoader.
        "pp2_dp2_dataloader": make_plan(
            [3, 3], data_parallel=2, schedule="1f1b", num_micro_batches=2
        ),
        "pp2_tp2": make_plan([2, 4], tensor_parallel=2, schedule="1f1b", num_micro_batches=2),
        "dp2_tp2": make_plan(
            [6], data_parallel=2, tensor_parallel=2, schedule="gpipe", num_micro_batches=2
        ),
        # Tied embedding and head in different stages under tp 2: a sharded copy in each,
        # gradient shards summed across the stages.
        "tied_pp2_tp2": make_plan(
            [2, 2],
            model="tests.runtime_models:tied_gpt",
            tensor_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # FSDP2 over the tied, vocabulary-split parameter shared within one stage.
        "tied_dp2_tp2": make_plan(
            [4],
            model="tests.runtime_models:tied_gpt",
            data_parallel=2,
            tensor_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
        ),
        # A Hugging Face config (Gemma 2 shape): head tied across stages and split by tp, a
        # head width other than hidden / heads, sliding-window attention (window 8 < seq 16)
        # on block 0, sandwich norms, (1 + w) norms, soft-capped logits.
        "hf_gemma2_pp2_tp2": make_plan(
            [2, 2],
            model=HF_GEMMA2,
            tensor_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # Qwen3 shape: per-head query and key norms whose weight every tp rank holds whole
        # while seeing its own heads (its gradient summed over tp), heads wider than hidden /
        # heads; with sequence parallelism, whose norms over the sequence must leave them be.
        "hf_qwen3_pp2_tp2_sp": make_plan(
            [2, 2],
            model=HF_QWEN3,
            tensor_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
            sequence_parallel=True,
        ),
        # Llama: grouped-query attention (2 kv heads split over tp 2), RoPE, SwiGLU's gate.
        "llama_pp2_tp2_selective": make_plan(
            [3, 3],
            model="llama-tiny",
            tensor_parallel=2,
            schedule="1f1b",
            num_micro_batches=2,
            recompute="selective",
        ),
    }


def _forced_groups() -> dict[str, Plan]:
    """Uniform plans run through the groups executor: each equals its mesh run."""
    uniform = _uniform_plans()
    names = [
        "pp2_interleaved_full_recompute",
        "sequential_pp2_gpipe",
        "pp2_tp2",
        "tied_pp2_dp2",
        "pp2_dp2_uneven_shares",
    ]
    return {f"{name}_groups": uniform[name] for name in names}


def _heterogeneous_plans() -> dict[str, Plan]:
    """Plans whose stages differ in replicas (the groups executor); all of 4 processes.

    ``ReplicaSpec(tp, share, recompute, node)``: a replica of tp GPUs taking ``share`` samples
    of every micro-batch."""
    hetero = load_cluster(example_cluster_path("cpu-hetero"))  # node 0: cpu-fast, 1: cpu-slow
    return {
        # (a) two tp-1 replicas → one tp-2 replica: samples regrouped, the activation sent from
        # each replica to tp rank 0 and broadcast; ZeRO-1 over stage 0's replicas.
        "groups_dp2_to_tp2_zero1": make_stages_plan(
            [3, 3],
            [[ReplicaSpec(1, 1), ReplicaSpec(1, 1)], [ReplicaSpec(2, 2)]],
            schedule="1f1b",
            num_micro_batches=2,
            zero1=True,
        ),
        # (b) uneven shares 3 and 1 → one replica of 4 samples (tp 2, selective recompute).
        "groups_shares_3_1_to_dp1": make_stages_plan(
            [2, 4],
            [[ReplicaSpec(1, 3), ReplicaSpec(1, 1)], [ReplicaSpec(2, 4, "selective")]],
            schedule="gpipe",
            num_micro_batches=2,
        ),
        # (c) three stages on GPU types A, B, A (two nodes): tp 1 → tp 2 → tp 1.
        "groups_types_a_b_a": make_stages_plan(
            [2, 2, 2],
            [[ReplicaSpec(1, 2, node=0)], [ReplicaSpec(2, 2, node=1)], [ReplicaSpec(1, 2, node=0)]],
            schedule="1f1b",
            num_micro_batches=4,
            cluster=hetero,
        ),
        # (d) one stage of a tp-1 and a tp-2 replica (the embedding split 64/64 on one, whole
        # on the other; norms replicated on both), full recompute on the tp-2 one.
        "groups_mixed_tp_stage": make_stages_plan(
            [3, 3],
            [[ReplicaSpec(1, 1), ReplicaSpec(2, 3, "full")], [ReplicaSpec(1, 4)]],
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # (d') Qwen3 shape, one stage of a tp-1 and a tp-2 replica: the per-head norms'
        # gradients summed over the tp-2 replica's ranks, then across the two replicas.
        "groups_qwen3_mixed_tp_stage": make_stages_plan(
            [2, 2],
            [[ReplicaSpec(1, 1), ReplicaSpec(2, 1)], [ReplicaSpec(1, 2)]],
            model=HF_QWEN3,
            schedule="1f1b",
            num_micro_batches=2,
        ),
        # (e) tied embedding (stage 0, two tp-1 replicas) and head (stage 1, tp 2, 17 + 16
        # rows): the tie's pieces summed over all three replicas.
        "groups_tied_dp2_to_tp2": make_stages_plan(
            [2, 2],
            [[ReplicaSpec(1, 1), ReplicaSpec(1, 1)], [ReplicaSpec(2, 2)]],
            model="tests.runtime_models:tied_gpt",
            schedule="gpipe",
            num_micro_batches=2,
        ),
        # Interleaved: stages 0, 2 on two tp-1 replicas, stages 1, 3 on one tp-2 replica; the
        # two boundaries between the same ranks share their messages' order.
        "groups_interleaved_dp2_tp2": make_stages_plan(
            [1, 2, 2, 1],
            [[ReplicaSpec(1, 1), ReplicaSpec(1, 1)], [ReplicaSpec(2, 2)]],
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
            num_micro_batches=4,
        ),
    }


def _plans() -> dict[str, Plan]:
    return {**_uniform_plans(), **_forced_groups(), **_heterogeneous_plans()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_plans(_plans(), tmp_path_factory.mktemp("runs"), timeout_s=300)


@pytest.mark.parametrize("name", list(_plans()))
def test_distributed_training_equals_single_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    data_seed = LOADER_DATA_SEED if name.endswith("_dataloader") else None
    report = assert_run_equals_reference(
        plan, runs / name, STEPS, TOLERANCE, data_seed=data_seed, tied_head=True
    )
    assert report.measured_step_time_ms > 0


VOCAB_WEIGHTS = ("layers.embed.token.weight", "layers.head.output.weight")


def _replica_tp(plan: Plan, rank: int) -> int:
    entry = plan.rank_map[rank]
    return (
        plan.stages_of_rank(entry.pipeline_rank)[0].replicas[entry.dp_index].tensor_parallel_degree
    )


def _split_vocabulary_weights(plan: Plan) -> set[str]:
    """The vocabulary weights some tp > 1 replica holds (gpt-tiny and tied_gpt name them alike)."""
    held = set()
    for stage in plan.stages:
        if any(replica.tensor_parallel_degree > 1 for replica in stage.replicas):
            held |= {"layers.embed.token.weight"} if stage.layer_start == 0 else set()
            held |= {"layers.head.output.weight"} if stage.index == len(plan.stages) - 1 else set()
    return held


@pytest.mark.parametrize(
    "name", [name for name, plan in _plans().items() if _split_vocabulary_weights(plan)]
)
def test_tensor_parallel_splits_embedding_and_head_by_vocabulary(runs: Path, name: str) -> None:
    plan = _plans()[name]
    _, reference = reference_training(plan, 1)
    seen: set[str] = set()
    for entry in plan.rank_map:
        tp = _replica_tp(plan, entry.rank)
        if tp == 1:
            continue
        stages = json.loads((runs / name / f"rank{entry.rank}_shards.json").read_text())
        for layout in stages:
            for weight in VOCAB_WEIGHTS:
                if weight not in layout:
                    continue
                seen.add(weight)
                vocab, hidden = reference[0][weight].shape
                rows = vocabulary_shard_rows(vocab, tp)[entry.tp_index]
                assert layout[weight]["local_shape"] == [rows, hidden], (entry.rank, weight)
                assert layout[weight]["placements"] == "(Shard(dim=0),)", (entry.rank, weight)
            if all(weight in layout for weight in VOCAB_WEIGHTS) and "tied" in name:
                # One parameter, sharded once, serves the tied embedding and head.
                head = layout["layers.head.output.weight"]
                assert head["same_as"] == "layers.embed.token.weight"
    assert seen == _split_vocabulary_weights(plan)


@pytest.mark.parametrize("name", list(_forced_groups()))
def test_groups_executor_equals_mesh_executor_on_uniform_plans(runs: Path, name: str) -> None:
    mesh_name = name.removesuffix("_groups")
    plan = _plans()[name]
    groups = read_json_model(runs / name / "report.json", RunReport)
    mesh = read_json_model(runs / mesh_name / "report.json", RunReport)
    assert (groups.executor, mesh.executor) == ("groups", "mesh")
    for a, b in zip(groups.steps, mesh.steps, strict=True):
        assert abs(a.loss - b.loss) < TOLERANCE
    for step in range(STEPS):
        for rank in range(plan.world_size):
            ours = torch.load(runs / name / f"rank{rank}_step{step}.pt")
            theirs = torch.load(runs / mesh_name / f"rank{rank}_step{step}.pt")
            assert ours.keys() == theirs.keys()
            for param_name, grad in ours.items():
                assert (grad - theirs[param_name]).abs().max().item() < TOLERANCE, param_name


def test_heterogeneous_plans_ran_on_the_groups_executor(runs: Path) -> None:
    for name, plan in _heterogeneous_plans().items():
        assert plan.uniform_shape() is None, name
        report = read_json_model(runs / name / "report.json", RunReport)
        assert report.executor == "groups"
        assert len(report.predicted_peak_memory_per_rank_bytes) == plan.world_size


def test_vocabulary_split_cross_entropy_equals_plain(runs: Path) -> None:
    """loss_parallel's cross-entropy on logits split unevenly by vocabulary (33 over tp 2)."""
    logits, targets = split_loss_inputs()
    logits.requires_grad_()
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    (expected * SPLIT_LOSS_WEIGHT).backward()
    measured = torch.load(runs / "vocab_split_loss.pt")
    assert abs(measured["loss"].item() - expected.item() * SPLIT_LOSS_WEIGHT) < TOLERANCE
    assert logits.grad is not None
    assert (measured["gradient"] - logits.grad).abs().max().item() < TOLERANCE
