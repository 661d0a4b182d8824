"""Sequence parallelism in the cost model and the search (autoplan.cost.sequence_parallel,
autoplan.solve.sequence_parallel): Korthikanti et al.'s activation figure, the collectives,
the searched knob against both pinned settings, and the 1T case of issue 12."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.catalog import gpu_specs, load_cluster
from autoplan.cluster.schema import Cluster
from autoplan.cost.comm import ring_allreduce_ms
from autoplan.cost.config import (
    PlanConfig,
    ReplicaGroup,
    StageChoice,
    canonical_sequence_parallel,
)
from autoplan.cost.layers import layer_cost
from autoplan.cost.model import CostModel
from autoplan.cost.sequence_parallel import ring_collective_ms, sequence_runs
from autoplan.errors import InfeasibleError
from autoplan.export import layer_kinds
from autoplan.export.megatron import megatron_args
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.plan.validate import plan_problems, validate_plan
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.sequence_parallel import sequence_parallel_runs
from tests.plan_factory import make_plan
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile, transformer_profile
from tests.test_solver_oracle import brute_force_hetero

ROOT = Path(__file__).resolve().parents[1]
A100 = gpu("A", 100.0, 80.0)


def _block_cost(block, tp: int, sp: bool, latency_us: float = 0.0):
    return layer_cost(
        block,
        A100,
        100.0,
        tp=tp,
        micro_batch_size=2,
        profile_micro_batch_size=2,
        intra_node_bandwidth_gb_per_s=100.0,
        intra_node_latency_us=latency_us,
        sequence_parallel=sp,
    )


@pytest.fixture(scope="module")
def gpt2_block():
    return profile_model("gpt2-small", 1024, 2, "bf16").layers[1]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_saved_activations_are_korthikanti_over_t(gpt2_block, tp: int) -> None:
    """Korthikanti et al. 2022, eq. 3 and 5: sbh(10 + 24/t + 5as/(ht)) under tp alone,
    sbh(34 + 5as/h)/t with sequence parallelism. GPT-2 here has no dropout (two sbh-byte
    masks fewer: 10 → 8, 34 → 32) and flash attention (no 5as/h term)."""
    sbh = 1024 * 2 * 768
    plain = _block_cost(gpt2_block, tp, sp=False)
    sp = _block_cost(gpt2_block, tp, sp=True)
    assert plain.saved_bytes["none"] == pytest.approx(sbh * (8 + 24 / tp), rel=0.01)
    assert sp.saved_bytes["none"] == pytest.approx(sbh * 32 / tp, rel=0.01)
    # Full recompute keeps the block's input: sequence-sharded under SP.
    assert sp.saved_bytes["full"] == pytest.approx(2 * sbh / tp)
    assert plain.saved_bytes["full"] == pytest.approx(2 * sbh)
    # The replicated part (norms, residual adds) is sharded too: less time, never more work.
    assert sp.forward_compute_ms <= plain.forward_compute_ms
    assert sp.backward_compute_ms <= plain.backward_compute_ms


def test_collectives_are_reduce_scatter_plus_all_gather(gpt2_block) -> None:
    """Each all-reduce becomes a reduce-scatter and an all-gather: the same ring volume and
    latency steps; backward adds the re-gather of the two column-split inputs."""
    tp, payload = 4, gpt2_block.tensor_parallel.allreduce_payload_bytes
    for latency in (0.0, 5.0):
        plain = _block_cost(gpt2_block, tp, sp=False, latency_us=latency)
        sp = _block_cost(gpt2_block, tp, sp=True, latency_us=latency)
        one = ring_collective_ms(payload, tp, 100.0, latency)
        assert 2 * one == pytest.approx(ring_allreduce_ms(payload, tp, 100.0, latency))
        assert sp.forward_tp_comm_ms == pytest.approx(plain.forward_tp_comm_ms)  # 2 RS + 2 AG
        assert sp.regather_ms == pytest.approx(2 * one)
        assert sp.backward_tp_comm_ms == pytest.approx(plain.backward_tp_comm_ms + 2 * one)
        # Full recompute's forward redoes the all-gathers: no separate re-gather then.
        assert sp.backward_ms("full") == pytest.approx(
            sp.backward_compute_ms + 4 * one + sp.forward_ms()
        )


def test_only_blocks_are_sequence_sharded(gpt2_block) -> None:
    profile = profile_model("gpt2-small", 1024, 2, "bf16")
    for index in (0, len(profile.layers) - 1):  # the embedding and the head
        edge = profile.layers[index]
        assert _block_cost(edge, 4, sp=True) == _block_cost(edge, 4, sp=False)
    assert _block_cost(gpt2_block, 1, sp=True) == _block_cost(gpt2_block, 1, sp=False)
    assert sequence_runs(["embedding", "block", "block", "head"]) == 1
    assert sequence_runs(["block", "other", "block"]) == 2
    assert sequence_runs(["embedding", "head"]) == 0


def _megatron_1t(recompute: str, sp: bool) -> tuple[CostModel, PlanConfig]:
    profile = Profile.model_validate_json((ROOT / "profiles/megatron-1t.profile.json").read_text())
    cluster = load_cluster(ROOT / "profiles/clusters/megatron-a100.yaml")
    # As Megatron-LM runs it (its pipeline receives into tensors freed once used: no
    # per-micro-batch receive buffers for 512 micro-batches, unlike torch's pipelining).
    model = CostModel(profile, cluster, gpu_specs(cluster)).with_engine("megatron-deepspeed")
    # SC'21 Table 1: 3072 A100s = tp 8 × pp 64 × dp 6, GBS 3072, micro-batch 1; the 130
    # layers are the embedding, 128 blocks and the head: two blocks a stage.
    bounds = [0, *(1 + 2 * (i + 1) for i in range(63)), 130]
    group = (ReplicaGroup(0, 8, 6, 1, recompute),)
    stages = tuple(StageChoice(bounds[i], bounds[i + 1], group, 1) for i in range(64))
    return model, PlanConfig(512, "1f1b", 1, stages, sequence_parallel=sp)


def test_megatron_1t_fits_with_selective_recompute_only_under_sp() -> None:
    """Issue 12's user case: without SP the first stage's 64 micro-batches in flight do not
    fit under selective recompute; with SP they do, and selective is faster than full."""
    runs = {}
    for sp in (False, True):
        for recompute in ("selective", "full"):
            model, config = _megatron_1t(recompute, sp)
            runs[sp, recompute] = model.evaluate(config)
    assert not runs[False, "selective"].feasible
    assert runs[False, "full"].feasible
    assert runs[True, "selective"].feasible
    assert runs[True, "selective"].iteration_ms < runs[True, "full"].iteration_ms
    assert runs[True, "selective"].iteration_ms < runs[False, "full"].iteration_ms
    # Rank 0's activations: 64 in flight × 2 blocks × sbh·34/t (32 without dropout masks).
    sbh = 2048 * 25600
    held = runs[True, "selective"].memory[0].activations_bytes
    assert held == pytest.approx(64 * 2 * sbh * 32 / 8, rel=0.05)
    # Korthikanti et al. Table 4: selective + SP is 1.4% slower than no recompute, full 36%:
    # selective's time advantage over full recompute is most of a forward pass.
    assert runs[True, "full"].iteration_ms / runs[True, "selective"].iteration_ms > 1.2


def _solve(profile, cluster, batch, sp, **pinned):
    try:
        options = SolveOptions(sequence_parallel=sp, top_k=1, **pinned)
        return solve(profile, cluster, batch, options)
    except InfeasibleError:
        return None


def test_searched_knob_is_at_most_the_better_pinned_setting() -> None:
    """solve(None) is no slower than the better of solve(True) and solve(False) (it may mix
    SP and non-SP stages: a space both contain), on instances where either wins: SP costs
    time on these profiles (no replicated work to shard, a re-gather more) and saves memory,
    so it is chosen where memory is tight."""
    profile = transformer_profile(4, 1024, 1024, vocab=8192, heads=16)
    chosen = set()
    for memory_gib, intra, pinned in [
        (0.5, 100.0, {}),
        (1.0, 100.0, {"tp": 2}),
        (2.0, 1000.0, {"tp": 2}),
        (80.0, 1000.0, {}),
    ]:
        cluster = make_cluster([("n", gpu("G", 100.0, memory_gib), 4, 1)], intra_gb_per_s=intra)
        free = _solve(profile, cluster, 8, None, **pinned)
        on = _solve(profile, cluster, 8, True, **pinned)
        off = _solve(profile, cluster, 8, False, **pinned)
        assert free is not None and on is not None and off is not None
        assert on.parallelism.sequence_parallel and not off.parallelism.sequence_parallel
        best = min(on.prediction.iteration_time_ms, off.prediction.iteration_time_ms)
        assert free.prediction.iteration_time_ms <= best * (1 + 1e-9)
        chosen.add(free.parallelism.sequence_parallel)
        if free.parallelism.sequence_parallel:
            assert any(r.tensor_parallel_degree > 1 for s in free.stages for r in s.replicas)
    assert chosen == {True, False}


def _mixed_instance() -> tuple[Profile, Cluster]:
    """Two node types of 2 GPUs: B (200 TFLOPs, 12 GiB) holds three of four heavy layers only
    with SP or full recompute (their activations at tp 2 without SP do not fit), A (25
    TFLOPs, 6 GiB) the fourth without it; their NVLink is slow (2 GB/s), so SP's extra
    all-gathers cost A's stage more than they save it."""
    layers = [
        layer(i, flops=10**12, params=4 * 10**8, saved=2 * 10**9, output=10**7, tp_divides=2)
        for i in range(4)
    ]
    cluster = make_cluster(
        [("a", gpu("A", 25.0, 6.0), 2, 1), ("b", gpu("B", 200.0, 12.0), 2, 1)],
        intra_gb_per_s=2.0,
        inter_gb_per_s=10.0,
    )
    return make_profile(layers), cluster


