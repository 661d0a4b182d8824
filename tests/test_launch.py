"""`autoplan launch` writes per-node torchrun scripts and a Slurm script matching the plan's nodes
(run here with bash and stand-in torchrun/srun/scontrol, so every line really executes);
`autoplan run --local` starts them, refuses what it cannot run, and reports a failed worker in
one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.files import read_json_model, write_json_model
from autoplan.launch.local import agent_log_args, run_agents
from autoplan.launch.torchrun import NodeLaunch
from autoplan.plan.schema import Plan, PlanNode
from autoplan.runtime.report import RunReport
from tests.fake_cluster_tools import install_fake_tools, read_calls, run_script
from tests.plan_factory import CPU_GPU, ReplicaSpec, make_plan, make_stages_plan

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
    return make_stages_plan(
        [2, 2, 2],
        [[ReplicaSpec(node=0)], [ReplicaSpec(node=1)], [ReplicaSpec(node=1)]],
        cluster=cluster,
    )


def _mixed_plan() -> Plan:
    """Two GPU types: group 'fast' (2 nodes) and 'slow' (1 node), used in the launch order
    fast-0, slow-0, fast-1, so that Slurm's host order and the plan's order differ."""
    fast = CPU_GPU.model_copy(update={"name": "gpu-fast"})
    slow = CPU_GPU.model_copy(update={"name": "gpu-slow"})
    cluster = Cluster(
        name="mixed",
        gpu_types=[fast, slow],
        node_groups=[
            NodeGroup(
                name="fast",
                gpu="gpu-fast",
                gpus_per_node=2,
                count=2,
                intra_node_bandwidth_gb_per_s=5,
            ),
            NodeGroup(
                name="slow", gpu="gpu-slow", gpus_per_node=2, intra_node_bandwidth_gb_per_s=5
            ),
        ],
        inter_node_bandwidth_gb_per_s=1,
    )
    return make_stages_plan(
        [2, 2, 2],
        [
            [ReplicaSpec(node=0), ReplicaSpec(node=0)],
            [ReplicaSpec(node=2), ReplicaSpec(node=2)],
            [ReplicaSpec(tp=2, share=2, node=1)],
        ],
        cluster=cluster,
    )


def _launch(tmp_path: Path, plan: Plan, *args: str) -> Path:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, plan)
    out = tmp_path / "launch"
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


def test_launch_writes_one_torchrun_per_node_and_a_slurm_script(tmp_path: Path) -> None:
    out = _launch(
        tmp_path,
        _two_node_plan(),
        "--master-addr",
        "10.1.2.3",
        "--master-port",
        "29611",
        "--steps",
        "7",
    )
    plan_path = str((tmp_path / "plan.json").resolve())
    scripts = [out / "node0-a-0.sh", out / "node1-b-0.sh"]
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    for script in scripts:
        assert script.stat().st_mode & 0o111, "node scripts are executable"
        # Run from elsewhere: the scripts name the plan by its absolute path.
        ran = run_script(script, bin_dir, log_dir, cwd=tmp_path / "fake")
        assert ran.returncode == 0, ran.stderr
    calls = read_calls(log_dir)
    assert [(call.node_rank, call.node) for call in calls] == [("0", "a-0"), ("1", "b-0")]
    for call, nproc in zip(calls, [1, 2], strict=True):
        assert call.argv == [
            "--nnodes=2",
            f"--node-rank={call.node_rank}",
            f"--nproc-per-node={nproc}",
            "--master-addr=10.1.2.3",
            "--master-port=29611",
            "-m",
            "autoplan.runtime",
            plan_path,
            "--steps",
            "7",
            "--verbose",
        ]
    slurm = (out / "launch.slurm").read_text()
    assert "#SBATCH hetjob" in slurm  # two node groups: one job component each
    assert "#SBATCH --cpus-per-task=4" in slurm and "#SBATCH --cpus-per-task=8" in slurm
    for script in [*scripts, out / "launch.slurm"]:
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_launch_without_master_addr_reads_it_from_the_environment(tmp_path: Path) -> None:
    out = _launch(tmp_path, _two_node_plan())
    script = out / "node1-b-0.sh"
    assert '"--master-addr=${MASTER_ADDR}"' in script.read_text()
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    failed = run_script(script, bin_dir, log_dir)
    assert failed.returncode != 0 and "set MASTER_ADDR" in failed.stderr
    assert "address of plan node 0 (a-0)" in failed.stderr
    assert read_calls(log_dir) == []
    ran = run_script(script, bin_dir, log_dir, env={"MASTER_ADDR": "node-a.example"})
    assert ran.returncode == 0, ran.stderr
    assert "--master-addr=node-a.example" in read_calls(log_dir)[0].argv


def test_c10d_rendezvous_keeps_the_plan_node_rank(tmp_path: Path) -> None:
    out = _launch(tmp_path, _two_node_plan(), "--rdzv-backend", "c10d", "--master-port", "29400")
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    for script in ("node0-a-0.sh", "node1-b-0.sh"):
        ran = run_script(out / script, bin_dir, log_dir, env={"MASTER_ADDR": "10.0.0.1"})
        assert ran.returncode == 0, ran.stderr
    calls = read_calls(log_dir)
    ids = set()
    for call in calls:
        assert "--rdzv-backend=c10d" in call.argv
        assert "--rdzv-endpoint=10.0.0.1:29400" in call.argv
        assert f"--node-rank={call.node_rank}" in call.argv
        assert not any(arg.startswith("--master-addr") for arg in call.argv)
        ids |= {arg for arg in call.argv if arg.startswith("--rdzv-id=")}
    assert len(ids) == 1, "every node meets under the same rendezvous id"
    assert [call.node for call in calls] == ["a-0", "b-0"]


def test_slurm_binds_each_plan_node_to_a_host_of_its_own_gpu_type(tmp_path: Path) -> None:
    """A heterogeneous job: one component per node group, each requesting its GPU type; plan
    node 1 (the slow GPU) runs on the slow component's host although Slurm lists it last."""
    out = _launch(
        tmp_path,
        _mixed_plan(),
        "--gres",
        "gpu-fast=a100",
        "--constraint",
        "gpu-slow=v100",
        "--cpus-per-task",
        "16",
    )
    slurm = out / "launch.slurm"
    text = slurm.read_text()
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    split = header.index("#SBATCH hetjob")
    fast, slow = header[:split], header[split + 1 :]
    assert "#SBATCH --nodes=2" in fast and "#SBATCH --gres=gpu:a100:2" in fast
    assert "#SBATCH --nodes=1" in slow and "#SBATCH --gres=gpu:gpu-slow:2" in slow
    assert "#SBATCH --constraint=v100" in slow
    assert all("--cpus-per-task=16" in line for line in header if "cpus" in line)
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "fastA,fastB",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "slowA",
    }
    ran = run_script(slurm, bin_dir, log_dir, env=env)
    assert ran.returncode == 0, ran.stderr
    calls = read_calls(log_dir)
    placed = [
        (
            call.node_rank,
            call.node,
            next(o for o in call.srun_options if "het-group" in o),
            next(o for o in call.srun_options if "nodelist" in o),
        )
        for call in calls
    ]
    assert placed == [
        ("0", "fast-0", "--het-group=0", "--nodelist=fastA"),
        ("1", "slow-0", "--het-group=1", "--nodelist=slowA"),
        ("2", "fast-1", "--het-group=0", "--nodelist=fastB"),
    ]
    for call in calls:
        assert f"--node-rank={call.node_rank}" in call.argv
        assert "--master-addr=fastA" in call.argv  # the host of plan node 0
    # A component with the wrong number of hosts stops the job before any torchrun.
    short = {**env, "SLURM_JOB_NODELIST_HET_GROUP_0": "fastA"}
    for old in log_dir.iterdir():
        old.unlink()
    refused = run_script(slurm, bin_dir, log_dir, env=short)
    assert refused.returncode == 2 and "the plan needs 2" in refused.stderr
    assert read_calls(log_dir) == []


