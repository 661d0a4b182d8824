"""The async_pb cost: no bubble (checked against an independent play of the executor's own
orders), stashed weight versions in memory, and ``--allow-async`` reporting it."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cost.async_pb import async_pb_cost
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.errors import InputError
from autoplan.files import write_json_model
from autoplan.plan.schema import AsyncPB, Parallelism, Plan
from autoplan.plan.validate import plan_problems
from autoplan.runtime.async_stage import async_pb_order
from autoplan.runtime.check import check_async_plan
from autoplan.solve import SolveOptions, cost_model, solve
from autoplan.solve.async_pb import ASYNC_MARK, as_async, async_line
from autoplan.view.plan_tables import overview_section
from tests.plan_factory import ReplicaSpec, make_plan, make_stages_plan
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile


def _setup():
    # Uneven layers so the stages differ: the bubble of 1F1B is what async_pb removes.
    flops = [4, 1, 1, 2, 3, 1]
    layers = [
        layer(i, flops=f * 10**12, params=10**7, saved=10**7, output=10**3)
        for i, f in enumerate(flops)
    ]
    profile = make_profile(layers)
    cluster = make_cluster([("g", gpu("G", 100.0, 80.0), 4, 1)])
    model = cost_model(profile, cluster, SolveOptions())
    stages = tuple(
        StageChoice(a, b, (ReplicaGroup(0, 1, 1, 1, "none"),), False)
        for a, b in ((0, 1), (1, 4), (4, 6))
    )
    return profile, cluster, model, stages


def _play(durations: list[tuple[float, float]], num_micro_batches: int) -> float:
    """End time of the executor's async orders (``async_pb_order``) played as events: a stage
    runs its actions in order, F(i) after stage s − 1's F(i), B(i) after stage s + 1's B(i);
    transfers cost nothing here (the configuration's sends are negligible)."""
    p = len(durations)
    orders = [async_pb_order(p, s, num_micro_batches) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    clock, cursor = [0.0] * p, [0] * p
    while any(cursor[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            if cursor[s] == len(orders[s]):
                continue
            kind, i = orders[s][cursor[s]]
            need = ("F", s - 1, i) if kind == "F" and s > 0 else None
            if kind == "B" and s < p - 1:
                need = ("B", s + 1, i)
            if need is not None and need not in done:
                continue
            start = max(clock[s], done[need] if need else 0.0)
            clock[s] = start + durations[s][0 if kind == "F" else 1]
            done[(kind, s, i)] = clock[s]
            cursor[s] += 1
    return max(clock)


def test_async_time_has_no_bubble_against_a_play_of_the_orders() -> None:
    _, _, model, stages = _setup()
    m = 8
    cost = async_pb_cost(model, PlanConfig(m, "1f1b", 1, stages))
    sync = cost.synchronous
    assert cost.bubble_ms == 0.0
    assert sync.bubble_ms > 0
    # Closed form: m × the slowest rank's per-micro-batch time (work + its own step).
    assert cost.iteration_ms == pytest.approx(m * max(cost.rank_micro_batch_ms))
    assert cost.iteration_ms < sync.iteration_ms
    # The stream's steady state, played: each further m micro-batches take m × the slowest
    # rank's forward + backward + step (the step counted in the backward).
    durations = []
    for r, stage in enumerate(sync.stages):
        step = cost.rank_micro_batch_ms[r] - stage.work_ms
        assert stage.send_ms < 1e-3 * stage.work_ms
        durations.append((stage.forward_ms, stage.backward_ms + step))
    per_iteration = _play(durations, 5 * m) - _play(durations, 4 * m)
    assert per_iteration == pytest.approx(cost.iteration_ms, rel=1e-9)


def test_async_memory_counts_one_weight_version_per_micro_batch_in_flight() -> None:
    _, _, model, stages = _setup()
    cost = async_pb_cost(model, PlanConfig(8, "1f1b", 1, stages))
    for mem, sync in zip(cost.memory, cost.synchronous.memory, strict=True):
        r = mem.pipeline_rank
        assert mem.stash_bytes == (3 - r) * sync.weights_bytes
        assert mem.total_bytes == sync.total_bytes + mem.stash_bytes


def test_allow_async_reports_beside_the_synchronous_plan() -> None:
    profile, cluster, _, _ = _setup()
    pinned = {"tp": 1, "dp": 1, "pp": 3, "num_micro_batches": 8}
    plain = solve(profile, cluster, 8, SolveOptions(**pinned))
    assert not any(a.summary.startswith(ASYNC_MARK) for a in plain.alternatives)
    asked = solve(profile, cluster, 8, SolveOptions(**pinned, allow_async=True))
    assert asked.parallelism.schedule != "async_pb"  # reported, never chosen
    marked = [a for a in asked.alternatives if a.summary.startswith(ASYNC_MARK)]
    assert len(marked) == 1
    assert marked[0].samples_per_s > asked.prediction.samples_per_s  # no bubble
    assert "changes the optimisation" in async_line(asked)


def test_schema_requires_settings_exactly_with_the_async_schedule() -> None:
    base = {"pipeline_degree": 2, "num_micro_batches": 4, "micro_batch_size": 1}
    ok = Parallelism(schedule="async_pb", async_pb=AsyncPB(), **base)
    assert ok.async_pb is not None and ok.async_pb.weight_prediction
    with pytest.raises(ValueError, match="disagree"):
        Parallelism(schedule="async_pb", **base)
    with pytest.raises(ValueError, match="disagree"):
        Parallelism(schedule="1f1b", async_pb=AsyncPB(), **base)


def test_show_marks_an_async_plan() -> None:
    plan = make_plan([2, 2])
    assert "ASYNCHRONOUS" not in str(overview_section(plan).rows)
    data = plan.parallelism.model_dump()
    data.update(schedule="async_pb", async_pb={"weight_prediction": False})
    async_plan = plan.model_copy(update={"parallelism": Parallelism.model_validate(data)})
    rows = {str(row[0]): str(row[1]) for row in overview_section(async_plan).rows}
    assert "ASYNCHRONOUS" in rows
    assert "weight prediction off" in rows["ASYNCHRONOUS"]
    assert "spike compensation on" in rows["ASYNCHRONOUS"]


def _as_async(plan: Plan) -> Plan:
    data = plan.parallelism.model_dump()
    data.update(schedule="async_pb", async_pb={})
    return plan.model_copy(update={"parallelism": Parallelism.model_validate(data)})


def test_runtime_runs_any_dp_tp_and_refuses_what_it_cannot_in_one_line() -> None:
    # Replicas of unequal shares and tensor parallelism per stage run (tests of the runtime).
    check_async_plan(_as_async(make_plan([3, 3], replica_micro_batch_sizes=[1, 3])))
    check_async_plan(_as_async(make_plan([3, 3], tensor_parallel=2)))
    with pytest.raises(InputError, match="ZeRO-1"):
        check_async_plan(_as_async(make_plan([3, 3], data_parallel=2, zero1=True)))
    with pytest.raises(InputError, match="recompute 'full'"):
        check_async_plan(_as_async(make_plan([3, 3], recompute="full")))
    with pytest.raises(InputError, match="offload True"):
        check_async_plan(_as_async(make_plan([3, 3], offload=True)))
    plan = _as_async(make_plan([3, 3], data_parallel=2))
    experts = [stage.model_copy(update={"expert_parallel_degree": 2}) for stage in plan.stages]
    with pytest.raises(InputError, match="stage 0 asks for expert parallelism 2"):
        check_async_plan(plan.model_copy(update={"stages": experts}))


def _runnable_async(config: PlanConfig) -> bool:
    """Whether the async executor runs ``config`` as it is: one stage per rank, no ZeRO,
    recompute or activation offload."""
    return config.chunks == 1 and all(
        s.zero_stage == 0 and all(g.recompute == "none" and not g.offload for g in s.groups)
        for s in config.stages
    )


def test_async_alternative_is_costed_as_the_executor_runs_it() -> None:
    _, _, model, stages = _setup()
    heavy = tuple(
        dataclasses.replace(
            s,
            zero_stage=1,
            groups=(ReplicaGroup(0, 1, 2, 1, "full"),),
        )
        for s in stages
    )
    config = PlanConfig(8, "1f1b", 1, heavy)
    assert not _runnable_async(config)
    plain = as_async(config)
    assert _runnable_async(plain)
    assert all(s.zero_stage == 0 and s.groups[0].recompute == "none" for s in plain.stages)
    assert [g.replicas for s in plain.stages for g in s.groups] == [2, 2, 2]  # dp kept
    assert async_pb_cost(model, plain).iteration_ms > 0


def test_cli_allow_async_prints_the_async_line(tmp_path) -> None:
    profile, cluster, _, _ = _setup()
    profile_path, cluster_path = tmp_path / "profile.json", tmp_path / "cluster.yaml"
    write_json_model(profile_path, profile)
    cluster_path.write_text(yaml.safe_dump(cluster.model_dump(mode="json")))
    args = ["solve", str(profile_path), "--cluster", str(cluster_path), "--global-batch", "8"]
    args += ["--tp", "1", "--dp", "1", "--pp", "3", "--num-micro-batches", "8"]
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*args, "-o", str(out), "--allow-async"])
    assert result.exit_code == 0, result.output
    assert "async_pb (asynchronous Pipelined Backpropagation" in " ".join(result.output.split())
    plain = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "plain.json")])
    assert plain.exit_code == 0 and "async_pb" not in plain.output
    lone = CliRunner().invoke(app, [*args, "-o", str(out), "--async-output", str(tmp_path / "a")])
    assert lone.exit_code == 2 and "--async-output needs --allow-async" in lone.output


