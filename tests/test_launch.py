"""`autoplan launch` writes per-node torchrun commands and a Slurm script matching the plan's
nodes; `autoplan run --local` starts them (one real run, with nodes of 1 and 2 processes) and
refuses what it cannot run locally."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.ranks import NodeSlice, build_rank_map
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport
from tests.plan_factory import CPU_GPU, make_plan
from tests.single_process_reference import reference_training

runner = CliRunner()


def _two_node_plan() -> Plan:
    """pp = 3: stage 0 on node a-0 (1 process), stages 1 and 2 on node b-0 (2 processes)."""
    cluster = Cluster(
        name="two-nodes",
        gpu_types=[CPU_GPU],
        node_groups=[
            NodeGroup(name="a", gpu="cpu", gpus_per_node=1, intra_node_bandwidth_gb_per_s=5),
            NodeGroup(name="b", gpu="cpu", gpus_per_node=2, intra_node_bandwidth_gb_per_s=5),
        ],
        inter_node_bandwidth_gb_per_s=1,
    )
    node_a, node_b = cluster.nodes()
    nodes, rank_map = build_rank_map(
        [[NodeSlice(node_a, 1)], [NodeSlice(node_b, 1)], [NodeSlice(node_b, 1)]], 1, 1
    )
    plan = make_plan([2, 2, 2])
    inputs = plan.inputs.model_copy(update={"cluster": cluster})
    return plan.model_copy(update={"nodes": nodes, "rank_map": rank_map, "inputs": inputs})


def test_launch_writes_one_torchrun_per_node_and_a_slurm_script(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, _two_node_plan())
    out = tmp_path / "launch"
    result = runner.invoke(
        app,
        [
            "launch",
            str(plan_path),
            "-o",
            str(out),
            "--master-addr",
            "10.1.2.3",
            "--master-port",
            "29611",
            "--steps",
            "7",
        ],
    )
    assert result.exit_code == 0, result.output
    node0 = (out / "node0-a-0.sh").read_text()
    node1 = (out / "node1-b-0.sh").read_text()
    for script, node_rank, nproc in [(node0, 0, 1), (node1, 1, 2)]:
        assert "--nnodes=2" in script
        assert f"--node-rank={node_rank}" in script
        assert f"--nproc-per-node={nproc}" in script
        assert "--master-addr=10.1.2.3 --master-port=29611" in script
        assert "-m autoplan.runtime plan.json --steps 7" in script
    slurm = (out / "launch.slurm").read_text()
    assert "#SBATCH --nodes=2" in slurm
    sruns = [line for line in slurm.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 2
    assert '--nodelist="${HOSTS[0]}"' in sruns[0] and '--nodelist="${HOSTS[1]}"' in sruns[1]
    assert "--node-rank=0 --nproc-per-node=1" in sruns[0]
    assert "--node-rank=1 --nproc-per-node=2" in sruns[1]
    for script in (out / "node0-a-0.sh", out / "node1-b-0.sh", out / "launch.slurm"):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_launch_without_master_addr_reads_it_from_the_environment(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, _two_node_plan())
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    script = (tmp_path / "out" / "node1-b-0.sh").read_text()
    assert '--master-addr="$MASTER_ADDR"' in script
    assert "set MASTER_ADDR to the address of a-0" in script
    failed = subprocess.run(
        ["bash", str(tmp_path / "out" / "node1-b-0.sh")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert failed.returncode != 0 and "set MASTER_ADDR" in failed.stderr


def test_run_refuses_without_local_and_plans_too_big_for_one_machine(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([3, 3], data_parallel=3, tensor_parallel=2))
    result = runner.invoke(app, ["run", str(plan_path), "--local"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: the plan needs 12 processes; run --local starts at most 8 on one machine "
        "(use `autoplan launch` for a cluster)"
    ]
    result = runner.invoke(app, ["run", str(plan_path)])
    assert result.exit_code == 2 and "needs --local" in result.output
    write_json_model(plan_path, make_plan([3, 3], model="llama-tiny", num_model_layers=8))
    result = runner.invoke(app, ["run", str(plan_path), "--local"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: model 'llama-tiny' has 6 layers; the plan was made for 8"
    ]


def test_launch_and_run_modules_do_not_import_torch() -> None:
    code = "import sys, autoplan.launch, autoplan.cli.run_cmd; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.distributed
def test_run_local_starts_nodes_with_different_process_counts(tmp_path: Path) -> None:
    """Two torchrun agents on localhost (1 and 2 processes), static rendezvous by --node-rank:
    ranks land where the plan's rank map says (the runtime checks), and training is exact."""
    plan = _two_node_plan()
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, plan)
    report_path = tmp_path / "report.json"
    result = runner.invoke(
        app, ["run", str(plan_path), "--local", "--steps", "2", "--report", str(report_path)]
    )
    assert result.exit_code == 0, result.output
    report = read_json_model(report_path, RunReport)
    assert report.world_size == 3
    expected, _ = reference_training(plan, 2)
    for step, loss in zip(report.steps, expected, strict=True):
        assert abs(step.loss - loss) < 1e-10
