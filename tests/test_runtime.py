"""The runtime's parts that need no process group: launch vs plan, ties, schedules, shares,
recompute, the vocabulary split."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from autoplan.errors import InputError, LaunchMismatchError
from autoplan.files import write_json_model
from autoplan.plan.schema import PLAN_SCHEMA_VERSION
from autoplan.runtime.data import replica_rows
from autoplan.runtime.launch_check import LaunchEnv, check_launch
from autoplan.runtime.model_stage import TiedWeight, find_tied_weights
from autoplan.runtime.tensor_parallel import vocabulary_shard_rows, vocabulary_sizes
from autoplan.runtime.trainer import check_runnable
from autoplan.zoo.gpt import GPT, GPTConfig
from tests.plan_factory import make_plan

ROOT = Path(__file__).resolve().parent.parent


def _torchrun_env(world: int, rank: int, local: int, node: int, local_world: int) -> dict:
    return {
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "GROUP_RANK": str(node),
        "LOCAL_WORLD_SIZE": str(local_world),
    }


def _run_runtime(plan_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in env and k != "MASTER_ADDR"}
    return subprocess.run(
        [sys.executable, "-m", "autoplan.runtime", str(plan_path), "--steps", "1"],
        capture_output=True,
        text=True,
        env={**clean, **env, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )


def test_wrong_world_size_is_refused_with_one_line_and_exit_2(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([3, 3], data_parallel=2))  # 4 processes
    result = _run_runtime(plan_path, _torchrun_env(2, 0, 0, 0, 2))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "WORLD_SIZE=2" in lines[0] and "needs 4 processes" in lines[0]
    assert "pp 2 × dp 2 × tp 1" in lines[0]


def test_unknown_plan_schema_version_is_refused(tmp_path: Path) -> None:
    data = json.loads(make_plan([6]).model_dump_json())
    data["schema_version"] = 99
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(data))
    result = _run_runtime(plan_path, {})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {plan_path}: schema_version 99 is not one this autoplan reads "
        f"(it reads {PLAN_SCHEMA_VERSION})"
    ]


def test_launch_check_names_node_and_local_rank_mismatches() -> None:
    plan = make_plan([3, 3], data_parallel=2)
    assert check_launch(plan, LaunchEnv(4, 3, 3, 0, 4)).pipeline_rank == 1
    with pytest.raises(LaunchMismatchError, match=r"GROUP_RANK.*--node-rank 0"):
        check_launch(plan, LaunchEnv(4, 3, 3, 1, 4))
    with pytest.raises(LaunchMismatchError, match=r"LOCAL_RANK=2.*local rank 3"):
        check_launch(plan, LaunchEnv(4, 3, 2, 0, 4))
    with pytest.raises(LaunchMismatchError, match="started 2 processes"):
        check_launch(plan, LaunchEnv(4, 3, 3, 0, 2))


def test_launch_env_reads_torchrun_variables_and_defaults_to_one_process() -> None:
    assert LaunchEnv.from_environ({}) == LaunchEnv(1, 0, 0, 0, 1)
    assert LaunchEnv.from_environ(_torchrun_env(8, 5, 1, 1, 4)) == LaunchEnv(8, 5, 1, 1, 4)
    with pytest.raises(LaunchMismatchError, match="RANK is not set"):
        LaunchEnv.from_environ({"WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(LaunchMismatchError, match="not an integer"):
        LaunchEnv.from_environ({"WORLD_SIZE": "two", "RANK": "0", "LOCAL_RANK": "0"})


def test_tied_weights_across_stages_are_found_by_name() -> None:
    tied = GPT(GPTConfig(2, 16, 2, 32, 16, tie_embeddings=True))  # layers: embed, 2 blocks, head
    assert find_tied_weights(tied, make_plan([4])) == []  # one stage holds both uses
    assert find_tied_weights(tied, make_plan([2, 2])) == [
        TiedWeight(names=("layers.embed.token.weight", "layers.head.output.weight"), stages=(0, 1))
    ]
    untied = GPT(GPTConfig(2, 16, 2, 32, 16, tie_embeddings=False))
    assert find_tied_weights(untied, make_plan([2, 2])) == []


def test_schedules_torch_would_reject_are_refused_before_running() -> None:
    with pytest.raises(InputError, match=r"1F1B needs micro-batches \(1\) >= pipeline stages"):
        check_runnable(make_plan([3, 3], schedule="1f1b", num_micro_batches=1))
    check_runnable(make_plan([3, 3], schedule="gpipe", num_micro_batches=1))
    check_runnable(
        make_plan(
            [2, 1, 1, 2],
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
            num_micro_batches=4,
        )
    )


def test_stage_layouts_torch_would_run_wrongly_are_refused() -> None:
    plan = make_plan([3, 3])
    gap = [plan.stages[0], plan.stages[1].model_copy(update={"layer_start": 4})]
    with pytest.raises(InputError, match=r"layers \[4, 6\).*should start at 3"):
        check_runnable(plan.model_copy(update={"stages": gap}))
    swapped = [stage.model_copy(update={"pipeline_rank": 1 - stage.index}) for stage in plan.stages]
    with pytest.raises(InputError, match=r"stage 0 is on pipeline rank 1; .* must be on 0"):
        check_runnable(plan.model_copy(update={"stages": swapped}))


def test_tensor_parallel_degree_must_split_whole_kv_heads() -> None:
    # llama-tiny: 4 heads, 2 kv heads; tp 4 would split a kv head.
    with pytest.raises(InputError, match=r"degree 4 does not divide llama-tiny's .* gcd is 2"):
        check_runnable(make_plan([6], model="llama-tiny", tensor_parallel=4))
    check_runnable(make_plan([6], model="llama-tiny", tensor_parallel=2))


def test_replica_rows_follow_uneven_shares() -> None:
    plan = make_plan([6], data_parallel=3, num_micro_batches=2, replica_micro_batch_sizes=[3, 1, 2])
    assert [replica_rows(plan, i) for i in range(3)] == [slice(0, 6), slice(6, 8), slice(8, 12)]


def _ops_run_in_backward(model_name: str, recompute: str) -> Counter[str]:
    """How often each aten op runs during backward: recompute shows up as forward ops."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoplan.runtime.model_stage import build_full_model
    from autoplan.runtime.recompute import apply_recompute

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.counts[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    model = build_full_model(model_name, "fp64", seed=0)
    apply_recompute(model, recompute)
    loss = model(torch.randint(0, 64, (2, 16))).sum()
    with CountOps() as counter:
        loss.backward()
    return counter.counts


@pytest.mark.parametrize("model_name", ["gpt-tiny", "llama-tiny"])
def test_recompute_reruns_what_the_mode_says(model_name: str) -> None:
    attention = "aten._scaled_dot_product_flash_attention_for_cpu"
    none, selective, full = (
        _ops_run_in_backward(model_name, mode) for mode in ("none", "selective", "full")
    )
    blocks = 4
    # The attention core's forward reruns in backward under both modes, once per block.
    assert (none[attention], selective[attention], full[attention]) == (0, blocks, blocks)

    # Selective keeps the matmuls; full recomputes them (one more mm per linear layer).
    def matmuls(counts: Counter[str]) -> int:
        return counts["aten.mm"] + counts["aten.addmm"]

    assert matmuls(selective) == matmuls(none) < matmuls(full)


@pytest.mark.distributed
def test_one_process_plan_runs_without_torchrun_and_writes_its_report(tmp_path: Path) -> None:
    from autoplan.files import read_json_model
    from autoplan.runtime.report import RunReport
    from tests.single_process_reference import reference_training

    plan = make_plan([6], num_micro_batches=2)
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "report.json"
    write_json_model(plan_path, plan)
    clean = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoplan.runtime",
            str(plan_path),
            "--steps",
            "2",
            "--report",
            str(report_path),
        ],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = read_json_model(report_path, RunReport)
    assert (report.world_size, report.backend, len(report.steps)) == (1, "gloo", 2)
    expected, _ = reference_training(plan, 2)
    assert [abs(s.loss - e) < 1e-10 for s, e in zip(report.steps, expected, strict=True)] == [
        True,
        True,
    ]


