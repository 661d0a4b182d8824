"""The one rule for names that reach shells, file names and Slurm: a safe character set.

Cluster, node-group and GPU-type names (and so node names, '<group>-<i>') end up in launch
scripts, script file names, Slurm host lookups and one-line messages. They are restricted at
read time to letters, digits, '-', '_' and '.', starting with a letter or digit: such a name is
inert in a shell word, a valid file name (no '/', never '.' or '..'), and cannot be read as a
command-line option. Anything else is refused with one line naming the field.
"""

from __future__ import annotations

import re

from autoplan.limits import MAX_NAME_LENGTH

__all__ = ["NAME_RULE", "check_name", "is_safe_name", "printable", "shown"]

_SAFE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_LENGTH - 1}}}")

NAME_RULE = (
    f"1 to {MAX_NAME_LENGTH} letters, digits, '-', '_' or '.', starting with a letter or digit"
)


def is_safe_name(value: object) -> bool:
    """True when ``value`` is a string that follows the name rule."""
    return isinstance(value, str) and _SAFE.fullmatch(value) is not None


def shown(value: object, limit: int = 40) -> str:
    """``value`` for a one-line message: repr (escapes newlines and control characters),
    cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_name(value: str, what: str = "name") -> str:
    """``value`` if it follows the name rule; ValueError naming ``what`` otherwise (pydantic
    turns it into a one-line error with the field's location)."""
    if not is_safe_name(value):
        raise ValueError(f"{what} must be {NAME_RULE}; got {shown(value)}")
    return value


def printable(text: str) -> str:
    """``text`` with whitespace runs as one space and other non-printable characters escaped:
    safe in a comment line of a script and in a one-line message on a terminal."""
    joined = " ".join(text.split())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in joined)
