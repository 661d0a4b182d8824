"""The model zoo: built-in models by name, and any other model through 'package.module:factory'.

Every zoo model is a :class:`~autoplan.zoo.layered.LayeredModel`: an ordered ``layers`` dict of
pipeline units (``embed``, ``block_i``, ``head``) that the profiler measures one by one and the
runtime slices into stages. Blocks keep q, k and v as separate projections and name their
linears ``q, k, v, out`` and ``up, (gate,) down`` so that tensor parallelism can split them.
"""

from autoplan.zoo.layered import LayeredModel, keep_layers
from autoplan.zoo.registry import ModelSpec, get_model_spec, model_names

__all__ = ["LayeredModel", "ModelSpec", "get_model_spec", "keep_layers", "model_names"]