def test_slurm_of_one_node_group_is_an_ordinary_job(tmp_path: Path) -> None:
    out = _launch(tmp_path, make_plan([2, 2], data_parallel=2), "--no-gres")
    text = (out / "launch.slurm").read_text()
    assert "hetjob" not in text and "--gres" not in text and "--het-group" not in text
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    ran = run_script(
        out / "launch.slurm",
        bin_dir,
        log_dir,
        env={"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "h1"},
    )
    assert ran.returncode == 0, ran.stderr
    [call] = read_calls(log_dir)
    assert "--nodelist=h1" in call.srun_options and "--nproc-per-node=4" in call.argv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--master-port", "0"], "--master-port"),
        (["--master-port", "70000"], "--master-port"),
        (["--steps", "-1"], "--steps"),
        (["--master-addr", "h;touch x"], "not a host name"),
        (["--gres", "nosuchgpu=a100"], "uses no GPU type"),
        (["--gres", "cpu=a b"], "--gres takes GPU_TYPE=NAME"),
        (["--cpus-per-task", "0"], "--cpus-per-task"),
        (["--rdzv-backend", "etcd"], "--rdzv-backend"),
    ],
)
def test_launch_refuses_bad_options_in_one_last_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([2, 2]))
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert not (tmp_path / "out").exists()


