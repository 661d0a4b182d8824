"""The typer application and the one rule every command shares: bad input is one line, exit 2.

Two kinds of bad input, one ending: a command's own error (an AutoplanError, a schema error, a
file it cannot write) prints ``error: <what>`` and nothing else on stderr; a bad flag or
argument prints the usage line and a hint first, then ``error: <what>`` as the last line.
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from typer import _click
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_command_name

from autoplan.errors import AutoplanError
from autoplan.names import printable

__all__ = [
    "COMMAND_MODULES",
    "EXIT_BAD_INPUT",
    "app",
    "command",
    "exit_fast_when_done",
    "one_line",
    "output_console",
    "package_version",
]

EXIT_BAD_INPUT = 2
_MAX_LINE = 1000


def output_console(*, stderr: bool = False, width: int = 140) -> Console:
    """A rich console on stdout (or stderr): the terminal's width on a terminal, else
    ``width`` columns, so that tables piped to a file or a test are not cut at 80."""
    terminal = Console(stderr=stderr)
    return terminal if terminal.is_terminal else Console(stderr=stderr, width=width)


COMMAND_MODULES: dict[str, str] = {
    "calibrate": "calibrate_cmd",
    "fidelity": "calibrate_cmd",
    "gpus": "catalog_cmd",
    "clusters": "catalog_cmd",
    "cost": "cost_cmd",
    "export": "export_cmd",
    "launch": "launch_cmd",
    "profile": "profile_cmd",
    "models": "profile_cmd",
    "run": "run_cmd",
    "schema": "schema_cmd",
    "solve": "solve_cmd",
    "sweep": "sweep_cmd",
    "validate": "validate_cmd",
    "show": "view_cmd",
    "simulate": "view_cmd",
    "compare": "view_cmd",
}
"""Each command's module under ``autoplan.cli``, in the order ``--help`` lists them: a
command's module is imported when the command is called (``autoplan solve`` loads neither the
runtime's nor the viewers' command modules), every one for the list of commands."""


class _OneLineErrors(TyperGroup):
    """The command group whose usage errors end with one ``error:`` line, and whose commands
    are loaded when named (``COMMAND_MODULES``).

    typer's own handler draws the message in a box whose last line is its border; here the
    usage and a hint come first and the message itself is the last line of stderr."""

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            self._load(COMMAND_MODULES[cmd_name])
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        for module in dict.fromkeys(COMMAND_MODULES.values()):
            self._load(module)
        return super().list_commands(ctx)

    def _load(self, module: str) -> None:
        """Import a command module (its ``@command`` registers on ``app``) and add what it
        registered to this group, which typer built from the commands registered before."""
        importlib.import_module(f"autoplan.cli.{module}")
        for info in app.registered_commands:
            assert info.callback is not None
            name = info.name or get_command_name(info.callback.__name__)
            if name not in self.commands:
                self.add_command(
                    get_command_from_info(
                        info,
                        pretty_exceptions_short=app.pretty_exceptions_short,
                        rich_markup_mode=app.rich_markup_mode,
                    ),
                    name,
                )

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except _click.exceptions.NoArgsIsHelpError as error:
            error.show()
            code = error.exit_code
        except _click.exceptions.ClickException as error:
            if not standalone_mode:
                raise
            context = getattr(error, "ctx", None)
            if context is not None:
                typer.echo(context.get_usage(), err=True)
                typer.echo(f"Try '{context.command_path} --help' for help.", err=True)
            typer.echo(f"error: {one_line(error.format_message())}", err=True)
            code = EXIT_BAD_INPUT
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("error: aborted", err=True)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The process's own entry point (the console script, ``python -m``); a test runner
        # calls ``main`` instead and never comes here.
        _PROCESS[0] = True
        # No cyclic collection while the command's modules load (the objects they make live
        # as long as the process): ``_collect_less`` turns it back on before the command
        # runs (the group's callback, once the command is resolved and its module loaded).
        gc.disable()
        try:
            return self.main(*args, **kwargs)
        except SystemExit as done:
            if done.code in (0, None) and _FAST_EXIT[0]:
                # The plan is written: a large search leaves millions of objects whose
                # teardown takes seconds and changes nothing. Flush, then leave.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            raise


_FAST_EXIT = [False]
_PROCESS = [False]  # the process's own entry point runs the command (``_OneLineErrors``)

_GC_THRESHOLD = (50_000, 20, 20)
"""The cyclic collector's thresholds while a command runs in its own process (Python's
default: 700, 10, 10); see ``_collect_less``."""


def _collect_less() -> None:
    """Once a command's modules are loaded, in its own process: what they made moved out of
    the cyclic collector's way (``gc.freeze``: it lives as long as the process) and the
    collector run less often. A search frees its many small objects (labels, stage figures)
    by reference counting and keeps its tables and caches to the end; the collector's full
    passes over all of them found nothing to free and cost 0.6 of 9.2 CPU-s of a solve
    (GPT-3 175B on mixed-1024, batch 1536; 0.09 s with these thresholds)."""
    if _PROCESS[0] and not gc.isenabled():
        gc.freeze()
        gc.set_threshold(*_GC_THRESHOLD)
        gc.enable()


def exit_fast_when_done() -> None:
    """Let the process end without the interpreter's teardown once the command returns
    successfully (its outputs are written and flushed); only where the process's own entry
    point runs the command (``_OneLineErrors.__call__``)."""
    _FAST_EXIT[0] = True


app = typer.Typer(
    name="autoplan",
    help="Plan how to train a PyTorch model on a cluster of mixed GPUs: "
    "profile → solve → show/simulate → launch/run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_OneLineErrors,
)

F = TypeVar("F", bound=Callable[..., Any])


def one_line(error: Exception | str) -> str:
    """An error as one printable line (no line breaks, no terminal escapes, bounded length)."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "input"
        text = f"invalid {error.title}: {where}: {first['msg']}"
    else:
        text = str(error)
    line = printable(text)
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."


