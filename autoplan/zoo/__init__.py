"""The model zoo: built-in models by name, and any other model through 'package.module:factory'.

Every model is a :class:`~autoplan.zoo.layered.LayeredModel`: an ordered ``layers`` dict of
pipeline units that the profiler measures one by one and the runtime slices into stages.
"""

from autoplan.zoo.layered import LayeredModel, keep_layers
from autoplan.zoo.registry import ModelSpec, get_model_spec, model_names

__all__ = ["LayeredModel", "ModelSpec", "get_model_spec", "keep_layers", "model_names"]