def test_launch_refuses_a_plan_naming_a_node_not_in_its_cluster(tmp_path: Path) -> None:
    plan = make_plan([2, 2])
    nodes = [plan.nodes[0].model_copy(update={"name": "elsewhere-0"})]
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, plan.model_copy(update={"nodes": nodes}))
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "elsewhere-0" in result.stderr
    assert "not in the plan's cluster" in result.stderr
    assert not (tmp_path / "out").exists()


def test_launch_of_a_factory_plan_needs_trust(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([1, 3], model="tests.runtime_models:mlp_stack"))
    out = tmp_path / "out"
    refused = runner.invoke(app, ["launch", str(plan_path), "-o", str(out)])
    assert refused.exit_code == 2 and "--trust-factory" in refused.stderr
    assert not out.exists()
    trusted = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), "--trust-factory"])
    assert trusted.exit_code == 0, trusted.output
    # The runtime on each node refuses a factory plan unless it is named again: the scripts do.
    scripts = [f.read_text() for f in sorted(out.iterdir()) if f.is_file()]
    assert scripts and all(
        "--factory tests.runtime_models:mlp_stack" in text for text in scripts if "torchrun" in text
    )
    named = runner.invoke(
        app,
        ["launch", str(plan_path), "-o", str(out), "--factory", "tests.runtime_models:mlp_stack"],
    )
    assert named.exit_code == 0, named.output
    other = runner.invoke(app, ["launch", str(plan_path), "-o", str(out), "--factory", "a.b:c"])
    assert other.exit_code == 2 and "is not the factory" in other.stderr


