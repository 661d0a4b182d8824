"""``autoplan cost`` and ``api.cost_plan``: price a configuration a person wrote.

The oracle: a plan that ``solve`` wrote, priced again, gives back exactly its own prediction
(the same cost model, placement and emitter); the stage notation of the measured runs in
``../shared/calibration`` (mixed-type stages, per-stage tp) prices where the solve flags cannot
pin it; an edited plan is refused by ``simulate`` and ``validate`` until it is priced again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.fingerprint import costed_sha256, edited_since_costed
from autoplan.plan.schema import Plan
from autoplan.plan.stage_spec import StageSpec, format_stage_specs, parse_stages
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A 26-layer model (embedding, 24 blocks, head: OPT-350's rows) and two clusters: two
    GPU types of 4 per node, and three types shaped like calibration run 34's."""
    folder = tmp_path_factory.mktemp("cost")
    profile = transformer_profile(blocks=24, hidden=1024, seq_len=512, heads=16)
    # A zoo name: plans name a model the runtime can build (the figures stay synthetic).
    model = profile.model.model_copy(update={"name": "gpt2-small"})
    profile = profile.model_copy(update={"model": model})
    write_json_model(folder / "profile.json", profile)
    two = make_cluster([("fast", gpu("FAST", 200, 24), 4, 2), ("slow", gpu("SLOW", 50, 16), 4, 2)])
    (folder / "two.yaml").write_text(yaml.safe_dump(two.model_dump(mode="json")))
    three = make_cluster(
        [
            ("r2080", gpu("RTX-A", 40, 11), 8, 3),
            ("r3090", gpu("RTX-B", 70, 24), 8, 1),
            ("titan", gpu("RTX-C", 60, 24), 8, 2),
        ]
    )
    (folder / "three.yaml").write_text(yaml.safe_dump(three.model_dump(mode="json")))
    return {
        "profile": folder / "profile.json",
        "two": folder / "two.yaml",
        "three": folder / "three.yaml",
    }


