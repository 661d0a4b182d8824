"""The one input layer (autoplan.inputs): the cluster path-or-name rule, checked plans, and the
API reading through the same functions as the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan import api
from autoplan.cluster.catalog import example_cluster_path
from autoplan.errors import InputError, PlanInvalidError
from autoplan.files import write_json_model
from autoplan.inputs import checked_plan, cluster_path, read_cluster, read_plan
from tests.plan_factory import make_plan


def test_a_name_is_a_shipped_example_and_a_path_stays_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cluster_path("a100-v100") == example_cluster_path("a100-v100")
    assert cluster_path("mine.yaml") == Path("mine.yaml")
    assert cluster_path("sub/mine") == Path("sub/mine")
    # A directory of an example's name is no cluster file: the name still means the example.
    (tmp_path / "a100x8").mkdir()
    assert cluster_path("a100x8") == example_cluster_path("a100x8")
    # A file without a YAML suffix is read as given.
    (tmp_path / "a100x8-copy").write_text(example_cluster_path("a100x8").read_text())
    assert cluster_path("a100x8-copy") == Path("a100x8-copy")
    assert read_cluster("a100x8-copy") == read_cluster("a100x8")
    with pytest.raises(InputError, match="a100-v1000"):
        cluster_path("a100-v1000")


def test_the_api_reads_through_the_input_layer() -> None:
    assert api.load_cluster is read_cluster
    assert api.load_plan is read_plan
    cluster = read_cluster("a100-v100")
    assert read_cluster(cluster) is cluster


def _broken_plan() -> api.Plan:
    plan = make_plan([2, 2], data_parallel=2)
    rank_map = [e.model_copy(update={"node": "nowhere-0"}) for e in plan.rank_map]
    return plan.model_copy(update={"rank_map": rank_map})


def test_a_broken_plan_file_names_its_first_problem_and_keeps_them_all(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    write_json_model(path, _broken_plan())
    with pytest.raises(PlanInvalidError) as caught:
        read_plan(path)
    problems = caught.value.problems
    assert len(problems) > 1 and any("nowhere-0" in p for p in problems)
    assert str(caught.value) == (
        f"{path}: invalid plan: {problems[0]} "
        f"(and {len(problems) - 1} more: autoplan validate lists them)"
    )
    # A plan from no file: every problem numbered.
    with pytest.raises(PlanInvalidError, match=r"\(1\) .*\(2\) "):
        checked_plan(_broken_plan())
    good = make_plan([2, 2], data_parallel=2)
    assert checked_plan(good) is good


def test_flags_are_checked_against_the_bounds_their_schema_declares() -> None:
    from pydantic import ValidationError

    from autoplan import limits
    from autoplan.inputs import check_flags
    from autoplan.solve.options import SolveOptions

    with pytest.raises(InputError, match=r"^--tp must be at least 1, got 0$"):
        check_flags(SolveOptions, {"--tp": ("tp", 0)})
    too_deep = limits.MAX_PIPELINE_DEGREE + 1
    with pytest.raises(InputError, match=rf"^--pp {too_deep} exceeds the maximum, "):
        check_flags(SolveOptions, {"--pp": ("pp", too_deep)})
    with pytest.raises(InputError, match=r"^--time-limit must be more than 0, got 0$"):
        check_flags(SolveOptions, {"--time-limit": ("time_limit_s", 0)})
    with pytest.raises(InputError, match=r"^--time-limit must be a number, got nan$"):
        check_flags(SolveOptions, {"--time-limit": ("time_limit_s", float("nan"))})
    check_flags(SolveOptions, {"--tp": ("tp", None), "--pp": ("pp", limits.MAX_PIPELINE_DEGREE)})
    # The same bound is the API's: one declaration for both.
    with pytest.raises(ValidationError):
        SolveOptions(pp=too_deep)
