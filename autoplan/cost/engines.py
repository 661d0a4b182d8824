"""The training engines a plan's cost is computed for, and where they differ in a cost term.

A plan is searched for the engine that will run it (``solve --engine``): autoplan's own
runtime (``autoplan run``, the default) or Megatron-DeepSpeed, whose measured runs ``autoplan
fidelity`` prices too. The two run the same schedule of forward and backward passes, but not
every term the same way:

- The gradient all-reduce. autoplan's mesh executor (uniform plans) wraps each replica in
  DDP, whose buckets all-reduce while the last micro-batch's backward still produces the
  earlier layers' gradients (``autoplan.runtime.data_parallel``): the all-reduce hides behind
  that backward. Its groups executor (stages of their own replicas, tp and shares) sums each
  parameter's gradient over the replicas after the stage's last backward
  (``autoplan.runtime.grad_sync``): nothing hides it, so a plan records the executor it is
  priced for (``PlanConfig.executor``, ``Parallelism.executor``). DeepSpeed's pipeline
  engine runs ``ReduceGrads`` as an instruction after the schedule's last ``BackwardPass``
  (and its plain engine all-reduces on the accumulation boundary after the backward, at ZeRO
  stage 0 and 1 without ``overlap_comm``): nothing hides it.

- The loss's temporaries (``CostModel.transient_bytes``), counted in fp32 logits-sized
  copies beside the one the profile saves (the log-softmax, or softmax). autoplan's runtime
  takes ``F.cross_entropy`` of the logits (upcast to fp32 when 16-bit,
  ``autoplan.runtime.loss``): its backward holds two fp32 logits-sized gradients at once
  (nll_loss's, then log_softmax's). Megatron-DeepSpeed's pipeline keeps the last stage's
  output, the logits, in its buffers until the backward, and its loss takes
  ``output.contiguous().float()`` of their [samples, sequence, vocabulary] view of Megatron's
  [sequence, samples, vocabulary] tensor, a copy unless the micro-batch is one sample; the
  vocab-parallel cross-entropy then subtracts the row maximum into a new tensor, which it
  exponentiates, normalises and saves in place (the saved copy) and reuses in place as the
  gradient. So one copy beside the saved one, two when a replica's micro-batch has several
  samples.

- Not a difference: gradients are held once by both. autoplan's runtime wraps a replicated
  stage in DDP with ``gradient_as_bucket_view`` (``autoplan.runtime.data_parallel``), so the
  parameters' ``.grad`` are views into its all-reduce buckets (without it the buckets hold
  every gradient once more, from the wrapping on); its groups executor packs transient
  buckets for its own sums (``autoplan.runtime.grad_sync``). DeepSpeed's engine (ZeRO 0)
  flattens the gradients into a temporary buffer for the all-reduce after the last backward,
  when the activations are freed: it does not add to the peak.

- Pipeline receive buffers (``CostModel.transfer_buffer_bytes``): torch's pipelining keeps
  one per micro-batch; DeepSpeed's pipe engine only those in flight.

Everything else (blocking pipeline transfers, the 1F1B order, tp collectives, the optimizer
step) is costed the same for both; ``autoplan.cost.model`` says where its forms are
conservative for autoplan's runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan.schema import Engine

__all__ = ["ENGINES", "Engine", "EngineTraits"]


@dataclass(frozen=True)
class EngineTraits:
    """What one engine does differently in a cost term (module docstring)."""

    overlaps_grad_reduce: bool  # the all-reduce hides behind the last backward
    # fp32 logits-sized tensors the loss holds at once beside its saved one; and whether a
    # micro-batch of several samples adds a contiguous copy of transposed logits.
    loss_temporaries: int
    copies_transposed_logits: bool
    # Whether the pipeline keeps a receive buffer for every micro-batch (torch's pipelining)
    # rather than for those in flight only (``CostModel.transfer_buffer_bytes``).
    keeps_receive_buffers: bool
    # The highest ZeRO level a pipeline of two stages or more runs at (DeepSpeed's pipeline
    # engine asserts stage < 2: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
    # parallelism"; autoplan's runtime shards any stage with FSDP2).
    pipeline_zero_max: int = 3

    def loss_copies(self, one_sample: bool) -> int:
        """Logits-sized fp32 temporaries of the loss, for a micro-batch of one sample or more
        (module docstring)."""
        return self.loss_temporaries + (self.copies_transposed_logits and not one_sample)


ENGINES: dict[Engine, EngineTraits] = {
    "autoplan": EngineTraits(
        overlaps_grad_reduce=True,
        loss_temporaries=2,
        copies_transposed_logits=False,
        keeps_receive_buffers=True,
    ),
    "megatron-deepspeed": EngineTraits(
        overlaps_grad_reduce=False,
        loss_temporaries=1,
        copies_transposed_logits=True,
        keeps_receive_buffers=False,
        pipeline_zero_max=1,
    ),
}