@pytest.fixture(scope="module")
def solved(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("solved") / "plan.json"
    args = ["solve", str(files["profile"]), "-c", str(files["two"]), "--global-batch", "32"]
    result = runner.invoke(app, [*args, "--pp", "2", "--time-limit", "20", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _cost(*args: str):
    return runner.invoke(app, ["cost", *args])


def test_a_solved_plan_prices_to_its_own_prediction(files, solved, tmp_path) -> None:
    out = tmp_path / "priced.json"
    result = _cost(str(solved), "--profile", str(files["profile"]), "-o", str(out))
    assert result.exit_code == 0, result.output
    before = read_json_model(solved, Plan)
    after = read_json_model(out, Plan)
    assert after.prediction == before.prediction
    assert after.stages == before.stages and after.rank_map == before.rank_map
    assert after.inputs.strategy == "given" and after.inputs.pinned == {"source": "plan"}
    assert after.alternatives == []  # nothing was searched


def test_stage_text_equals_megatron_flags_and_round_trips(files) -> None:
    stages = "FAST:L0-12:tp2:dp2 | FAST:L13-25:tp2:dp2"
    by_text = api.cost_plan(files["profile"], files["two"], stages=stages, global_batch=32)
    by_flags = api.cost_plan(
        files["profile"],
        files["two"],
        stages=format_stage_specs(parse_stages(stages)),
        global_batch=32,
    )
    assert by_text == by_flags
    result = _cost(
        "--profile",
        str(files["profile"]),
        "-c",
        str(files["two"]),
        *("--tp", "2", "--pp", "2", "--dp", "2", "--gpu-type", "FAST", "--global-batch", "32"),
    )
    assert result.exit_code == 0, result.output
    # 26 layers over 2 stages: 13 each, written 0-12 and 13-25 (inclusive) as in --stages.
    assert [(s.layer_start, s.layer_end) for s in by_text.stages] == [(0, 13), (13, 26)]
    assert by_text.parallelism.micro_batch_size == 2  # 2 replicas × 1 sample each
    assert by_text.parallelism.num_micro_batches == 16
    assert by_text.inputs.pinned == {"stages": stages}


def test_mixed_type_stages_split_to_fit_the_cluster(files) -> None:
    # Calibration run 34's plan: 24 RTX-A, 8 RTX-B, 16 RTX-C; only one split of each mixed
    # stage's three replicas fits (A×2 + B×1, then A×1 + C×2).
    stages = "RTX-A+RTX-B:L0-11:tp8:dp3 | RTX-A+RTX-C:L12-25:tp8:dp3"
    plan = api.cost_plan(
        files["profile"], files["three"], stages=stages, global_batch=288, micro_batch_size=2
    )
    counts = [
        sorted((t, sum(r.gpu_type == t for r in s.replicas)) for t in s.gpu_types)
        for s in plan.stages
    ]
    assert counts == [[("RTX-A", 2), ("RTX-B", 1)], [("RTX-A", 1), ("RTX-C", 2)]]
    assert plan.world_size == 48
    assert {r.tensor_parallel_degree for s in plan.stages for r in s.replicas} == {8}
    # Names compare without case or dashes, and node-group names stand for their type.
    again = api.cost_plan(
        files["profile"],
        files["three"],
        stages="rtx_a*2+r3090:L0-11:tp8:dp3 | RTX-A*1+titan*2:L12-25:tp8:dp3",
        global_batch=288,
        micro_batch_size=2,
    )
    assert again.prediction == plan.prediction


def test_per_stage_tp_and_micro_batch(files) -> None:
    plan = api.cost_plan(
        files["profile"],
        files["two"],
        stages="FAST:L0-9:tp4:dp1:mb4:full | SLOW:L10-25:tp1:dp4",
        global_batch=32,
    )
    assert [[r.tensor_parallel_degree for r in s.replicas] for s in plan.stages] == [
        [4],
        [1, 1, 1, 1],
    ]
    assert [s.shares for s in plan.stages] == [[4], [1, 1, 1, 1]]
    assert plan.stages[0].replicas[0].recompute == "full"
    assert plan.parallelism.num_micro_batches == 8


@pytest.mark.parametrize(
    ("stages", "says"),
    [
        ("FAST:0-12:tp2:dp1", "expected TYPES:Lfirst-last:tpT:dpD"),
        ("FAST:L0-25:tp2:mb1", "no dp"),
        ("FAST:L0-12:tp2:dp2 | FAST:L14-25:tp2:dp2", "must start at 13"),
        ("FAST:L0-12:tp2:dp2 | FAST:L13-24:tp2:dp2", "last layer is 25"),
        ("NOPE:L0-25:tp2:dp2", "no such GPU type or node group"),
        ("FAST:L0-25:tp8:dp1", "exceeds the 4 GPUs per node"),
        ("FAST:L0-25:tp4:dp4", "do not fit the cluster"),
        ("FAST:L0-12:tp2:dp2 | SLOW:L13-25:tp1:dp1", "same samples per micro-batch"),
        ("FAST:L0-25:tp2:dp2:zz", "is not one of"),
        ("FAST*3+SLOW*2:L0-25:tp1:dp4", "add up to 5, not dp 4"),
    ],
)
def test_bad_stages_are_one_line(files, stages: str, says: str) -> None:
    result = _cost(
        "--profile", str(files["profile"]), "-c", str(files["two"]), "--stages", stages,
        "--global-batch", "32",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


def test_one_configuration_at_a_time(files, solved) -> None:
    result = _cost(
        str(solved), "--profile", str(files["profile"]), "--stages", "FAST:L0-25:tp1:dp1"
    )
    assert result.exit_code == 2 and "price one configuration" in result.output


def test_memory_that_does_not_fit_is_reported_not_refused(files, tmp_path) -> None:
    out = tmp_path / "big.json"
    result = _cost(
        "--profile", str(files["profile"]), "-c", str(files["two"]),
        "--stages", "SLOW:L0-25:tp1:dp1", "--global-batch", "64", "--micro-batch-size", "64",
        "-o", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "does not fit:" in result.output
    priced = api.price(
        files["profile"], files["two"], stages="SLOW:L0-25:tp1:dp1", global_batch=64,
        micro_batch_size=64,
    )  # fmt: skip
    assert priced.violations and "SLOW" in priced.violations[0]
    memory = priced.plan.prediction.memory[0]
    assert memory.total_bytes + memory.reserved_bytes > memory.capacity_bytes


def test_an_edited_plan_is_refused_until_priced_again(files, solved, tmp_path) -> None:
    data = json.loads(solved.read_text())
    first, second = data["stages"][0], data["stages"][1]
    moved = 1 if first["layer_end"] - first["layer_start"] > 1 else -1
    first["layer_end"] -= moved
    second["layer_start"] -= moved
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    assert edited_since_costed(read_json_model(edited, Plan))
    for command in (["simulate", str(edited)], ["validate", str(edited)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "autoplan cost" in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(InputError, match="autoplan cost"):
        api.simulate(edited)
    shown = runner.invoke(app, ["show", str(edited)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "STALE" in shown.output  # shown, with the warning
    priced = tmp_path / "priced.json"
    result = _cost(str(edited), "--profile", str(files["profile"]), "-o", str(priced))
    assert result.exit_code == 0, result.output
    plan = read_json_model(priced, Plan)
    assert plan.prediction.costed_sha256 == costed_sha256(plan)
    assert plan.prediction.stage_timings != read_json_model(solved, Plan).prediction.stage_timings
    assert runner.invoke(app, ["simulate", str(priced)]).exit_code == 0
    valid = runner.invoke(app, ["validate", str(priced), "--profile", str(files["profile"])])
    assert valid.exit_code == 0 and "timings recomputed" in valid.output


def test_validate_with_profile_recomputes_the_timings(files, solved, tmp_path) -> None:
    # A plan whose figures were made on other inputs (here: stage 0's forward doubled, and no
    # fingerprint, as in a plan written before it was recorded) is caught by pricing it again.
    data = json.loads(solved.read_text())
    data["prediction"]["costed_sha256"] = None
    timing = data["prediction"]["stage_timings"][0]
    timing["forward_ms"] *= 2
    for replica in timing["replicas"]:
        replica["forward_ms"] *= 2
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(data))
    assert runner.invoke(app, ["validate", str(stale)]).exit_code == 0  # no profile: can't tell
    for command in ("validate", "simulate"):
        result = runner.invoke(app, [command, str(stale), "--profile", str(files["profile"])])
        assert result.exit_code == 2, result.output
        assert "stage 0 forward" in result.output and "autoplan cost" in result.output
    played = runner.invoke(app, ["simulate", str(solved), "--profile", str(files["profile"])])
    assert played.exit_code == 0, played.output


def test_stage_spec_text_parses_back_to_itself() -> None:
    text = "A*2+B:L0-11:tp8:dp3:mb2:full:z1:offload | C:L12-25:tp1:dp6"
    specs = parse_stages(text)
    assert format_stage_specs(specs) == text
    assert specs[0] == StageSpec.model_validate(specs[0].model_dump())
    assert [s.num_layers for s in specs] == [12, 14]


def test_alternatives_are_written_as_stages_that_price_to_their_time(files, solved) -> None:
    # A plan's runners-up are written in the --stages notation: pasted into cost, each prices
    # to the time the search recorded for it (one notation, inclusive layer ranges, everywhere).
    plan = read_json_model(solved, Plan)
    assert plan.alternatives
    for alternative in plan.alternatives:
        head, _, stages = alternative.summary.partition(" | ")
        knobs = dict(part.split("=") for part in head.split() if "=" in part)
        priced = api.cost_plan(
            files["profile"],
            files["two"],
            stages=stages,
            num_micro_batches=int(knobs["m"]),
            schedule=head.split()[2],
            pipeline_degree=int(knobs["pp"]),
            sequence_parallel=head.endswith(" sp"),
        )
        assert priced.prediction.iteration_time_ms == alternative.iteration_time_ms
        assert [s.num_layers for s in parse_stages(stages)] == alternative.layer_split


def test_replicas_of_one_stage_may_differ_per_type() -> None:
    text = "A*1(tp4,cp2,mb4,full)+B*4(tp1,mb1):L0-11:z1:ep2 | C:L12-25:tp2:dp8:mb1"
    specs = parse_stages(text)
    assert format_stage_specs(specs) == text
    assert specs[0].data_parallel_degree == 5 and specs[0].tensor_parallel_degree is None
    assert specs[0].types[0].recompute == "full" and specs[0].types[1].micro_batch_size == 1
    with pytest.raises(InputError, match="need their replicas"):
        parse_stages("A(mb4)+B:L0-25:tp1:dp5")
    with pytest.raises(InputError, match="no tp"):
        parse_stages("A*1(tp4)+B*4:L0-25")


CALIBRATION = Path(__file__).resolve().parents[1].parent / "shared" / "calibration"


@pytest.mark.skipif(
    not (CALIBRATION / "measured_runs.csv").is_file(),
    reason="../shared/calibration (measured runs) is absent on this machine",
)
def test_every_measured_run_prices_as_written(files) -> None:
    # The measured runs' plans as published (issue 25): mixed-type stages, types out of file
    # order, per-stage tp; each prices on its own cluster file with its stage string verbatim,
    # and uses exactly the GPUs its row says.
    import csv

    with (CALIBRATION / "measured_runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 20
    for row in rows:
        plan = api.cost_plan(
            files["profile"],
            CALIBRATION / row["cluster_file"],
            stages=row["stages"],
            global_batch=int(row["global_batch"]),
            micro_batch_size=int(row["micro_batch_per_replica"]),
        )
        assert plan.world_size == sum(json.loads(row["gpus_by_type"]).values()), row["run"]
        assert plan.prediction.iteration_time_ms > 0


def test_show_writes_the_plan_as_stages_that_price_to_it(files, solved) -> None:
    result = runner.invoke(app, ["show", str(solved), "--format", "json"])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)["sections"][0]["items"]["as cost --stages"]
    head, _, stages = line.partition(" | ")
    knobs = dict(part.split("=") for part in head.split() if "=" in part)
    plan = read_json_model(solved, Plan)
    again = api.cost_plan(
        files["profile"],
        files["two"],
        stages=stages,
        num_micro_batches=int(knobs["m"]),
        schedule=head.split()[2],
        pipeline_degree=int(knobs["pp"]),
        sequence_parallel=head.endswith(" sp"),
    )
    assert again.prediction.iteration_time_ms == plan.prediction.iteration_time_ms
