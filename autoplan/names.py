"""The one rule for names that reach shells, file names and Slurm: a safe character set.

Cluster, node-group and GPU-type names (and so node names, '<group>-<i>') end up in launch
scripts, script file names, Slurm host lookups and one-line messages. They are restricted at
read time to letters, digits, '-', '_' and '.', starting with a letter or digit: such a name is
inert in a shell word, a valid file name (no '/', never '.' or '..'), and cannot be read as a
command-line option. Anything else is refused with one line naming the field.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from autoplan.limits import MAX_MODEL_PATH_LENGTH, MAX_NAME_LENGTH

__all__ = [
    "HF_MODEL_PREFIX",
    "NAME_RULE",
    "check_name",
    "hf_name_problem",
    "is_hf_name",
    "is_safe_name",
    "job_label",
    "printable",
    "shown",
]

HF_MODEL_PREFIX = "hf:"
"""Model names 'hf:PATH' are Hugging Face config files (autoplan.zoo.hf): data that autoplan's
own code reads, never a factory 'package.module:callable', whatever PATH looks like."""

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


def is_hf_name(name: str) -> bool:
    """True when ``name`` is a Hugging Face config model name ('hf:PATH')."""
    return name.startswith(HF_MODEL_PREFIX)


def hf_name_problem(name: str) -> str | None:
    """Why ``name`` is not an 'hf:PATH' model name as profiles and plans hold it, or None:
    the absolute path (what ``autoplan profile`` writes, so every rank reads the same file),
    printable, of bounded length."""
    path = name[len(HF_MODEL_PREFIX) :]
    if not is_hf_name(name) or not path.startswith("/"):
        return f"model {shown(name)}: an 'hf:' name must hold an absolute path"
    if len(path) > MAX_MODEL_PATH_LENGTH:
        return f"model 'hf:...': path of {len(path)} characters (at most {MAX_MODEL_PATH_LENGTH})"
    if not path.isprintable():
        return f"model {shown(name)}: the path holds a control character"
    return None


def job_label(model: str) -> str:
    """A short, safe word for a model in job names: the model itself when it follows the name
    rule, else its safe characters (an 'hf:' path becomes 'hf-' and its folder's name)."""
    if is_safe_name(model):
        return model
    if is_hf_name(model):
        path = PurePosixPath(model[len(HF_MODEL_PREFIX) :])
        model = "hf-" + (path.parent.name if path.name == "config.json" else path.stem)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.") or "model"
    return safe[:MAX_NAME_LENGTH]
