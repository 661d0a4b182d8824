"""Whole-model sums of one (device class, tp, micro-batch size), without the per-layer tables.

A single-stage plan (``autoplan.solve.shares``) reads only what the whole model costs: its
parameters, and per recompute mode its work, backward, saved and parked bytes, the last
entries of ``CostTables``' prefix sums. Building the tables for that costs every per-layer
figure in every mode (``ALL_MODES``, offload included) as a list; the share search asks for
hundreds of micro-batch sizes (OPT-350M on 8 + 8 GPUs: 371 of the solve's 477 table sets).
``ModelTotals`` sums only what is asked, per mode when first asked, by the same additions in
the same order as the tables' prefix sums (left to right over the layers from 0.0), so every
figure is the tables' to the bit (tests/test_model_totals.py).
"""

from __future__ import annotations

from collections.abc import Callable

from autoplan.cost.layers import LayerCost
from autoplan.cost.offload import (
    mode_backward_ms,
    mode_forward_ms,
    parked_bytes,
    resident_saved_bytes,
)

__all__ = ["ModelTotals"]


def _total(values: list[float]) -> float:
    """The last entry of ``[0.0, *accumulate(values)]``: left to right from 0.0. (Not
    ``math.fsum`` nor, from Python 3.12, ``sum``, which compensate: other bits.)"""
    total = 0.0
    for value in values:
        total += value
    return total


class ModelTotals:
    """The whole model's figures on one (class, tp, micro-batch size): ``params``, and per
    mode ``work``, ``backward``, ``saved`` and ``parked`` (each the last entry of the
    ``CostTables`` list of that name), each computed when first asked; ``layers``: the
    model's distinct layer costs (a repeated block once), for what takes a maximum over the
    layers."""

    def __init__(
        self, layers: list[LayerCost], params: float, sums: Callable[[str, str], float]
    ) -> None:
        """``sums(name, mode)``: the total of the figure ``name`` ("work", "backward",
        "saved" or "parked") in ``mode``."""
        self.layers = layers
        self.params = params
        self._sums = sums
        self._cache: dict[tuple[str, str], float] = {}

    @classmethod
    def of_layers(
        cls, distinct: list[LayerCost], slots: list[int], host_link_gb_per_s: float
    ) -> ModelTotals:
        """Totals summed from the distinct layer costs (``slots``: each layer's index in
        ``distinct``, in the model's order; ``host_link_gb_per_s``: the class's host link,
        which offload's copies take), as ``CostModel.tables`` sums them."""

        def spread(values: list[float]) -> float:
            return _total([values[slot] for slot in slots])

        def sums(name: str, mode: str) -> float:
            host = host_link_gb_per_s
            if name == "work":
                return spread(
                    [
                        mode_forward_ms(c, mode, host) + mode_backward_ms(c, mode, host)
                        for c in distinct
                    ]
                )
            if name == "backward":
                return spread([mode_backward_ms(c, mode, host) for c in distinct])
            if name == "saved":
                return spread([resident_saved_bytes(c, mode) for c in distinct])
            if name == "parked":
                return spread([parked_bytes(c, mode) for c in distinct])
            raise ValueError(f"unknown figure {name!r}")

        return cls(distinct, spread([c.params_per_gpu for c in distinct]), sums)

    def _get(self, name: str, mode: str) -> float:
        key = (name, mode)
        found = self._cache.get(key)
        if found is None:
            found = self._sums(name, mode)
            self._cache[key] = found
        return found

    def work(self, mode: str) -> float:
        """Forward + backward ms of every layer in ``mode`` (``CostTables.work[mode][-1]``)."""
        return self._get("work", mode)

    def backward(self, mode: str) -> float:
        """Backward ms of every layer in ``mode`` (``CostTables.backward[mode][-1]``)."""
        return self._get("backward", mode)

    def saved(self, mode: str) -> float:
        """Device-resident saved bytes of every layer (``CostTables.saved[mode][-1]``)."""
        return self._get("saved", mode)

    def parked(self, mode: str) -> float:
        """Saved bytes parked in host memory (``CostTables.parked[mode][-1]``)."""
        return self._get("parked", mode)