def command(*args: Any, **kwargs: Any) -> Callable[[F], F]:
    """Register a CLI command whose AutoplanError (or schema error) becomes one line, exit 2.

    An OSError or MemoryError that escapes a command (a full disk, a closed pipe) is the
    environment, not a bug: one line too."""

    def register(function: F) -> F:
        @functools.wraps(function)
        def guarded(*f_args: Any, **f_kwargs: Any) -> Any:
            try:
                return function(*f_args, **f_kwargs)
            except (AutoplanError, ValidationError) as error:
                typer.echo(f"error: {one_line(error)}", err=True)
                raise typer.Exit(EXIT_BAD_INPUT) from None
            except OSError as error:
                where = f"{error.filename}: " if error.filename else ""
                typer.echo(f"error: {one_line(where + (error.strerror or str(error)))}", err=True)
                raise typer.Exit(EXIT_BAD_INPUT) from None
            except MemoryError:
                typer.echo("error: out of memory", err=True)
                raise typer.Exit(EXIT_BAD_INPUT) from None
            except KeyboardInterrupt:
                typer.echo("error: interrupted", err=True)
                raise typer.Exit(130) from None

        app.command(*args, **kwargs)(guarded)
        return function

    return register


def package_version() -> str:
    """autoplan's installed version (its package metadata), or 'unknown' when it runs from a
    source tree that was never installed."""
    # Imported here: it costs ~15 ms of every start (email parsing), and only --version and
    # the zoo table read it.
    import importlib.metadata

    try:
        return importlib.metadata.version("autoplan")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    # Eager: runs while the options are parsed, so `autoplan --version` needs no command.
    if value:
        typer.echo(f"autoplan {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _configure(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version, exit."
        ),
    ] = False,
) -> None:
    _collect_less()  # the command is resolved and its module loaded: it runs next
    # force: each invocation logs to the stderr of its own (tests run several in one process).
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    # Library warnings (torch, matplotlib) go to the log, shown with -v: stderr stays one line.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.INFO if verbose else logging.ERROR)
