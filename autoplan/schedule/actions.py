"""One step of a pipeline schedule: run stage ``s`` forward or backward on micro-batch ``mb``.

Zero-bubble schedules split the backward in two: ``I`` (gradient of the stage's input, which
the previous stage waits for) and ``W`` (gradient of its weights, which nobody waits for and
which the schedule defers into what would be bubbles). ``B`` is the full backward (I then W).

A schedule is data: ``order[r]`` is the ordered list of actions pipeline rank ``r`` runs. The
same lists feed the validator, the simulator and the timeline, so what one reads the others read
too. The text form matches PyTorch's ``_Action`` (``"2F0"`` = stage 2, forward, micro-batch 0),
so a schedule can be compared with, or written for, ``torch.distributed.pipelining``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from autoplan.errors import InputError

__all__ = ["Action", "ActionKind", "PipelineOrder", "format_order"]

ActionKind = Literal["F", "B", "I", "W"]

_ACTION_TEXT = re.compile(r"^(\d+)([FBIW])(\d+)$")
# The kind letters the pattern admits, as the ActionKind they are.
_KINDS: dict[str, ActionKind] = {"F": "F", "B": "B", "I": "I", "W": "W"}


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """Stage ``stage`` runs its forward (``F``), full backward (``B``), input-gradient half
    (``I``) or weight-gradient half (``W``) of one micro-batch."""

    stage: int
    kind: ActionKind
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.micro_batch}"

    @property
    def label(self) -> str:
        """Human label for timelines, e.g. ``"F s1 mb3"``."""
        return f"{self.kind} s{self.stage} mb{self.micro_batch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Read PyTorch's compact form ``"2F0"``; anything else is an InputError."""
        match = _ACTION_TEXT.match(text.strip())
        if match is None:
            raise InputError(f"action {text!r} is not <stage><F|B|I|W><micro-batch>, e.g. '2F0'")
        stage, kind, micro_batch = match.groups()
        return cls(int(stage), _KINDS[kind], int(micro_batch))


PipelineOrder = list[list[Action]]
"""``order[r]``: the actions of pipeline rank ``r`` in the order that rank runs them."""


def format_order(order: PipelineOrder) -> str:
    """One line per rank, e.g. ``rank 0: 0F0 0F1 0B0 ...``."""
    return "\n".join(
        f"rank {rank}: " + " ".join(str(action) for action in actions)
        for rank, actions in enumerate(order)
    )
