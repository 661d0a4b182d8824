"""Token files and checkpoints in one process (world size 1, gloo): the file formats and their
errors, the sample order and each replica's rows, and save / resume / refuse on disk. The
resharding across plans under torchrun is tests/test_runtime_checkpoint.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.runtime import __main__ as runtime_main
from autoplan.runtime.checkpoint import (
    INFO_NAME,
    CheckpointConfig,
    CheckpointInfo,
    latest_checkpoint,
    step_dir,
)
from autoplan.runtime.data import Batch, replica_rows
from autoplan.runtime.report import RunReport
from autoplan.runtime.token_data import (
    TOKEN_DTYPES,
    SampleOrder,
    TokenFile,
    TokenSource,
    open_token_batches,
    rank_rows,
)
from autoplan.runtime.trainer import train
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.single_process_reference import reference_training

TOLERANCE = 1e-10
VOCAB = 128  # gpt-tiny's vocabulary


@pytest.fixture(autouse=True)
def no_process_group() -> Iterator[None]:
    """train() joins a one-process group here; each test leaves none behind."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _tokens(count: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, count).astype(np.uint16)


def full_batches(plan, path: Path, seed: int = 1, shuffle: bool = True) -> Iterator[Batch]:
    """Every row of each global batch, straight from the file: the single-process reference."""
    data = TokenFile.open(path, plan.inputs.seq_len, VOCAB)
    order = SampleOrder(data.num_samples, plan.inputs.global_batch_size, seed, shuffle)
    step = 0
    while True:
        windows = torch.stack([torch.from_numpy(data.sample(i)) for i in order.batch(step)])
        yield (windows[:, :-1],), windows[:, 1:]
        step += 1


# Token files ---------------------------------------------------------------------------


def test_npy_and_bin_files_give_the_same_samples(tmp_path: Path) -> None:
    tokens = _tokens(1000)
    np.save(tmp_path / "t.npy", tokens)
    tokens.tofile(tmp_path / "t.bin")
    npy = TokenFile.open(tmp_path / "t.npy", 16, VOCAB)
    inferred = TokenFile.open(tmp_path / "t.bin", 16, VOCAB)  # uint16: the vocabulary fits
    assert inferred.tokens.dtype == np.uint16 and npy.tokens.dtype == np.uint16
    assert npy.num_samples == inferred.num_samples == (1000 - 1) // 16
    for index in (0, 7, npy.num_samples - 1):
        window = npy.sample(index)
        assert window.dtype == np.int64 and len(window) == 17
        assert np.array_equal(window, inferred.sample(index))
        assert np.array_equal(window, tokens[index * 16 : index * 16 + 17])
    # A .bin of another dtype, named.
    tokens.astype(np.int32).tofile(tmp_path / "t32.bin")
    wide = TokenFile.open(tmp_path / "t32.bin", 16, VOCAB, "int32")
    assert np.array_equal(wide.sample(3), npy.sample(3))
    # Inferred for a vocabulary past 16 bits: uint32.
    tokens.astype(np.uint32).tofile(tmp_path / "big.bin")
    assert TokenFile.open(tmp_path / "big.bin", 16, 100_000).tokens.dtype == np.uint32


@pytest.mark.parametrize(
    ("name", "content", "dtype", "message"),
    [
        ("t.txt", b"1 2 3", None, "ends in .npy (NumPy) or .bin"),
        ("odd.bin", b"\x01\x02\x03", None, "not a whole number of uint16 tokens"),
        ("t.npy", b"not numpy", None, "not a NumPy array file"),
        ("f.npy", np.zeros(8, np.float32), None, "1-D of"),
        ("t.npy", np.zeros(8, np.uint16), "int32", "its header says uint16"),
        ("t.bin", np.zeros(8, np.uint16), "float16", "not a token dtype"),
        ("missing.bin", None, None, "no such file"),
    ],
)
def test_a_bad_token_file_is_one_line(
    tmp_path: Path, name: str, content: object, dtype: str | None, message: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, np.ndarray):
        np.save(path, content) if name.endswith(".npy") else content.tofile(path)
    with pytest.raises(InputError, match=re.escape(message)):
        TokenFile.open(path, 16, VOCAB, dtype)


