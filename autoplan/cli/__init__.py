"""The ``autoplan`` command line: each step's commands live in a module of their own."""

# Importing a command module registers its commands on the app.
from autoplan.cli import (  # noqa: F401
    calibrate_cmd,
    catalog_cmd,
    cost_cmd,
    export_cmd,
    launch_cmd,
    profile_cmd,
    run_cmd,
    schema_cmd,
    solve_cmd,
    sweep_cmd,
    validate_cmd,
    view_cmd,
)
from autoplan.cli.app import app

__all__ = ["app"]
