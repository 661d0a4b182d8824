"""Real torchrun processes on gloo, float64: every plan's loss and gradients equal single-process
training's (AdamW steps included: step 1's gradients follow step 0's update).

One torchrun launch per world size runs all the plans of that size (tests/distributed_driver.py).

Under tensor parallelism the token embedding and the head are split by vocabulary (evenly for
the zoo's 128 tokens, unevenly for tied_gpt's 33); what each rank holds is checked too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport
from autoplan.runtime.tensor_parallel import vocabulary_shard_rows
from tests.distributed_driver import (
    LOADER_DATA_SEED,
    SPLIT_LOSS_WEIGHT,
    STEPS,
    split_loss_inputs,
)
from tests.plan_factory import make_plan
from tests.single_process_reference import reference_training

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10


def _with_zero1(plan: Plan) -> Plan:
    return plan.model_copy(
        update={"parallelism": plan.parallelism.model_copy(update={"zero1": True})}
    )


def _plans() -> dict[str, Plan]:
    """Name → plan; gpt-tiny has 6 layers (embed, 4 blocks, head)."""
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
        "dp2_uneven_shares_zero1": _with_zero1(
            make_plan(
                [6],
                data_parallel=2,
                schedule="1f1b",
                num_micro_batches=2,
                replica_micro_batch_sizes=[3, 1],
            )
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
        # world size 4
        "pp2_dp2_interleaved_zero1": _with_zero1(
            make_plan(
                [2, 1, 1, 2],
                data_parallel=2,
                virtual_stages_per_rank=2,
                schedule="interleaved_1f1b",
                num_micro_batches=2,
            )
        ),
        # The 16-bit optimizer (fp32 masters), ZeRO-1 sharded, here on float64 to be exact.
        "pp2_dp2_zero1_masterweights": _with_zero1(
            make_plan([3, 3], data_parallel=2, schedule="1f1b", num_micro_batches=2)
        ),
        "tied_pp2_dp2": make_plan(
            [1, 3],
            model="tests.runtime_models:tied_gpt",
            data_parallel=2,
            schedule="gpipe",
            num_micro_batches=2,
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    plans_dir = tmp_path_factory.mktemp("plans")
    out_dir = tmp_path_factory.mktemp("runs")
    for name, plan in _plans().items():
        write_json_model(plans_dir / f"{name}.json", plan)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for world_size in sorted({plan.parallelism.world_size for plan in _plans().values()}):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={world_size}",
                str(ROOT / "tests" / "distributed_driver.py"),
                str(plans_dir),
                str(out_dir),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-4000:]
    return out_dir


@pytest.mark.parametrize("name", list(_plans()))
def test_distributed_training_equals_single_process(runs: Path, name: str) -> None:
    plan = _plans()[name]
    data_seed = LOADER_DATA_SEED if name.endswith("_dataloader") else None
    losses, reference = reference_training(plan, STEPS, data_seed=data_seed)
    report = read_json_model(runs / name / "report.json", RunReport)
    assert [record.step for record in report.steps] == list(range(STEPS))
    for record, expected in zip(report.steps, losses, strict=True):
        assert abs(record.loss - expected) < TOLERANCE, (record.loss, expected)
    assert report.measured_step_time_ms > 0
    for step in range(STEPS):
        covered: set[str] = set()
        for rank in range(plan.parallelism.world_size):
            dumped = torch.load(runs / name / f"rank{rank}_step{step}.pt")
            assert dumped, f"rank {rank} dumped no gradients"
            for param_name, grad in dumped.items():
                expected = reference[step][param_name]
                assert grad.shape == expected.shape, param_name
                error = (grad - expected).abs().max().item()
                assert error < TOLERANCE, f"step {step} rank {rank} {param_name}: {error:.3g}"
                covered.add(param_name)
        # Every parameter is covered (a tied weight under at least one of its names).
        first_names = {name for name in reference[step] if "head.output" not in name}
        assert first_names <= covered <= set(reference[step]), set(reference[step]) ^ covered


VOCAB_WEIGHTS = ("layers.embed.token.weight", "layers.head.output.weight")


@pytest.mark.parametrize(
    "name", [name for name, plan in _plans().items() if plan.parallelism.tensor_parallel_degree > 1]
)
def test_tensor_parallel_splits_embedding_and_head_by_vocabulary(runs: Path, name: str) -> None:
    plan = _plans()[name]
    tp = plan.parallelism.tensor_parallel_degree
    _, reference = reference_training(plan, 1)
    seen: set[str] = set()
    for entry in plan.rank_map:
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
    assert seen == set(VOCAB_WEIGHTS)


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
