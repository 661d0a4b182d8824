"""The profiler against closed forms and against real runs.

Closed forms: Megatron-LM's per-block FLOPs 24·b·s·h²(1 + s/6h) (Narayanan et al., SC'21;
the full s×s attention, no causal halving), LLaMA's linears + attention, Korthikanti et al.'s
per-block activation bytes sbh(10 + 24/t) without dropout masks. Real runs: the bytes a real
CPU forward keeps alive, measured with MemTracker (a different mechanism from the profiler's
saved_tensors_hooks count).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.profile.bytes_moved import BytesMovedMode
from autoplan.profile.live_memory import bytes_held_after
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.zoo import get_model_spec


@pytest.mark.parametrize(
    ("name", "seq", "batch"),
    [("gpt2-small", 1024, 2), ("megatron-1.7b", 2048, 1), ("gpt3-175b", 2048, 1)],
)
def test_gpt_block_forward_flops_match_megatron(name: str, seq: int, batch: int) -> None:
    profile = profile_model(name, seq, batch)
    h = profile.model.hidden_size
    assert h is not None
    expected = 24 * batch * seq * h * h * (1 + seq / (6 * h))
    block = profile.layers[1]
    assert block.kind == "block"
    assert block.forward_flops == pytest.approx(expected, rel=0.01)
    # Attention is counted (the CPU flash kernel's formula is registered): QKᵀ and PV.
    assert block.selective_recompute_flops == 4 * batch * seq * seq * h
    # Backward: two matmuls per forward matmul; flash-attention backward is 2.5x its forward.
    attention = block.selective_recompute_flops
    assert block.backward_flops == 2 * (block.forward_flops - attention) + 5 * attention // 2


def test_llama_block_flops_match_the_closed_form() -> None:
    b, s = 1, 4096
    profile = profile_model("llama2-70b", s, b)
    h, heads, kv, ffn = 8192, 64, 8, 28672
    d = h // heads
    linears = 2 * b * s * (h * h + 2 * h * kv * d + h * h + 3 * h * ffn)
    attention = 4 * b * s * s * h
    assert profile.layers[1].forward_flops == pytest.approx(linears + attention, rel=0.01)
    assert profile.totals.param_count == 68_976_648_192


def test_gpt_block_activations_match_korthikanti() -> None:
    """Korthikanti et al. (2022), eq. 2 and section 4.1: sbh(34 + 5as/h) bytes per block at
    16 bits, of which sbh(10 + 24/t) without the s² terms under tensor parallelism t. With no
    dropout (two sbh-byte masks fewer) and flash attention (no s² score matrix) that is 8sbh
    replicated + 24sbh sharded."""
    b, s = 2, 1024
    profile = profile_model("gpt2-small", s, b, "bf16")
    sbh = s * b * 768
    block = profile.layers[1]
    tp = block.tensor_parallel
    assert tp is not None
    assert tp.sharded_saved_activation_bytes == pytest.approx(24 * sbh, rel=0.01)
    replicated = block.saved_activation_bytes - tp.sharded_saved_activation_bytes
    assert replicated == pytest.approx(8 * sbh, rel=0.01)
    # Two all-reduces of the block's output each way (after out/down; before q,k,v/up).
    assert (tp.forward_allreduce_count, tp.backward_allreduce_count) == (2, 2)
    assert tp.allreduce_payload_bytes == 2 * sbh
    assert tp.sharded_param_count == 12 * 768 * 768 + 3 * 768 + 4 * 768  # weights, q/k/v/up bias
    assert tp.sharded_forward_flops == block.forward_flops  # every matmul splits
    assert block.input_activation_bytes == block.output_activation_bytes == 2 * sbh


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_saved_activations_match_a_real_cpu_run(name: str) -> None:
    b, s = 4, 64
    spec = get_model_spec(name)
    torch.manual_seed(0)
    model = spec.build()
    ids = spec.example_input(b, s)

    def forward_and_loss() -> torch.Tensor:
        logits = model(ids)
        return F.cross_entropy(logits.flatten(0, -2).float(), torch.zeros(b * s, dtype=torch.long))

    held_bytes, loss = bytes_held_after(model, forward_and_loss)
    loss.backward()  # the graph was real and complete
    profile = profile_model(name, s, b, "fp32")
    # The profile also counts the token ids the embedding saves, allocated before the run.
    predicted = profile.totals.saved_activation_bytes - ids.numel() * ids.element_size()
    assert predicted == pytest.approx(held_bytes, rel=0.10)
    assert held_bytes > 100_000  # a real measurement, not an empty one


def test_identical_blocks_are_traced_once_and_replicated_exactly() -> None:
    replicated = profile_model("llama-tiny", 32, 2, "fp32")
    traced_all = profile_model("llama-tiny", 32, 2, "fp32", replicate=False)
    assert replicated.profiled_layer_indices == [0, 1, 5]
    assert [layer.replica_of for layer in replicated.layers] == [None, None, 1, 1, 1, None]
    assert traced_all.profiled_layer_indices == list(range(6))
    assert any("replica_of" in note for note in replicated.notes)
    for copy, traced in zip(replicated.layers, traced_all.layers, strict=True):
        assert copy.model_dump(exclude={"replica_of"}) == traced.model_dump(exclude={"replica_of"})


def test_tied_head_owns_no_parameters_and_totals_add_up() -> None:
    profile = profile_model("gpt2-small", 128, 1)
    head = profile.layers[-1]
    assert head.kind == "head"
    assert head.param_count == 2 * 768  # its LayerNorm; the output weight is the embedding's
    assert profile.model.parameter_count == profile.totals.param_count == 124_439_808
    assert profile.totals.param_bytes == 2 * 124_439_808
    assert profile.totals.forward_flops == sum(layer.forward_flops for layer in profile.layers)
    # Vocab-parallel: the embedding's token table splits across tp ranks (its position table
    # does not); the tied head splits the same table, which it does not own.
    embed_tp, head_tp = profile.layers[0].tensor_parallel, head.tensor_parallel
    assert embed_tp is not None and head_tp is not None
    assert embed_tp.sharded_param_count == 50257 * 768
    assert head_tp.sharded_param_count == 0


def test_vocab_parallel_embedding_and_head() -> None:
    """Megatron's vocabulary-parallel embedding (all-reduce of its b·s·h output forward) and
    LM head (column-parallel over the vocabulary: its matmuls, logits and loss split; the
    input gradient is all-reduced backward), for gpt-tiny (h 32, vocabulary 128, untied)."""
    b, s, h, vocab = 2, 16, 32, 128
    profile = profile_model("gpt-tiny", s, b, "bf16")
    embed, head = profile.layers[0], profile.layers[-1]
    bsh_bytes = b * s * h * 2
    assert embed.tensor_parallel is not None and head.tensor_parallel is not None
    e, o = embed.tensor_parallel, head.tensor_parallel
    assert e.sharded_param_count == vocab * h
    assert (e.forward_allreduce_count, e.backward_allreduce_count) == (1, 0)
    assert e.allreduce_payload_bytes == bsh_bytes
    assert e.sharded_forward_flops == 0  # a lookup
    # Its backward writes the table's gradient: V·h bf16 values, of which each rank has 1/t.
    assert e.sharded_backward_bytes_moved is not None
    assert e.sharded_backward_bytes_moved >= vocab * h * 2
    assert o.sharded_param_count == h * vocab  # the output weight (no bias)
    assert (o.forward_allreduce_count, o.backward_allreduce_count) == (0, 1)
    assert o.allreduce_payload_bytes == bsh_bytes
    # 2·b·s·h·V forward (the norm counts no FLOPs), all of it split by vocabulary.
    assert head.forward_flops == o.sharded_forward_flops == 2 * b * s * h * vocab
    assert head.backward_flops == o.sharded_backward_flops == 4 * b * s * h * vocab
    # The logits (and the loss's fp32 copies of them) split; the norm's saved input does not.
    assert o.sharded_saved_activation_bytes >= b * s * vocab * 2
    assert head.saved_activation_bytes - o.sharded_saved_activation_bytes >= bsh_bytes


def test_profile_round_trips_through_json(tmp_path: Path) -> None:
    profile = profile_model("llama-tiny", 16, 2, "bf16")
    path = tmp_path / "llama-tiny.profile.json"
    write_json_model(path, profile)
    assert read_json_model(path, Profile) == profile
    first = path.read_bytes()
    write_json_model(path, profile_model("llama-tiny", 16, 2, "bf16"))
    assert path.read_bytes() == first  # deterministic


def make_mlp(batch_size: int = 1, seq_len: int = 1) -> tuple[nn.Module, torch.Tensor]:
    """A factory: an nn.Sequential of three layers and an example input."""
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 16))
    return model, torch.randn(batch_size, seq_len, 16)


def make_single_linear() -> tuple[nn.Module, torch.Tensor]:
    """A factory whose module is not a Sequential and whose input size is fixed."""
    return nn.Linear(16, 32, bias=False), torch.randn(2, 5, 16)


def test_a_factory_sequential_profiles_per_child() -> None:
    profile = profile_model("tests.test_profile:make_mlp", 5, 2, "fp32")
    assert [layer.name for layer in profile.layers] == ["0", "1", "2"]
    assert [layer.param_count for layer in profile.layers] == [16 * 32, 0, 32 * 16 + 16]
    assert profile.layers[0].forward_flops == 2 * 2 * 5 * 16 * 32
    assert profile.layers[0].output_activation_bytes == 2 * 5 * 32 * 4
    assert profile.model.name == "tests.test_profile:make_mlp"


def test_a_factory_module_is_one_layer_with_exact_bytes_moved() -> None:
    profile = profile_model("tests.test_profile:make_single_linear", 5, 2, "fp32")
    (layer,) = profile.layers
    assert any("profiled as one layer" in note for note in profile.notes)
    rows, n_in, n_out = 2 * 5, 16, 32
    # forward: one mm reading x and W, writing y (views and reshapes move nothing).
    assert layer.forward_bytes_moved == 4 * (rows * n_in + n_in * n_out + rows * n_out)
    # backward: only grad_W = grad_yᵀ·x (the model's own input needs no gradient).
    grad_weight = n_out * rows + rows * n_in + n_out * n_in
    assert layer.backward_bytes_moved == 4 * grad_weight
    assert layer.backward_flops == layer.forward_flops == 2 * rows * n_in * n_out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gpt2-small", 2048, 1), "exceeds gpt2-small's maximum of 1024"),
        (("gpt2-small", 128, 0), "micro-batch size must be at least 1, got 0"),
        (("gpt2-small", 0, 1), "sequence length must be at least 1, got 0"),
        (("gpt2-smal", 128, 1), "did you mean gpt2-small"),
        (("tests.test_profile:nope", 8, 1), "has no 'nope'"),
        (("tests.test_profile:make_single_linear", 5, 4), r"shape \(2, 5, 16\), not 4 samples"),
    ],
)
def test_bad_sizes_and_names_raise_input_errors(args: tuple, message: str) -> None:
    with pytest.raises(InputError, match=message):
        profile_model(*args)


def test_measure_refuses_a_model_that_does_not_fit() -> None:
    with pytest.raises(InputError, match=r"needs about \d+\.\d GiB .* profile without --measure"):
        profile_model("llama2-70b", 4096, 1, "fp32", measure=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="half precision is timed on a GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_measure_refuses_half_precision_on_the_cpu(dtype: str) -> None:
    """CPU half-precision times are not what a GPU runs and vary ~100x between runs."""
    with pytest.raises(InputError, match=f"--measure in {dtype} on the CPU is not trusted"):
        profile_model("gpt-tiny", 16, 1, dtype, measure=True)  # type: ignore[arg-type]


def test_measure_times_every_layer_of_a_tiny_model() -> None:
    profile = profile_model("gpt-tiny", 16, 2, "fp32", measure=True, measure_repeats=3)
    for layer in profile.layers:
        (measured,) = layer.measured
        assert measured.repeats == 3
        assert measured.forward_ms > 0 and measured.backward_ms > 0
        assert measured.device_name.startswith(("cpu", "NVIDIA"))


REFERENCE = Path(__file__).resolve().parents[1] / "profiles"


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-145.6b", "megatron-1t"])
def test_shipped_megatron_profiles_match_the_papers_flops_per_iteration(name: str) -> None:
    """SC'21 (eq. 3 without recompute): 72·B·s·l·h²(1 + s/6h + V/12lh) per step, assuming
    backward = 2x forward everywhere. Flash attention's backward is 2.5x its forward (it
    recomputes QKᵀ), so that extra half of the attention FLOPs is taken out to compare."""
    from autoplan.zoo.presets import MEGATRON_TABLE1

    profile = read_json_model(REFERENCE / f"{name}.profile.json", Profile)
    _, h, layers = MEGATRON_TABLE1[name]
    b, s, vocab = profile.micro_batch_size, profile.seq_len, 51200
    paper = 72 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))
    total = profile.totals.forward_flops + profile.totals.backward_flops
    attention = sum(layer.selective_recompute_flops for layer in profile.layers)
    assert total - attention // 2 == pytest.approx(paper, rel=1e-6)
    assert total == pytest.approx(paper, rel=0.025)


def test_shipped_reference_profile_is_current() -> None:
    """The shipped profiles are what `autoplan profile` writes today (regenerate them with
    `autoplan profile MODEL --seq S -o profiles/MODEL.profile.json` when this fails)."""
    shipped = read_json_model(REFERENCE / "gpt2-small.profile.json", Profile)
    assert shipped == profile_model("gpt2-small", shipped.seq_len, shipped.micro_batch_size)


def test_memory_bound_bytes_are_those_of_non_matmul_ops() -> None:
    """x (4×8) @ w (8×16) then relu, fp32: the matmul reads 32 + 128 and writes 64 values
    (not memory-bound); relu reads and writes 64 values (memory-bound)."""
    with FakeTensorMode():
        x, w = torch.empty(4, 8), torch.empty(8, 16)
        moved = BytesMovedMode()
        with moved:
            torch.relu(torch.mm(x, w))
    assert moved.bytes_by_phase["forward"] == (32 + 128 + 64 + 2 * 64) * 4
    assert moved.memory_bound_bytes_by_phase["forward"] == 2 * 64 * 4


def test_profile_records_memory_bound_bytes_per_pass() -> None:
    profile = profile_model("gpt-tiny", 16, 2, "bf16")
    block = profile.layers[1]
    for total, part in (
        (block.forward_bytes_moved, block.forward_memory_bound_bytes),
        (block.backward_bytes_moved, block.backward_memory_bound_bytes),
    ):
        assert part is not None and 0 < part < total
    # Two LayerNorms read and write b·s·h bf16 values at least: 2 × 2 × b·s·h × 2 bytes.
    assert block.forward_memory_bound_bytes >= 8 * 2 * 16 * 32
    tp = block.tensor_parallel
    assert tp is not None and tp.sharded_forward_memory_bound_bytes is not None
    assert 0 < tp.sharded_forward_memory_bound_bytes < block.forward_memory_bound_bytes
    # The embedding is all lookups and adds: every byte it moves is memory-bound.
    embed = profile.layers[0]
    assert embed.forward_memory_bound_bytes == embed.forward_bytes_moved
