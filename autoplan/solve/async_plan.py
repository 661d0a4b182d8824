"""The async alternative as a plan file (``autoplan solve --allow-async --async-output``): the
configuration ``best_async`` chose, emitted as any plan is (stages, replicas, ranks, nodes),
then marked async_pb, so that ``autoplan run`` / ``show`` / ``simulate`` read it.

What changes from the emitted synchronous (1F1B) plan of the same configuration:

- ``parallelism``: schedule ``async_pb`` with the default settings (``AsyncPB``: Linear Weight
  Prediction and Spike Compensation on, momentum 0.9);
- ``prediction``: the async cost's iteration time, m × the slowest rank's per-micro-batch time
  (``autoplan.cost.async_pb``), with samples, tokens, TFLOP/s and MFU rescaled to it; its
  breakdown has no bubble: the whole time is the slowest rank's work (its compute, exposed
  communication and per-micro-batch optimizer steps, not split further), optimizer 0;
- ``memory``: each estimate's activations carry the (p − r) stashed weight versions of the
  micro-batches in flight at pipeline rank r, as the async cost counts them.

Stage timings (forward, backward, sends per micro-batch) are the synchronous plan's: the same
work per micro-batch, which the simulator plays without a flush.
"""

from __future__ import annotations

import dataclasses

from autoplan.cost.model import CostModel
from autoplan.plan.schema import AsyncPB, Plan, PlanInputs, TimeBreakdown
from autoplan.solve.async_pb import AsyncChoice
from autoplan.solve.emit import emit_plan

__all__ = ["emit_async_plan"]


def emit_async_plan(model: CostModel, choice: AsyncChoice, inputs: PlanInputs) -> Plan:
    """The plan of ``choice`` under schedule async_pb (module docstring)."""
    config = dataclasses.replace(choice.config, schedule="1f1b")
    plan = emit_plan(model, config, choice.cost.synchronous, inputs, [])
    par = plan.parallelism.model_copy(update={"schedule": "async_pb", "async_pb": AsyncPB()})
    old = plan.prediction
    iteration_ms = choice.cost.iteration_ms
    scale = old.iteration_time_ms / iteration_ms
    pp = par.pipeline_degree
    memory = [
        estimate.model_copy(
            update={
                "activations_bytes": estimate.activations_bytes + stash,
                "total_bytes": estimate.total_bytes + stash,
            }
        )
        for estimate in old.memory
        for stash in [(pp - estimate.pipeline_rank) * estimate.weights_bytes]
    ]
    prediction = old.model_copy(
        update={
            "iteration_time_ms": iteration_ms,
            "breakdown": TimeBreakdown(
                compute_ms=iteration_ms,
                bubble_ms=0.0,
                tp_comm_ms=0.0,
                pp_comm_ms=0.0,
                dp_comm_ms=0.0,
                optimizer_ms=0.0,
            ),
            "samples_per_s": inputs.global_batch_size / iteration_ms * 1e3,
            "tokens_per_s": inputs.global_batch_size * inputs.seq_len / iteration_ms * 1e3,
            "tflops_per_gpu": old.tflops_per_gpu * scale,
            "mfu": old.mfu * scale,
            "memory": memory,
        }
    )
    return Plan.model_validate(
        plan.model_copy(update={"parallelism": par, "prediction": prediction}).model_dump()
    )