def test_solve_writes_the_async_alternative_as_a_plan_the_validator_and_simulator_read(
    tmp_path,
) -> None:
    from autoplan.files import read_json_model
    from autoplan.simulate import simulate_plan

    profile, cluster, _, _ = _setup()
    profile_path, cluster_path = tmp_path / "profile.json", tmp_path / "cluster.yaml"
    write_json_model(profile_path, profile)
    cluster_path.write_text(yaml.safe_dump(cluster.model_dump(mode="json")))
    out, async_out = tmp_path / "plan.json", tmp_path / "async.json"
    args = ["solve", str(profile_path), "--cluster", str(cluster_path), "--global-batch", "8"]
    args += ["--pp", "3", "--num-micro-batches", "8", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--allow-async", "--async-output", str(async_out)])
    assert result.exit_code == 0, result.output
    plan, asynchronous = read_json_model(out, Plan), read_json_model(async_out, Plan)
    assert plan.parallelism.schedule != "async_pb"
    assert asynchronous.parallelism.schedule == "async_pb"
    assert plan_problems(asynchronous, profile) == []
    (alternative,) = [a for a in plan.alternatives if a.summary.startswith(ASYNC_MARK)]
    assert asynchronous.prediction.iteration_time_ms == pytest.approx(alternative.iteration_time_ms)
    assert asynchronous.prediction.breakdown.bubble_ms == 0
    # The stashed weight versions: (p − r) copies of the rank's weights on top of 1F1B's.
    pp = asynchronous.parallelism.pipeline_degree
    for estimate in asynchronous.prediction.memory:
        assert estimate.total_bytes >= (pp - estimate.pipeline_rank) * estimate.weights_bytes
    # Its simulated steady state is the work and the blocking transfers alone (no bubble): the
    # prediction adds the per-micro-batch optimizer steps, so it is no faster than that.
    simulated = simulate_plan(asynchronous).iteration_time_ms
    m = asynchronous.parallelism.num_micro_batches
    timings = asynchronous.prediction.stage_timings
    slowest = max(
        t.forward_ms + t.backward_ms + 2 * t.send_ms + (2 * timings[s - 1].send_ms if s else 0.0)
        for s, t in enumerate(timings)
    )
    assert simulated == pytest.approx(m * slowest, rel=1e-6)
    assert simulated <= asynchronous.prediction.iteration_time_ms


def test_pinning_the_async_schedule_is_a_one_line_error() -> None:
    profile, cluster, _, _ = _setup()
    with pytest.raises(InputError, match="--allow-async reports"):
        solve(profile, cluster, 8, SolveOptions(schedule="async_pb"))


def test_validator_accepts_async_plans_of_any_dp_tp_and_flags_what_they_cannot_run() -> None:
    mixed = make_stages_plan(
        [3, 3], [[ReplicaSpec(share=1), ReplicaSpec(share=3)], [ReplicaSpec(tp=2, share=4)]]
    )
    assert plan_problems(_as_async(mixed)) == []
    flagged = plan_problems(_as_async(make_plan([3, 3], data_parallel=2, zero1=True)))
    assert [p for p in flagged if "async_pb" in p] == [
        "async_pb stage 0 has ZeRO-1; use 0",
        "async_pb stage 1 has ZeRO-1; use 0",
    ]
    flagged = plan_problems(_as_async(make_plan([3, 3], recompute="selective")))
    assert any("async_pb stage 0 has recompute ['selective']" in p for p in flagged)
    # The same plans under a synchronous schedule break no async rule.
    assert not any("async_pb" in p for p in plan_problems(make_plan([3, 3], recompute="full")))


def test_simulate_plays_the_async_stream_and_finds_no_bubble_in_its_steady_state() -> None:
    from autoplan.plan.schema import StageTiming
    from autoplan.simulate import simulate_plan

    timings = [
        StageTiming(stage=s, forward_ms=f, backward_ms=2 * f, send_ms=0.0)
        for s, f in enumerate([1.0, 3.0, 2.0])
    ]
    plan = make_plan([2, 2, 2], num_micro_batches=6, stage_timings=timings)
    synchronous = simulate_plan(plan)
    result = simulate_plan(_as_async(plan))
    # The slowest stage (3 + 6 ms per micro-batch) sets the pace of every micro-batch.
    assert result.iteration_time_ms == pytest.approx(6 * 9.0)
    assert synchronous.iteration_time_ms > result.iteration_time_ms
    assert any(note.startswith("async_pb: 3 iterations") for note in result.notes)
    # The timeline is the whole stream: 3 iterations of 6 micro-batches on every stage.
    backwards = [e for e in result.ranks[0].replicas[0].events if e.category == "backward"]
    assert sorted(e.micro_batch for e in backwards) == list(range(18))