def test_a_plan_mixing_sp_and_non_sp_stages_beats_both_pinned_settings() -> None:
    """On ``_mixed_instance`` the search's best runs SP on B's stage and not on A's, and is
    strictly faster than the best with SP pinned on and the best with it pinned off; it is
    the brute-force optimum over every pipeline with each stage's SP enumerated, and proven
    (its bound is its time)."""
    profile, cluster = _mixed_instance()
    batch = 2
    best = {}
    for sp in (None, True, False):
        options = SolveOptions(sequence_parallel=sp, top_k=1, zero_bubble=False)
        model = cost_model(profile, cluster, options)
        result = solve_candidates(model, batch, options)
        found = [c for c in result.candidates if c.cost.feasible]
        best[sp] = (found[0], result.lower_bound_ms)
        # Pinned, the setting is the whole plan's: on in every tp > 1 stage, or in none.
        for candidate in result.candidates if sp is not None else []:
            settings = {
                candidate.config.stage_sequence_parallel(s)
                for s, stage in enumerate(candidate.config.stages)
                if stage.tensor_parallel
            }
            assert settings <= {sp}, candidate.config.summary()
            assert not any(stage.sequence_parallel for stage in candidate.config.stages)
    mixed, bound = best[None]
    config = mixed.config
    tensor = [s for s, stage in enumerate(config.stages) if stage.tensor_parallel]
    runs_sp = {config.stages[s].classes: config.stage_sequence_parallel(s) for s in tensor}
    assert runs_sp == {(1,): True, (0,): False}, config.summary()
    assert mixed.iteration_ms < 0.97 * best[True][0].iteration_ms
    assert mixed.iteration_ms < 0.97 * best[False][0].iteration_ms
    model = cost_model(profile, cluster, SolveOptions(zero_bubble=False))
    expected = brute_force_hetero(model, batch, per_stage_sp=True)
    assert math.isclose(mixed.iteration_ms, expected, rel_tol=1e-9)
    assert math.isclose(bound, mixed.iteration_ms, rel_tol=1e-9)
    # Said one way: per stage, only on the tp > 1 stage that runs it, not plan-wide.
    assert not config.sequence_parallel
    assert canonical_sequence_parallel(config) == config
    # The plan written says so stage by stage, is valid, and predicts the search's figure.
    plan = solve(profile, cluster, batch, SolveOptions(top_k=1, zero_bubble=False))
    validate_plan(plan, profile)
    assert not plan.parallelism.sequence_parallel
    flags = {s.replicas[0].gpu_type: s.sequence_parallel for s in plan.stages}
    assert flags == {"A": False, "B": True}, flags
    assert math.isclose(plan.prediction.iteration_time_ms, mixed.iteration_ms, rel_tol=1e-6)


