"""Why there is no plan, said truly: the megatron baseline names its cause (it costs every GPU
as the cluster's slowest and smallest type, so it can fail where the real cluster has room), a
search stopped by its time limit does not claim that nothing fits, and each message has a
short form for a sweep's table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.errors import InfeasibleError, InputError
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, solve, solve_outcome
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

REPO = Path(__file__).resolve().parents[1]


def test_llama2_70b_megatron_on_h100_a100_l4_says_it_sees_only_l4s(tmp_path: Path) -> None:
    # The README's former example: 48 GPUs seen as L4s (24 GiB) cannot hold 70B's states.
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "autoplan"),
            "solve",
            str(REPO / "profiles" / "llama2-70b.profile.json"),
            "--cluster",
            "h100-a100-l4",
            "--global-batch",
            "256",
            "--strategy",
            "megatron",
            "-o",
            str(tmp_path / "grid.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    message = lines[0]
    assert "megatron baseline costs every GPU as the cluster's slowest and smallest" in message
    assert "L4 speed, 24 GiB each" in message
    assert "where the cluster has 3.16 TB" in message
    assert "--strategy optimal" in message
    assert not (tmp_path / "grid.json").exists()


def test_optimal_plans_where_the_blind_pool_is_too_small() -> None:
    # 4 GPUs of 16 GiB beside 4 of 0.5 GiB: the blind pool has 8 × 0.5 GiB = 4 GiB for a
    # model of ~2.7 GB of states plus activations; the real cluster has 66 GiB.
    profile = transformer_profile(blocks=8, hidden=1024, seq_len=512, heads=16)
    cluster = make_cluster(
        [("big", gpu("BIG", 200, 16), 4, 1), ("small", gpu("SMALL", 50, 0.5), 4, 1)]
    )
    with pytest.raises(InfeasibleError, match=r"SMALL speed, 0\.5 GiB each"):
        solve(profile, cluster, 16, SolveOptions(strategy="megatron"))
    plan = solve(profile, cluster, 16, SolveOptions(time_limit_s=20))
    assert plan.prediction.tokens_per_s > 0


def test_a_search_stopped_before_any_plan_says_so_not_that_nothing_fits() -> None:
    # Llama-2-70B fits 8 H100 + 8 A100 + 8 L4 (a 30 s search finds a plan); a search that
    # stops at once has found none, which proves nothing about memory. Two stages pinned: the
    # shared single-stage family (one share program, well under a millisecond) would find a
    # plan in the moment a run past the deadline gets, on a fast enough machine.
    llama = read_json_model(REPO / "profiles" / "llama2-70b.profile.json", Profile)
    six = load_cluster(example_cluster_path("h100-a100-l4"))
    cluster = six.model_copy(
        update={"node_groups": [g.model_copy(update={"count": 1}) for g in six.node_groups]}
    )
    with pytest.raises(InfeasibleError) as caught:
        solve(llama, cluster, 64, SolveOptions(time_limit_s=0.001, pp=2))
    assert "time limit (0.001 s) stopped the search before it found a plan" in str(caught.value)
    assert caught.value.short == "time limit: no plan found"


def test_proven_causes_have_a_short_form_and_a_timed_out_plan_says_so() -> None:
    llama = read_json_model(REPO / "profiles" / "llama2-70b.profile.json", Profile)
    one_node = load_cluster(example_cluster_path("a100x8"))
    with pytest.raises(InfeasibleError) as caught:
        solve(llama, one_node, 64, SolveOptions(time_limit_s=0.001))
    assert caught.value.short == "model states 1.10 TB > 687.2 GB of memory"
    assert str(caught.value).startswith("weights, gradients and optimizer states need 1.10 TB")
    profile = transformer_profile(blocks=4, hidden=256, seq_len=128, heads=8)
    cluster = make_cluster([("big", gpu("BIG", 200, 16), 4, 1)])
    outcome = solve_outcome(profile, cluster, 16, SolveOptions(time_limit_s=20))
    assert not outcome.timed_out and outcome.violation is None


def test_a_pinned_cp_beyond_the_gpu_count_names_the_gpu_count_not_memory() -> None:
    # It said "no configuration with {'cp': '8'} fits in memory" on 4 GPUs of ample memory.
    profile = transformer_profile(blocks=2, hidden=256, seq_len=128, heads=8)
    cluster = make_cluster([("big", gpu("BIG", 200, 16), 4, 1)])
    with pytest.raises(InfeasibleError) as caught:
        solve(profile, cluster, 8, SolveOptions(cp=8, cp_min_seq_len=1))
    assert caught.value.short == "pp × dp × cp × tp = 8 > 4 GPUs"
    assert str(caught.value) == "pp × dp × cp × tp = 8 GPUs asked; the cluster has 4"


def test_a_reserve_that_leaves_no_memory_is_an_input_error_and_the_diagnosis_counts_it() -> None:
    # A reserve of a GPU's whole memory used to run the search and then say that nothing
    # fits "on GPUs of at most 17.2 GB", which the user could not square with the cluster.
    profile = transformer_profile(blocks=4, hidden=256, seq_len=128, heads=8)
    cluster = make_cluster([("big", gpu("BIG", 200, 16), 4, 1)])
    whole = cluster.model_copy(update={"memory_reserve_gib": 16.0})
    with pytest.raises(InputError, match=r"memory reserve \(16 GiB\) leaves nothing of BIG's"):
        solve(profile, whole, 16, SolveOptions())
    with pytest.raises(InputError, match=r"memory reserve \(18\.6265 GiB\) leaves nothing"):
        solve(profile, cluster, 16, SolveOptions(reserve_gb=20))
    # A reserve that leaves a megabyte: nothing fits, and the message gives usable memory.
    tight = cluster.model_copy(update={"memory_reserve_gib": 16.0 - 2**-10})
    with pytest.raises(InfeasibleError) as caught:
        solve(profile, tight, 16, SolveOptions(time_limit_s=20))
    assert "GPUs of at most 0.0 GB usable (capacity less the memory reserve)" in str(caught.value)
