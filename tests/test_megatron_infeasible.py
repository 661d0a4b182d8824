"""The megatron baseline's infeasibility message names its cause: it costs every GPU as the
cluster's slowest and smallest type, so it can fail where the real cluster has room."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.errors import InfeasibleError
from autoplan.solve import SolveOptions, solve
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
