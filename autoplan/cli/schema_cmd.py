"""``autoplan schema``: the JSON Schema of each file autoplan reads or writes."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer
from pydantic import BaseModel

from autoplan.cli.app import command
from autoplan.cluster.schema import Cluster
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from autoplan.runtime.report import RunReport


class SchemaName(StrEnum):
    profile = "profile"
    plan = "plan"
    cluster = "cluster"
    report = "report"


_MODELS: dict[SchemaName, type[BaseModel]] = {
    SchemaName.profile: Profile,
    SchemaName.plan: Plan,
    SchemaName.cluster: Cluster,
    SchemaName.report: RunReport,
}


@command("schema")
def schema(
    name: Annotated[SchemaName, typer.Argument(help="profile, plan, cluster or report.")],
) -> None:
    """Print the JSON Schema of a profile, plan, cluster or run-report file."""
    typer.echo(json.dumps(_MODELS[name].model_json_schema(), indent=2, sort_keys=True))
