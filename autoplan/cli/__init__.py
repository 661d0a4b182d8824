"""The ``autoplan`` command line: each step's commands live in a module of their own, imported
when its command is called (``autoplan.cli.app.COMMAND_MODULES``)."""

from autoplan.cli.app import app

__all__ = ["app"]
