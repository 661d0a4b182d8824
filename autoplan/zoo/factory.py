"""Models from outside the zoo: ``package.module:factory`` names a callable that returns
``(module, example_input)``.

If the callable takes ``batch_size`` and/or ``seq_len`` keyword parameters it is given the sizes
asked for; otherwise its example input is used as it is.

Where the module is looked for: ``sys.path`` as it is, and only when the module is not found
there, the current directory appended at the end, so a user's own file is found but can never
shadow an installed module (the current directory is never put first). Importing a factory runs
its code: commands that read a factory's name from a file ask the user first (``autoplan run
--trust-factory``); a factory that fails to import or raises is one line, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.names import is_hf_name

__all__ = ["call_factory", "is_factory_path", "load_factory"]


def is_factory_path(name: str) -> bool:
    """True when ``name`` has the 'package.module:callable' form rather than a zoo name (an
    'hf:PATH' Hugging Face config is never a factory)."""
    return ":" in name and not is_hf_name(name)


def load_factory(path: str) -> Callable[..., Any]:
    """Import the callable that ``path`` ('package.module:callable') names."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise InputError(f"factory '{path}' must have the form 'package.module:callable'")
    try:
        module = _import(module_name)
    except (Exception, SystemExit) as error:  # a failing import of user code is its input
        raise InputError(
            f"factory '{path}': cannot import module '{module_name}': "
            f"{type(error).__name__}: {error}"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InputError(f"factory '{path}': module '{module_name}' has no '{attribute}'")
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"factory '{path}': '{attribute}' is not callable")
    return target


def _import(module_name: str) -> Any:
    """Import ``module_name``; if its top-level package is nowhere on sys.path, look in the
    current directory too, appended last (module docstring)."""
    top = module_name.partition(".")[0]
    if importlib.util.find_spec(top) is None:
        here = os.getcwd()
        if here not in sys.path:
            sys.path.append(here)
    return importlib.import_module(module_name)


def call_factory(path: str, batch: int, seq_len: int) -> tuple[nn.Module, Any]:
    """Call the factory, passing the sizes it accepts, and check it returned (module, input)."""
    factory = load_factory(path)
    accepted: Mapping[str, inspect.Parameter]
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): pass nothing
        accepted = {}
    kwargs = {
        key: value
        for key, value in (("batch_size", batch), ("seq_len", seq_len))
        if key in accepted
    }
    try:
        result = factory(**kwargs)
    except (Exception, SystemExit) as error:  # the factory is user code: its failure is input
        raise InputError(
            f"factory '{path}' raised {type(error).__name__}: {' '.join(str(error).split())}"
        ) from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise InputError(
            f"factory '{path}' must return (torch.nn.Module, example_input), "
            f"got {type(result).__name__}"
        )
    module, example = result
    if not isinstance(example, torch.Tensor | tuple | list):
        raise InputError(
            f"factory '{path}': example input must be a tensor or a tuple of tensors, "
            f"got {type(example).__name__}"
        )
    return module, example