def test_too_few_tokens_and_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    plan = make_plan([6], num_micro_batches=2)  # 4 samples of 16 tokens a step
    np.save(tmp_path / "short.npy", _tokens(3 * 16 + 1))
    with pytest.raises(InputError, match=r"3 samples of 16 .* global batch is 4 samples"):
        open_token_batches(plan, TokenSource(tmp_path / "short.npy"), 1, 0)
    tokens = _tokens(200)
    tokens[40] = VOCAB  # one id past gpt-tiny's vocabulary
    np.save(tmp_path / "big.npy", tokens)
    batches = open_token_batches(plan, TokenSource(tmp_path / "big.npy", shuffle=False), 1, 0)
    with pytest.raises(InputError, match=f"token id {VOCAB}, outside the model's vocabulary"):
        next(batches)


def test_the_sample_order_is_a_function_of_the_step_and_covers_each_epoch() -> None:
    order = SampleOrder(num_samples=10, global_batch_size=3, seed=4)
    assert order.batches_per_epoch == 3
    epoch = [i for step in range(3) for i in order.batch(step)]
    assert len(set(epoch)) == 9 and set(epoch) <= set(range(10))  # one partial batch dropped
    again = SampleOrder(num_samples=10, global_batch_size=3, seed=4)
    assert [again.batch(s) for s in range(6)] == [order.batch(s) for s in range(6)]
    assert order.batch(3) != order.batch(0)  # the next epoch is another permutation
    plain = SampleOrder(num_samples=10, global_batch_size=3, seed=4, shuffle=False)
    assert [plain.batch(s) for s in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]


def test_each_replica_reads_the_rows_of_its_share() -> None:
    """Stage 0 has replicas of shares 1 and 3 (ranks 0, 1), stage 1 one of 4 (rank 2); two
    micro-batches of 4: replica 0 reads 1 sample of each, replica 1 three, the last stage all
    (its targets); together the first stage's replicas read every row once."""
    plan = make_stages_plan(
        [3, 3],
        [[ReplicaSpec(share=1), ReplicaSpec(share=3)], [ReplicaSpec(share=4)]],
        num_micro_batches=2,
    )
    first, second, last = (rank_rows(plan, rank) for rank in range(3))
    assert (len(first), len(second)) == (2, 6)
    assert sorted(first + second) == list(range(8))
    assert last == list(range(8))
    # A uniform plan of dp 2 (mesh executor): replica d's block of share × m rows.
    uniform = make_plan([6], data_parallel=2, num_micro_batches=2, micro_batch_size=2)
    assert [rank_rows(uniform, rank) for rank in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Uneven shares on the mesh executor: the rows are the block it slices (replica_rows).
    uneven = make_plan([3, 3], num_micro_batches=2, replica_micro_batch_sizes=[1, 3])
    for rank, entry in enumerate(uneven.rank_map):
        block = replica_rows(uneven, entry.dp_index)
        assert rank_rows(uneven, rank) == list(range(block.start, block.stop))


def test_a_rank_reads_only_its_rows_of_the_file(tmp_path: Path) -> None:
    plan = make_stages_plan(
        [3, 3],
        [[ReplicaSpec(share=1), ReplicaSpec(share=3)], [ReplicaSpec(share=4)]],
        num_micro_batches=2,
    )
    np.save(tmp_path / "t.npy", _tokens(2000))
    mine = open_token_batches(plan, TokenSource(tmp_path / "t.npy"), 1, rank=0)
    everything = full_batches(plan, tmp_path / "t.npy")
    for _ in range(3):
        (inputs,), targets = next(mine)
        (all_inputs,), all_targets = next(everything)
        rows = rank_rows(plan, 0)
        assert torch.equal(inputs[rows], all_inputs[rows])
        assert torch.equal(targets[rows], all_targets[rows])
        others = [row for row in range(8) if row not in rows]
        assert not inputs[others].any() and not targets[others].any()  # never read


# Training on a file; checkpoints --------------------------------------------------------


def test_training_on_a_token_file_equals_single_process_training_on_it(tmp_path: Path) -> None:
    plan = make_plan([6], num_micro_batches=2)
    np.save(tmp_path / "t.npy", _tokens(3000))
    report = train(plan, 3, data=TokenSource(tmp_path / "t.npy"), environ={})
    expected, _ = reference_training(plan, 3, batches=full_batches(plan, tmp_path / "t.npy"))
    synthetic, _ = reference_training(plan, 3)
    close = [abs(s.loss - e) < TOLERANCE for s, e in zip(report.steps, expected, strict=True)]
    assert close == [True] * 3
    assert abs(report.steps[-1].loss - synthetic[-1]) > 1e-3  # the file's data, not synthetic


@pytest.mark.parametrize("dtype", ["fp64", "bf16", "fp16"])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, dtype: str) -> None:
    """Save after 2 steps, resume to 4: the losses equal 4 uninterrupted steps (fp64 within
    1e-10; bf16 and fp16 exactly, with their fp32 master weights, and fp16 its loss scale,
    restored). Checkpoints land in complete step folders with their info."""
    plan = make_plan([6], num_micro_batches=2, dtype=dtype)
    np.save(tmp_path / "t.npy", _tokens(3000))
    data = TokenSource(tmp_path / "t.npy")
    whole = train(plan, 4, data=data, environ={})
    dist.destroy_process_group()
    folder = tmp_path / "ckpt"
    first = train(plan, 2, data=data, checkpoint=CheckpointConfig(folder, 1), environ={})
    resumed = train(
        plan, 4, data=data, checkpoint=CheckpointConfig(folder, 2, resume=True), environ={}
    )
    assert [s.step for s in first.steps + resumed.steps] == [0, 1, 2, 3]
    losses = [s.loss for s in first.steps + resumed.steps]
    tolerance = TOLERANCE if dtype == "fp64" else 0.0
    close = [abs(a - b.loss) <= tolerance for a, b in zip(losses, whole.steps, strict=True)]
    assert close == [True] * 4
    assert sorted(p.name for p in folder.iterdir()) == [
        "step-00000001",
        "step-00000002",
        "step-00000004",
    ]
    info = read_json_model(step_dir(folder, 4) / INFO_NAME, CheckpointInfo)
    assert (info.step, info.model, info.dtype, info.world_size) == (4, "gpt-tiny", dtype, 1)
    assert latest_checkpoint(folder) == (step_dir(folder, 4), info)