def test_cli_sp_flag_emits_a_valid_sp_plan_and_show_says_so(tmp_path: Path) -> None:
    runner = CliRunner()
    profile_path, cluster_path = tmp_path / "profile.json", tmp_path / "cluster.yaml"
    write_json_model(profile_path, transformer_profile(4, 1024, 1024, vocab=8192, heads=16))
    cluster = make_cluster([("n", gpu("G", 100.0, 80.0), 4, 1)])
    cluster_path.write_text(yaml.safe_dump(cluster.model_dump(mode="json")))
    args = ["solve", str(profile_path), "--cluster", str(cluster_path), "--global-batch", "8"]
    for flag, expected in (("--sp", True), ("--no-sp", False)):
        out = tmp_path / f"plan{flag}.json"
        result = runner.invoke(app, [*args, flag, "-o", str(out)])
        assert result.exit_code == 0, result.output
        plan = read_json_model(out, Plan)
        assert plan.parallelism.sequence_parallel is expected
        assert plan.inputs.pinned["sequence_parallel"] == str(expected)
        validate_plan(plan)
        if expected:
            assert {r.tensor_parallel_degree for s in plan.stages for r in s.replicas} != {1}


def test_validator_rules_and_show(tmp_path: Path) -> None:
    no_tp = plan_problems(make_plan([2, 4], sequence_parallel=True))
    assert any("no replica runs tensor parallel" in p for p in no_tp)
    odd = plan_problems(make_plan([6], tensor_parallel=2, sequence_parallel=True, seq_len=15))
    assert any("does not divide the sequence length 15" in p for p in odd)
    good = make_plan([6], tensor_parallel=2, sequence_parallel=True)
    assert not any("sequence" in p for p in plan_problems(good))
    path = tmp_path / "plan.json"
    write_json_model(path, good)
    result = CliRunner().invoke(app, ["show", str(path)])
    assert result.exit_code == 0, result.output
    assert "sequence parallelism (SP) on" in result.output


