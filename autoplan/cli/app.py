"""The typer application and the one rule every command shares: bad input is one line, exit 2."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError

from autoplan.errors import AutoplanError

__all__ = ["EXIT_BAD_INPUT", "app", "command"]

EXIT_BAD_INPUT = 2

app = typer.Typer(
    name="autoplan",
    help="Plan how to train a PyTorch model on a cluster of mixed GPUs: "
    "profile → solve → show/simulate → launch/run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def _one_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        return f"invalid {error.title}: {where}: {first['msg']}"
    return " ".join(str(error).split())


def command(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    """Register a CLI command whose AutoplanError (or schema error) becomes one line, exit 2."""

    def register(function: F) -> F:
        @functools.wraps(function)
        def guarded(*f_args: Any, **f_kwargs: Any) -> Any:
            try:
                return function(*f_args, **f_kwargs)
            except (AutoplanError, ValidationError) as error:
                typer.echo(f"error: {_one_line(error)}", err=True)
                raise typer.Exit(EXIT_BAD_INPUT) from None

        app.command(*args, **kwargs)(guarded)
        return function

    return register


@app.callback()
def _configure(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")
    ] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