def test_a_partial_save_is_not_a_checkpoint_and_nothing_is_written_over(tmp_path: Path) -> None:
    plan = make_plan([6], num_micro_batches=2)
    folder = tmp_path / "ckpt"
    train(plan, 2, checkpoint=CheckpointConfig(folder, 2), environ={})
    # What a crash in the middle of saving step 3 leaves: a partial folder, and a step folder
    # without its info. Neither is taken for the latest checkpoint.
    (folder / ".step-00000003.partial").mkdir()
    (folder / "step-00000005").mkdir()
    assert latest_checkpoint(folder)[0] == step_dir(folder, 2)
    # Without --resume the folder is refused (its checkpoints would mix with this run's).
    with pytest.raises(InputError, match=r"holds checkpoints .* after 2 steps.*--resume"):
        train(plan, 3, checkpoint=CheckpointConfig(folder, 1), environ={})
    before = (step_dir(folder, 2) / INFO_NAME).read_bytes()
    resumed = train(plan, 3, checkpoint=CheckpointConfig(folder, 1, resume=True), environ={})
    assert [s.step for s in resumed.steps] == [2]
    assert (step_dir(folder, 2) / INFO_NAME).read_bytes() == before
    assert not (folder / ".step-00000003.partial").exists()  # replaced by the complete one
    assert (step_dir(folder, 3) / INFO_NAME).is_file()
    with pytest.raises(InputError, match="at step 3 already; --steps 3"):
        train(plan, 3, checkpoint=CheckpointConfig(folder, resume=True), environ={})


def test_a_checkpoint_of_another_model_or_batch_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    train(make_plan([6], num_micro_batches=2), 1, checkpoint=CheckpointConfig(folder), environ={})
    other = make_plan([6], num_micro_batches=4)  # 8 samples a step, not 4
    with pytest.raises(InputError, match="global batch 4; this plan's is 8"):
        train(other, 2, checkpoint=CheckpointConfig(folder, resume=True), environ={})
    # --resume on an empty folder starts afresh.
    fresh = train(other, 1, checkpoint=CheckpointConfig(tmp_path / "new", resume=True), environ={})
    assert [s.step for s in fresh.steps] == [0]


