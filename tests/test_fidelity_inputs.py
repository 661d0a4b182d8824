"""``autoplan fidelity`` on runs tables from elsewhere: the shipped calibration profiles stand
in where no profile is given, and GPU names in either spelling are read alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.api import cost_plan
from autoplan.calibrate.fidelity import fidelity_report, shipped_profile
from autoplan.calibrate.measured_runs import read_measured_runs
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

CLUSTER = """schema_version: 1
name: one-a100-node
node_groups:
  - name: a100
    gpu: A100-40GB
    gpus_per_node: 8
    count: 1
    intra_node_bandwidth_gb_per_s: 300
inter_node_bandwidth_gb_per_s: 25
"""

HEADER = (
    "run,site,model,gpus_by_type,cluster_file,global_batch,micro_batch_per_replica,stages,"
    "measured_iteration_s,measured_grad_allreduce_s,measured_max_memory_gib,sailor_simulator_s\n"
)


def _runs(tmp_path: Path, *rows: str) -> Path:
    (tmp_path / "a100.yaml").write_text(CLUSTER)
    table = tmp_path / "runs.csv"
    table.write_text(HEADER + "".join(f"{row}\n" for row in rows))
    return table


def test_a_model_without_a_given_profile_uses_its_shipped_one(tmp_path: Path) -> None:
    table = _runs(
        tmp_path,
        'neo,site-a,GPT-Neo-2.7B,"{}",a100.yaml,16,2,A100-40:L0-33:tp8:dp1,5.0,,,',
        'neo-gb,site-a,gpt_neo_2.7b,"{}",a100.yaml,16,2,A100-40GB:L0-33:tp8:dp1,5.0,,,',
    )
    report = fidelity_report(read_measured_runs(table), {})
    first, second = report.runs
    assert first.catalog_s == pytest.approx(second.catalog_s)  # both spellings alike
    assert first.catalog_s > 0 and first.num_micro_batches == 8
    shipped = shipped_profile("GPT-Neo-2.7B")
    assert shipped is not None
    neo = read_json_model(shipped, Profile)
    assert neo.model.parameter_count > 2.6e9 and len(neo.layers) == 34


def test_an_unknown_model_without_a_profile_is_a_one_line_error(tmp_path: Path) -> None:
    table = _runs(tmp_path, 'x,site-a,Bloom-7B,"{}",a100.yaml,16,2,A100-40:L0-33:tp8:dp1,5.0,,,')
    with pytest.raises(InputError, match="give its profile as --profile Bloom-7B=PATH"):
        fidelity_report(read_measured_runs(table), {})


def _profile_of(tp_divides: int | None) -> Profile:
    layers = [
        layer(i, flops=10**12, params=10**7, saved=10**8, output=10**6, tp_divides=tp_divides)
        for i in range(4)
    ]
    return make_profile(layers)


def test_tp_on_a_profile_without_a_tensor_parallel_split_is_refused() -> None:
    """A factory model profiled without --tp-divisor has no split: every tp rank would run its
    layers whole, so tp > 1 is refused rather than priced as if sharded: when a configuration
    is built (``autoplan cost --stages``, ``autoplan fidelity``) and by the validator (a plan
    file)."""
    from autoplan.plan.validate import plan_problems
    from autoplan.profile.profiler import profile_model

    cluster = make_cluster([("a", gpu("G", 100.0, 80.0), 4, 1)])
    with pytest.raises(InputError, match="tp 2 needs the profile's tensor-parallel split"):
        cost_plan(_profile_of(None), cluster, stages="G:L0-3:tp2:dp2", global_batch=8)
    tiny = profile_model("gpt-tiny", seq_len=16, micro_batch_size=1, dtype="fp32")
    plan = cost_plan(tiny, "cpu-local", stages="cpu:L0-5:tp2:dp2", global_batch=4)
    assert not [p for p in plan_problems(plan, tiny) if "tensor-parallel split" in p]
    unsplit = tiny.model_copy(
        update={
            "layers": [layer.model_copy(update={"tensor_parallel": None}) for layer in tiny.layers]
        }
    )
    problems = plan_problems(plan, unsplit)
    assert any("no tensor-parallel split" in p for p in problems), problems


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('a,s,OPT-350,"{}",a100.yaml,8,1,A100-40:L0-25:tp1:dp8,-1,,,', "must be positive"),
        ('a,s,OPT-350,"{}",a100.yaml,8,1,A100-40:L0-25:tp1:dp8,nan,,,', "must be positive"),
        ('a,s,OPT-350,"{}",a100.yaml,0,1,A100-40:L0-25:tp1:dp8,1,,,', "global_batch must be"),
        ('a,s,OPT-350,"{}",a100.yaml,8,1,A100-40:L0-25:tp1:dp8,1,,-3,', "not negative"),
        ('a,s,OPT-350,"{}",a100.yaml,8,x,A100-40:L0-25:tp1:dp8,1,,,', "must be a number"),
    ],
)
def test_a_bad_row_is_a_one_line_error_naming_it(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(InputError, match=f"run a: .*{message}"):
        read_measured_runs(_runs(tmp_path, row))


def test_a_table_that_is_not_one_says_so(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("x,y\n1,2\n")
    with pytest.raises(InputError, match="missing column"):
        read_measured_runs(wrong)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError, match="not a UTF-8 CSV"):
        read_measured_runs(binary)
