"""Stage-to-stage transfers of the groups executor: activations forward, their gradients back,
regrouped by sample between stages of different replicas.

Why not ``torch.distributed.pipelining``: a ``PipelineStage`` takes one pipeline process group
and sends to one peer per neighbouring stage (``stage_index_to_group_rank``: stage i is group
rank i % group size), with one buffer of one shape per micro-batch. That is the uniform plan's
picture, where the pipeline of replica d and tp index t is a row of a (pp, dp, tp) mesh. When
stages differ in replicas, one replica's output goes to several replicas of the next stage (a
part of its samples to each), a replica of tp 2 receives from a replica of tp 1, and the shapes
differ per peer: no single group and peer map describes it. So these transfers are written
with ``torch.distributed`` point-to-point operations (``batch_isend_irecv``), driven by the
same per-rank action lists (``autoplan.schedule``) the simulator plays.

Regrouping: replica r of stage s owns samples ``[lo_r, hi_r)`` of every micro-batch; for each
replica q of stage s+1 it sends the rows of the overlap with q's range (``boundary_routes``),
and q concatenates what it receives in sample order. Gradients go back the same routes.

Tensor parallelism: inside a tp replica the boundary activation (and its gradient) is the same
on every tp rank, so only tp rank 0 sends, and the receiving replica's tp rank 0 receives and
broadcasts over the replica's tp group: one copy crosses the (often slower) link between the
stages' GPUs instead of one per tp rank of either side.

Ordering: point-to-point messages between two ranks match in the order they are posted (NCCL
ignores tags), but with interleaving two boundaries can share a pair of ranks and the receiver
may need them in another order than the sender sends them. Every rank can compute every
sender's sequence from the plan and the action lists, so a receiver posts its receives from a
sender in exactly that sender's order (early ones fill buffers until needed). Sends never
block the action list: they are waited at the end of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from autoplan.errors import InputError
from autoplan.plan.schema import Plan
from autoplan.runtime.model_stage import meta_model, pipeline_layers
from autoplan.runtime.placement import Route, boundary_routes, share_ranges
from autoplan.runtime.process_groups import ProcessGroups
from autoplan.schedule import PipelineOrder
from autoplan.zoo.dtypes import torch_dtype

__all__ = ["BoundaryShape", "Mailbox", "Message", "boundary_shapes", "send_sequence"]

Direction = Literal["F", "B"]


@dataclass(frozen=True)
class BoundaryShape:
    """One sample's boundary activation after stage ``boundary``: shape without the batch
    dimension, and dtype (its gradient has the same)."""

    boundary: int
    tail: tuple[int, ...]
    dtype: torch.dtype


def boundary_shapes(plan: Plan, inputs: tuple[torch.Tensor, ...]) -> list[BoundaryShape]:
    """The activation each stage but the last sends, found by running the whole model on the
    meta device on one sample of ``inputs`` (no memory, no communication)."""
    model = meta_model(plan)
    dtype = torch_dtype(plan.inputs.dtype)
    if dtype.is_floating_point:
        model = model.to(dtype)
    ends = {stage.layer_end: stage.index for stage in plan.stages[:-1]}
    hidden = tuple(tensor[:1].to("meta") for tensor in inputs)
    shapes: list[BoundaryShape] = []
    with torch.no_grad():
        for index, (name, layer) in enumerate(pipeline_layers(model)):
            output = layer(*hidden)
            if index + 1 in ends:
                if not isinstance(output, torch.Tensor) or output.dim() == 0:
                    raise InputError(
                        f"layer {name or index} returns {type(output).__name__}; the groups "
                        "executor sends one tensor between stages"
                    )
                if output.shape[0] != 1:
                    raise InputError(
                        f"layer {name or index} returns shape {tuple(output.shape)} for one "
                        "sample; a stage boundary's first dimension must be the batch"
                    )
                shapes.append(BoundaryShape(ends[index + 1], tuple(output.shape[1:]), output.dtype))
            hidden = (output,)
    return shapes


@dataclass(frozen=True)
class Message:
    """The rows of one route, one micro-batch, one direction ('F': activation from stage
    ``route.boundary`` to the next; 'B': its gradient back)."""

    direction: Direction
    route: Route
    micro_batch: int

    def sender(self, plan: Plan) -> int:
        """Global rank that sends it (tp rank 0 of the sending replica)."""
        if self.direction == "F":
            return plan.stages[self.route.boundary].replicas[self.route.src].ranks[0]
        return plan.stages[self.route.boundary + 1].replicas[self.route.dst].ranks[0]

    def receiver(self, plan: Plan) -> int:
        """Global rank that receives it (tp rank 0 of the receiving replica)."""
        if self.direction == "F":
            return plan.stages[self.route.boundary + 1].replicas[self.route.dst].ranks[0]
        return plan.stages[self.route.boundary].replicas[self.route.src].ranks[0]

    @property
    def rows(self) -> int:
        return self.route.end - self.route.start


def _outgoing(
    routes: list[list[Route]], stage: int, direction: Direction, replica: int, mb: int
) -> list[Message]:
    """Messages replica ``replica`` of ``stage`` sends after its forward ('F') or backward."""
    if direction == "F":
        return [Message("F", r, mb) for r in routes[stage] if r.src == replica]
    return [Message("B", r, mb) for r in routes[stage - 1] if r.dst == replica]


def send_sequence(plan: Plan, order: PipelineOrder, rank: int) -> list[Message]:
    """Every message ``rank`` sends in a step, in the order it posts them (its action list);
    none unless it is tp rank 0 of its replica."""
    entry = plan.rank_map[rank]
    if entry.tp_index != 0:
        return []
    routes = [boundary_routes(plan, b) for b in range(len(plan.stages) - 1)]
    last = len(plan.stages) - 1
    messages: list[Message] = []
    for action in order[entry.pipeline_rank]:
        sends = action.stage < last if action.kind == "F" else action.stage > 0
        if sends:
            direction: Direction = "F" if action.kind == "F" else "B"
            messages += _outgoing(
                routes, action.stage, direction, entry.dp_index, action.micro_batch
            )
    return messages


@dataclass
class _Posted:
    buffer: torch.Tensor
    works: list[dist.Work]


class Mailbox:
    """This rank's sends and receives of one training step (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        order: PipelineOrder,
        rank: int,
        groups: ProcessGroups,
        device: torch.device,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.device = device
        self.groups = groups
        entry = plan.rank_map[rank]
        self.replica = entry.dp_index
        self.is_sender = entry.tp_index == 0
        self.routes = [boundary_routes(plan, b) for b in range(len(plan.stages) - 1)]
        self.shapes: dict[int, BoundaryShape] = {}
        # What each neighbour sends to this rank, in its posting order.
        self._incoming: dict[int, list[Message]] = {}
        self._position: dict[Message, tuple[int, int]] = {}
        if self.is_sender:
            neighbours = self._neighbour_senders(entry.pipeline_rank)
            for sender in sorted(neighbours - {rank}):
                sequence = [
                    message
                    for message in send_sequence(plan, order, sender)
                    if message.receiver(plan) == rank
                ]
                self._incoming[sender] = sequence
                for index, message in enumerate(sequence):
                    self._position[message] = (sender, index)
        self._posted_upto: dict[int, int] = dict.fromkeys(self._incoming, 0)
        self._posted: dict[Message, _Posted] = {}
        self._local: dict[Message, torch.Tensor] = {}
        self._sends: list[tuple[list[dist.Work], list[torch.Tensor]]] = []

    def _neighbour_senders(self, pipeline_rank: int) -> set[int]:
        senders: set[int] = set()
        for stage in self.plan.stages_of_rank(pipeline_rank):
            for neighbour in (stage.index - 1, stage.index + 1):
                if 0 <= neighbour < len(self.plan.stages):
                    senders |= {r.ranks[0] for r in self.plan.stages[neighbour].replicas}
        return senders

    def set_shapes(self, shapes: list[BoundaryShape]) -> None:
        """The boundary activations' shapes (``boundary_shapes`` of this step's inputs)."""
        self.shapes = {shape.boundary: shape for shape in shapes}

    def _buffer(self, boundary: int, rows: int) -> torch.Tensor:
        shape = self.shapes[boundary]
        return torch.empty((rows, *shape.tail), dtype=shape.dtype, device=self.device)

    # Sending -----------------------------------------------------------------------------

    def send(
        self, direction: Direction, stage: int, micro_batch: int, tensor: torch.Tensor
    ) -> None:
        """Post the sends of ``tensor``, this replica's rows of stage ``stage``'s output
        ('F') or of its input gradient ('B'), to the replicas of the next (previous) stage."""
        if not self.is_sender:
            return
        boundary = stage if direction == "F" else stage - 1
        shape = self.shapes[boundary]
        rows = self.plan.stages[stage].shares[self.replica]
        if tuple(tensor.shape) != (rows, *shape.tail) or tensor.dtype != shape.dtype:
            raise RuntimeError(
                f"stage {stage} {'output' if direction == 'F' else 'input gradient'} has "
                f"shape {tuple(tensor.shape)} {tensor.dtype}; expected "
                f"{(rows, *shape.tail)} {shape.dtype}"
            )
        low = share_ranges(self.plan.stages[stage])[self.replica][0]
        ops: list[dist.P2POp] = []
        kept: list[torch.Tensor] = []
        outgoing = _outgoing(self.routes, stage, direction, self.replica, micro_batch)
        for message in outgoing:
            part = tensor.detach()[message.route.start - low : message.route.end - low]
            destination = message.receiver(self.plan)
            if destination == self.rank:
                self._local[message] = part
                continue
            part = part.contiguous()
            kept.append(part)  # alive until the send completes
            ops.append(dist.P2POp(dist.isend, part, destination))
        if ops:
            self._reap()
            self._sends.append((dist.batch_isend_irecv(ops), kept))

    def _reap(self) -> None:
        # Drop the buffers of sends already done, oldest first, so a long step does not keep
        # every micro-batch's copy alive until it ends.
        while self._sends and all(work.is_completed() for work in self._sends[0][0]):
            self._sends.pop(0)

    # Receiving ---------------------------------------------------------------------------

    def _post_until(self, sender: int, index: int) -> None:
        start = self._posted_upto[sender]
        if start > index:
            return
        sequence = self._incoming[sender]
        ops: list[dist.P2POp] = []
        buffers: list[tuple[Message, torch.Tensor]] = []
        for message in sequence[start : index + 1]:
            buffer = self._buffer(message.route.boundary, message.rows)
            ops.append(dist.P2POp(dist.irecv, buffer, sender))
            buffers.append((message, buffer))
        works = dist.batch_isend_irecv(ops)
        for message, buffer in buffers:
            self._posted[message] = _Posted(buffer, works)
        self._posted_upto[sender] = index + 1

    def _take(self, message: Message) -> torch.Tensor:
        if message in self._local:
            # A copy: the receiving stage's input becomes a leaf of its own graph.
            return self._local.pop(message).clone()
        sender, index = self._position[message]
        self._post_until(sender, index)
        posted = self._posted.pop(message)
        for work in posted.works:
            work.wait()
        return posted.buffer

    def receive(self, direction: Direction, stage: int, micro_batch: int) -> torch.Tensor:
        """This replica's rows of stage ``stage``'s input ('F', from the previous stage) or of
        its output gradient ('B', from the next), on every tp rank of the replica."""
        boundary = stage - 1 if direction == "F" else stage
        replica = self.plan.stages[stage].replicas[self.replica]
        rows = replica.micro_batch_size
        if self.is_sender:
            if direction == "F":
                routes = [r for r in self.routes[boundary] if r.dst == self.replica]
            else:
                routes = [r for r in self.routes[boundary] if r.src == self.replica]
            parts = [self._take(Message(direction, route, micro_batch)) for route in routes]
            tensor = parts[0] if len(parts) == 1 else torch.cat(parts)
        else:
            tensor = self._buffer(boundary, rows)
        if replica.tensor_parallel_degree > 1:
            dist.broadcast(tensor, src=replica.ranks[0], group=self.groups.get(replica.ranks))
        return tensor

    def finish(self) -> None:
        """Wait for this step's sends; every message must have been received."""
        for works, _ in self._sends:
            for work in works:
                work.wait()
        self._sends.clear()
        left = len(self._posted) + len(self._local)
        left += sum(len(self._incoming[s]) - self._posted_upto[s] for s in self._incoming)
        if left:
            raise RuntimeError(f"rank {self.rank}: {left} stage transfers were never received")
        self._posted_upto = dict.fromkeys(self._incoming, 0)
