"""`autoplan schema NAME` prints a JSON Schema that the files autoplan writes conform to."""

import json

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.schema import Cluster
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from autoplan.runtime.report import RunReport

MODELS = {"profile": Profile, "plan": Plan, "cluster": Cluster, "report": RunReport}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_schema_command_prints_the_models_json_schema(name: str) -> None:
    result = CliRunner().invoke(app, ["schema", name])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    assert schema == json.loads(json.dumps(MODELS[name].model_json_schema()))
    assert "schema_version" in schema["properties"]
    assert schema["additionalProperties"] is False


def test_unknown_schema_name_is_refused() -> None:
    result = CliRunner().invoke(app, ["schema", "planz"])
    assert result.exit_code == 2