def test_master_weight_adamw_steps_16_bit_weights_through_fp32_masters() -> None:
    import torch

    from autoplan.runtime.mixed_precision import MasterWeightAdamW

    torch.manual_seed(0)
    start = torch.randn(64, dtype=torch.float32)
    weight = torch.nn.Parameter(start.to(torch.bfloat16))
    reference = torch.nn.Parameter(start.to(torch.bfloat16).float())  # the fp32 master
    optimizer = MasterWeightAdamW([weight], learning_rate=1e-3)
    reference_optimizer = torch.optim.AdamW([reference], lr=1e-3)
    for _ in range(3):
        grad = torch.randn(64)
        weight.grad = grad.to(torch.bfloat16)
        reference.grad = grad.to(torch.bfloat16).float()
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
    assert weight.grad is None
    # The fp32 masters followed fp32 AdamW exactly; the bf16 weights are them, rounded.
    assert torch.equal(optimizer.masters[0].detach(), reference.detach())
    assert torch.equal(weight.detach(), reference.detach().to(torch.bfloat16))
    assert optimizer.master_bytes() == 64 * 4
    assert {value.dtype for value in optimizer.state[optimizer.masters[0]].values()} >= {
        torch.float32
    }


def test_vocabulary_shard_rows_follow_torch_chunk() -> None:
    for vocab, degree in [(128, 2), (33, 2), (50257, 8), (10, 4), (5, 4)]:
        chunks = [len(chunk) for chunk in torch.arange(vocab).chunk(degree)]
        assert vocabulary_shard_rows(vocab, degree) == chunks + [0] * (degree - len(chunks))


def test_vocabulary_tp_does_not_divide_is_split_unevenly_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with torch.device("meta"):
        assert vocabulary_sizes(GPT(GPTConfig(2, 16, 2, 33, 16))) == {33}
    plan = make_plan([4], model="tests.runtime_models:tied_gpt", tensor_parallel=2)
    with caplog.at_level(logging.INFO, logger="autoplan.runtime.check"):
        check_runnable(plan)
    assert "does not divide tests.runtime_models:tied_gpt's vocabulary of 33" in caplog.text
    assert "17/16 rows per tp rank" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="autoplan.runtime.check"):
        check_runnable(make_plan([6], tensor_parallel=2))  # gpt-tiny: 128 tokens
    assert "vocabulary" not in caplog.text


def test_a_tf32_plan_trains_with_tf32_matmuls_and_fp32_with_full_precision() -> None:
    """The runtime sets PyTorch's fp32 matmul precision from the plan's dtype before training:
    the plan was costed at the TF32 peak (tf32) or the FP32 peak (fp32)."""
    import torch.distributed as dist

    from autoplan.runtime.trainer import train

    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    try:
        for dtype, expected in (("tf32", ("high", True)), ("fp32", ("highest", False))):
            plan = make_plan([6], num_micro_batches=1, dtype=dtype)
            report = train(plan, 1, environ=environ)
            assert report.steps and report.steps[0].loss > 0
            found = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
            assert found == expected, dtype
            dist.destroy_process_group()
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
        if dist.is_initialized():
            dist.destroy_process_group()