def test_megatron_export_says_sequence_parallel() -> None:
    for sp in (True, False):
        plan = make_plan([6], tensor_parallel=2, sequence_parallel=sp, dtype="bf16")
        assert (["--sequence-parallel"] in megatron_args(plan, layer_kinds(plan, None))) is sp


def test_sequence_parallel_runs_by_pinning() -> None:
    """The runs of ``sequence_parallel_runs``: unpinned, SP off with the uniform and
    heterogeneous families choosing it per stage, and SP on with neither (its shared family
    tp > 1 only); --no-sp one run without it; --sp one run per tp > 1, SP for the whole
    plan, each with its uniform and heterogeneous families; tp pinned to 1: one run without
    it."""
    profile, cluster = _mixed_instance()
    model = cost_model(profile, cluster, SolveOptions())
    free = sequence_parallel_runs(model, SolveOptions())
    assert [
        (r.sequence_parallel, r.tensor_parallel_only, r.uniform, r.heterogeneous, r.per_stage)
        for r in free
    ] == [
        (False, False, True, True, True),
        (True, True, False, False, False),
    ]
    (off,) = sequence_parallel_runs(model, SolveOptions(sequence_parallel=False))
    assert (off.sequence_parallel, off.per_stage, off.uniform, off.heterogeneous) == (
        False,
        False,
        True,
        True,
    )
    pinned = sequence_parallel_runs(model, SolveOptions(sequence_parallel=True))
    assert [
        (r.sequence_parallel, r.options.tp, r.uniform, r.heterogeneous, r.per_stage) for r in pinned
    ] == [(True, 2, True, True, False)]
    (one,) = sequence_parallel_runs(model, SolveOptions(tp=1))
    assert (one.sequence_parallel, one.per_stage) == (False, False)
