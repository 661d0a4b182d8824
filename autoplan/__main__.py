"""``python -m autoplan``: the ``autoplan`` command, for an environment without its console
script on the PATH (a virtual environment not activated, a checkout run in place)."""

from autoplan.cli import app

app(prog_name="autoplan")