def test_the_runtime_command_takes_data_and_checkpoint_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m autoplan.runtime``'s main as one process: trains on the file, saves,
    resumes; a bad option is one line and exit code 2."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    plan = make_plan([6], num_micro_batches=2)
    write_json_model(tmp_path / "plan.json", plan)
    _tokens(3000).tofile(tmp_path / "tokens.bin")

    def run(*args: str) -> int:
        return runtime_main.main(["plan.json", *args])

    common = ["--data", "tokens.bin", "--checkpoint-dir", "ckpt"]
    assert run(*common, "--steps", "2", "--save-every", "1", "--report", "a.json") == 0
    assert run(*common, "--steps", "3", "--resume", "--report", "b.json") == 0
    steps = [read_json_model(tmp_path / f"{name}.json", RunReport).steps for name in "ab"]
    expected, _ = reference_training(plan, 3, batches=full_batches(plan, tmp_path / "tokens.bin"))
    losses = [s.loss for s in steps[0] + steps[1]]
    assert [abs(a - b) < TOLERANCE for a, b in zip(losses, expected, strict=True)] == [True] * 3
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "step-00000003"
    capsys.readouterr()
    for args, message in (
        (["--resume"], "error: --save-every and --resume need --checkpoint-dir"),
        (["--data-dtype", "uint16"], "error: --data-dtype and --no-shuffle describe a --data"),
        (["--data", "nothing.npy"], "error: --data nothing.npy: no such file"),
        ([*common, "--steps", "3"], "error: --checkpoint-dir ckpt holds checkpoints"),
        (["--checkpoint-dir", "plan.json"], "error: --checkpoint-dir plan.json: is a file"),
    ):
        assert run(*args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), lines
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_runtime_lists_the_token_dtypes_without_importing_torch() -> None:
    assert runtime_main.TOKEN_DTYPES == TOKEN_DTYPES


def test_autoplan_run_checks_its_data_and_checkpoint_options_before_starting(
    tmp_path: Path,
) -> None:
    """``autoplan run --local``: a bad token file, option or checkpoint folder is one line
    and exit code 2 before any process starts (no launch here)."""
    from typer.testing import CliRunner

    from autoplan.cli import app

    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([6], num_micro_batches=2))
    np.save(tmp_path / "short.npy", _tokens(20))
    folder = tmp_path / "ckpt"
    train(make_plan([6], num_micro_batches=2), 1, checkpoint=CheckpointConfig(folder), environ={})
    cases = [
        (["--data", str(tmp_path / "none.npy")], "no such file"),
        (["--data", str(tmp_path / "short.npy")], "1 samples of 16 (+1) tokens"),
        (["--data-dtype", "uint16"], "--data-dtype and --no-shuffle describe a --data file"),
        (["--resume"], "--save-every and --resume need --checkpoint-dir"),
        (["--checkpoint-dir", str(plan_path)], "is a file; give a folder"),
        (["--checkpoint-dir", str(folder)], "holds checkpoints (the latest after 1 steps)"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, ["run", str(plan_path), "--local", *args])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, lines)


def test_an_fp16_runs_loss_scale_is_saved_and_restored(tmp_path: Path) -> None:
    """The dynamic loss scale (value, clean and skipped steps) travels with the checkpoint,
    as do a module's weights and AdamW states (one process, the functions train() calls)."""
    from types import SimpleNamespace

    from autoplan.runtime.checkpoint import load_checkpoint, save_checkpoint
    from autoplan.runtime.mixed_precision import DynamicLossScale

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scale = DynamicLossScale()
    scale.value, scale.clean_steps, scale.skipped_steps = 1024.0, 7, 3
    info = CheckpointInfo(
        step=1,
        model="m",
        dtype="fp16",
        global_batch_size=1,
        seq_len=1,
        plan_summary="",
        world_size=1,
        seed=0,
    )
    engine = SimpleNamespace(models=[model], optimizers=[optimizer])
    path = save_checkpoint(CheckpointConfig(tmp_path), 1, engine, info, scale)

    fresh_model = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    fresh_scale = DynamicLossScale()
    fresh = SimpleNamespace(models=[fresh_model], optimizers=[fresh_optimizer])
    load_checkpoint(path, fresh, fresh_scale)
    assert (fresh_scale.value, fresh_scale.clean_steps, fresh_scale.skipped_steps) == (1024.0, 7, 3)
    assert torch.equal(fresh_model.weight, model.weight)
    moments = fresh_optimizer.state[fresh_model.weight]["exp_avg"]
    assert torch.equal(moments, optimizer.state[model.weight]["exp_avg"])
    # A model whose names differ (a plan of another model) is one line, naming the key.
    other = torch.nn.Sequential(torch.nn.Linear(3, 2))
    stranger = SimpleNamespace(models=[other], optimizers=[torch.optim.AdamW(other.parameters())])
    refusal = r"does not fit this plan's model: Missing key .* model\.0\."
    with pytest.raises(InputError, match=refusal):
        load_checkpoint(path, stranger)
