"""autoplan.checks: the checks every command makes on a plan beyond its schema, torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoplan.checks import ZOO_MODEL_NAMES, all_plan_problems, model_name_problem
from autoplan.zoo.registry import model_names
from tests.plan_factory import make_plan


def test_the_torch_free_zoo_names_are_the_zoos() -> None:
    assert set(model_names()) == ZOO_MODEL_NAMES


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gpt-tiny", True),
        ("llama2-70b", True),
        ("tests.runtime_models:mlp_stack", True),
        ("pkg.mod:Factory.build", True),
        ("gpt-5", False),
        ("a..b:c", False),
        ("mod:", False),
        (":f", False),
        ("os:system;id", False),
        ("ùnicode:f", False),
        ("x\ny:z", False),
    ],
)
def test_model_names_are_zoo_names_or_well_formed_factories(name: str, ok: bool) -> None:
    assert (model_name_problem(name) is None) is ok


def test_checks_import_no_torch_and_never_import_a_factory() -> None:
    code = (
        "import sys\n"
        "from autoplan.checks import model_name_problem\n"
        "assert model_name_problem('planted_module_that_does_not_exist:f') is None\n"
        "assert model_name_problem('gpt-tiny') is None\n"
        "print('torch' in sys.modules, 'planted_module_that_does_not_exist' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"], result.stderr


def test_a_plan_node_outside_its_cluster_is_a_problem() -> None:
    plan = make_plan([2, 2])
    nodes = [plan.nodes[0].model_copy(update={"name": "ghost-0"})]
    problems = all_plan_problems(plan.model_copy(update={"nodes": nodes}))
    assert problems[0] == "plan node 0 is on node ghost-0, which is not in the plan's cluster"