def test_run_refuses_without_local_and_plans_too_big_for_one_machine(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    cluster = make_plan([3]).inputs.cluster.model_copy(
        update={
            "node_groups": [
                NodeGroup(
                    name="local", gpu="cpu", gpus_per_node=12, intra_node_bandwidth_gb_per_s=5
                )
            ]
        }
    )
    write_json_model(
        plan_path, make_plan([3, 3], data_parallel=3, tensor_parallel=2, cluster=cluster)
    )
    result = runner.invoke(app, ["run", str(plan_path), "--local"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: the plan needs 12 processes; run --local starts at most 8 on one machine "
        "(use `autoplan launch` for a cluster)"
    ]
    result = runner.invoke(app, ["run", str(plan_path)])
    assert result.exit_code == 2 and "needs --local" in result.stderr


def test_run_of_a_factory_plan_needs_trust_and_imports_nothing_without_it(tmp_path: Path) -> None:
    """The plan names a factory in a module that would leave a marker when imported: without
    --trust-factory, run refuses before importing it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_model.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef build():\n    raise SystemExit(3)\n"
    )
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([2, 2], model="planted_model:build"))
    result = runner.invoke(app, ["run", str(plan_path), "--local"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "names the factory 'planted_model:build'" in result.stderr
    assert "--trust-factory" in result.stderr
    assert not marker.exists()


def test_the_runtime_itself_refuses_an_untrusted_factory_plan(tmp_path: Path) -> None:
    """``python -m autoplan.runtime`` (what torchrun runs on every node) on a plan naming a
    planted factory: refused in one line, exit 2, the module never imported; named again with
    --factory it is imported."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_model.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef build():\n    raise SystemExit(3)\n"
    )
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([2], model="planted_model:build"))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{Path(__file__).parent.parent}"
    command = [sys.executable, "-m", "autoplan.runtime", str(plan_path), "--steps", "1"]
    refused = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "--trust-factory" in refused.stderr
    assert not marker.exists()
    other = subprocess.run(
        [*command, "--factory", "a.b:c"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert other.returncode == 2 and "is not the factory" in other.stderr
    assert not marker.exists()
    named = subprocess.run(
        [*command, "--factory", "planted_model:build"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert named.returncode != 0 and marker.exists()


def test_a_factory_that_raises_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_model.py").write_text(
        "def build():\n    raise RuntimeError('no weights\\nhere')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(app, ["profile", "broken_model:build", "--seq", "4", "-o", "p.json"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: factory 'broken_model:build' raised RuntimeError: no weights here"
    ]
    assert not (tmp_path / "p.json").exists()


def test_launch_and_run_modules_do_not_import_torch() -> None:
    code = (
        "import sys, autoplan.launch, autoplan.launch.local, autoplan.cli.run_cmd, "
        "autoplan.cli.launch_cmd; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.distributed
def test_a_failed_worker_is_one_line_naming_its_rank_and_node(tmp_path: Path) -> None:
    """Real torchrun agents (two nodes on localhost) running a script whose rank 2 fails: the
    result names rank 2 on node b-0 and its last stderr line; the whole log stays in a file."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            rank = int(os.environ["RANK"])
            print(f"rank {rank} starting")
            if rank == 2:
                print("some detail", file=sys.stderr)
                print("error: rank two cannot go on", file=sys.stderr)
                sys.exit(2)
            time.sleep(20)
            """
        )
    )
    nodes = [
        PlanNode(node_rank=0, name="a-0", gpu_type="cpu", nproc_per_node=1),
        PlanNode(node_rank=1, name="b-0", gpu_type="cpu", nproc_per_node=2),
    ]
    log_dir = tmp_path / "logs"
    launches = [
        NodeLaunch(
            node=node,
            argv=[
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node.node_rank}",
                f"--nproc-per-node={node.nproc_per_node}",
                "--master-addr=127.0.0.1",
                "--master-port=29731",
                *agent_log_args(log_dir, node.node_rank),
                str(script),
            ],
        )
        for node in nodes
    ]
    result = run_agents(launches, {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, log_dir)
    assert result.code != 0
    assert result.failure == "rank 2 on node b-0 failed: error: rank two cannot go on"
    log = result.log_path.read_text()
    assert "some detail" in log and "rank 0 starting" in log and "Root Cause" in log


@pytest.mark.distributed
def test_run_local_starts_nodes_with_different_process_counts(tmp_path: Path) -> None:
    """Two torchrun agents on localhost (1 and 2 processes), static rendezvous by --node-rank:
    ranks land where the plan's rank map says (the runtime checks), and training is exact."""
    from tests.single_process_reference import reference_training

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


def test_a_worker_named_by_its_plan_node_takes_the_plans_rank() -> None:
    """Under c10d torchrun numbers nodes by arrival: node b-0 may come first and get RANK 0.
    With the launch script's AUTOPLAN_NODE_RANK/AUTOPLAN_NODE the worker is the plan's rank
    of (b-0, local rank 0), i.e. 1; a wrong node name or local rank is one line."""
    from autoplan.errors import LaunchMismatchError
    from autoplan.runtime.launch_check import LaunchEnv, check_launch

    plan = _two_node_plan()
    torchrun = {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}
    b0 = {**torchrun, "LOCAL_WORLD_SIZE": "2", "AUTOPLAN_NODE_RANK": "1", "AUTOPLAN_NODE": "b-0"}
    env = LaunchEnv.from_environ(b0).in_plan(plan)
    assert (env.rank, env.launcher_rank, env.node_rank) == (1, 0, 1)
    assert check_launch(plan, env).node == "b-0"
    second = LaunchEnv.from_environ({**b0, "RANK": "2", "LOCAL_RANK": "1"}).in_plan(plan)
    assert (second.rank, second.launcher_rank) == (2, None)
    with pytest.raises(LaunchMismatchError, match="node rank 1 is b-0"):
        LaunchEnv.from_environ({**b0, "AUTOPLAN_NODE": "a-0"}).in_plan(plan)
    with pytest.raises(LaunchMismatchError, match="LOCAL_RANK=5"):
        LaunchEnv.from_environ({**b0, "LOCAL_RANK": "5"}).in_plan(plan)
    # Without the plan node, torchrun's numbering must match the plan's (static rendezvous).
    bare = LaunchEnv.from_environ({**torchrun, "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(LaunchMismatchError, match="--node-rank 0"):
        check_launch(plan, bare.in_plan(plan))


@pytest.mark.distributed
def test_c10d_agents_started_in_reverse_order_train_exactly(tmp_path: Path) -> None:
    """Real torchrun agents meeting by c10d, node b-0 started first: whatever ranks torchrun
    hands out, every worker trains its plan rank's stage and the losses are exact."""
    from autoplan.cli.launch_cmd import runtime_args
    from autoplan.launch.local import environment_for_local_run
    from autoplan.launch.torchrun import node_launches
    from tests.single_process_reference import reference_training

    plan = _two_node_plan()
    plan_path, report = tmp_path / "plan.json", tmp_path / "report.json"
    write_json_model(plan_path, plan)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launches = node_launches(
        plan,
        str(plan_path),
        "127.0.0.1",
        port,
        runtime_args(2, str(report)),
        launcher=[sys.executable, "-m", "torch.distributed.run"],
        rendezvous="c10d",
        run_id="reverse",
        launcher_args={
            n.node_rank: agent_log_args(tmp_path / "logs", n.node_rank) for n in plan.nodes
        },
    )
    env = environment_for_local_run(
        {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, "cpu"
    )
    result = run_agents(list(reversed(launches)), env, tmp_path / "logs")
    assert result.failure is None, result.failure
    expected, _ = reference_training(plan, 2)
    steps = read_json_model(report, RunReport).steps
    assert [abs(s.loss - e) < 1e-10 for s, e in zip(steps, expected, strict=True)] == [True] * 2


@pytest.mark.distributed
def test_run_local_names_the_rank_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trusted factory that fails on rank 1 only: one line names rank 1, its node and the
    factory's error; the full log is kept where the line says."""
    (tmp_path / "flaky_model.py").write_text(
        textwrap.dedent(
            """
            import os
            from tests.runtime_models import mlp_stack

            def build(**sizes):
                if os.environ.get("RANK") == "1":
                    raise RuntimeError("rank one has no data")
                return mlp_stack(**sizes)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    plan_path = tmp_path / "plan.json"
    write_json_model(
        plan_path,
        make_plan([1, 3], model="flaky_model:build", schedule="gpipe", num_micro_batches=2),
    )
    result = runner.invoke(
        app, ["run", str(plan_path), "--local", "--steps", "1", "--trust-factory"]
    )
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "error: rank 1 on node local-0 failed: error: factory 'flaky_model:build' raised "
        "RuntimeError: rank one has no data"
    )
    log = Path(line.rsplit("full log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "rank one has no data" in log.read_text()
