"""Models from outside the zoo: ``package.module:factory`` names a callable that returns
``(module, example_input)``.

If the callable takes ``batch_size`` and/or ``seq_len`` keyword parameters it is given the sizes
asked for; otherwise its example input is used as it is. The module is imported with the
current directory on ``sys.path`` (as ``python -m`` has it), so a user's own file is found.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoplan.errors import InputError

__all__ = ["call_factory", "is_factory_path", "load_factory"]


def is_factory_path(name: str) -> bool:
    """True when ``name`` has the 'package.module:callable' form rather than a zoo name."""
    return ":" in name


def load_factory(path: str) -> Callable[..., Any]:
    """Import the callable that ``path`` ('package.module:callable') names."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise InputError(f"factory '{path}' must have the form 'package.module:callable'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure of user code is the user's input problem
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


def call_factory(path: str, batch: int, seq_len: int) -> tuple[nn.Module, Any]:
    """Call the factory, passing the sizes it accepts, and check it returned (module, input)."""
    factory = load_factory(path)
    accepted = inspect.signature(factory).parameters
    kwargs = {
        key: value
        for key, value in (("batch_size", batch), ("seq_len", seq_len))
        if key in accepted
    }
    result = factory(**kwargs)
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
