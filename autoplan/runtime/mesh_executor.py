"""The mesh executor: a uniform plan on PyTorch's own engine.

A plan whose every pipeline rank has dp replicas of tp GPUs with the same shares
(``Plan.uniform_shape``) is one DeviceMesh of shape (pp, dp, tp). Per rank this executor

1. builds the mesh (``process_groups.build_mesh``),
2. gets its stage(s)' modules from the parallelize step (``parallelize``: the seeded model's
   layers with tensor parallelism on the "tp" sub-mesh, context parallelism, the replica's
   recompute and offload, and data parallelism over the "dp" sub-mesh: DDP, or FSDP2 with
   tensor parallelism and at ZeRO-2/3), and makes one optimizer per stage (ZeRO-1 per stage
   when the plan says so: ``data_parallel.make_optimizer``),
3. wraps each stage in a ``PipelineStage`` on the "pp" group and runs the plan's schedule
   (GPipe, 1F1B, Interleaved 1F1B, zero bubble) with the plan's micro-batches.

With context parallelism (cp > 1) the mesh is (pp, dp, cp, tp): each rank runs its cp
chunk of every sample (``autoplan.runtime.context_parallel``: ring attention over the "cp"
group, the tokens' global positions), and data parallelism runs over the "dp" × "cp" ranks
together (each rank's loss is the mean over its tokens, weighted by cp × its tokens / the
sequence length, 1 for equal chunks, so DDP's average is the whole batch's mean), as
torchtitan's FSDP over dp_shard × cp. A factory model's loss is a plain sum of its output
(``autoplan.runtime.loss``), whose whole is the sum of the cp ranks' parts whatever their
chunks: each rank's is weighted by cp, so that DDP's average over the cp ranks is that sum's
gradient (not 1/cp of it), and its targets (unused) are not split.

Uneven shares scale replica d's loss by dp × its samples / global batch, so that DDP's plain
average of the replicas' gradients is the full-batch mean. (Each replica's pipeline is its own
row of the mesh, so replicas may run micro-batches of different sizes.)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

from autoplan.runtime.context_parallel import shard_sequence
from autoplan.runtime.data import replica_rows
from autoplan.runtime.data_parallel import make_optimizer
from autoplan.runtime.executor_protocol import Optimizer, RankSetup
from autoplan.runtime.loss import loss_context, loss_function
from autoplan.runtime.parallelize import parallelize
from autoplan.runtime.placement import rank_place
from autoplan.runtime.process_groups import build_mesh
from autoplan.runtime.tied_weights import TiedGradientSync
from autoplan.schedule.names import MULTI_STAGE_SCHEDULES
from autoplan.zoo import get_model_spec

__all__ = ["SCHEDULE_CLASSES", "MeshExecutor"]

SCHEDULE_CLASSES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved_1f1b": "Interleaved1F1B",
    # Zero bubble: the V schedules place stages r and 2pp-1-r on rank r themselves.
    "interleaved_zero_bubble": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}


class MeshExecutor:
    """One rank of a uniform plan on a (pp, dp, tp) DeviceMesh (see the module docstring)."""

    name = "mesh"

    def __init__(self, setup: RankSetup) -> None:
        plan, entry, device = setup.plan, setup.entry, setup.device
        seed, learning_rate, loss_scale = setup.seed, setup.learning_rate, setup.loss_scale
        uniform = plan.mesh_shape()
        assert uniform is not None, "the mesh executor runs uniform plans"
        self.dp, self.cp, self.tp = uniform
        self.plan = plan
        self.entry = entry
        self.device = device
        par = plan.parallelism
        world = build_mesh(plan, device, entry)
        self.cp_group = world.cp_group
        ranks = parallelize(plan, rank_place(plan, entry.rank), world, device, seed)
        my_stages, models = ranks.stages, ranks.models
        self.tied = TiedGradientSync(
            plan,
            ranks.tied,
            {stage.index: model for stage, model in zip(my_stages, models, strict=True)},
            entry,
        )
        spec = get_model_spec(plan.inputs.model.name)
        # The logits are split by vocabulary when tp is (see tensor_parallel): a model without
        # a recognised head gets a plain output, which the loss takes either way.
        self.split_vocabulary = self.tp > 1
        pp_group = world.mesh["pp"].get_group()
        pipeline_stages = [
            PipelineStage(module, stage.index, par.num_stages, device, group=pp_group)
            for stage, module in zip(my_stages, ranks.modules, strict=True)
        ]
        # One optimizer per stage: ZeRO-1 is the stage's choice. (Under FSDP2 the parameters
        # are DTensors made at wrapping, so the lists are taken after it.)
        self.optimizers: list[Optimizer] = [
            make_optimizer(list(model.parameters()), world.data, stage.zero1, learning_rate)
            for stage, model in zip(my_stages, models, strict=True)
        ]
        self.models: list[nn.Module] = models
        # As wrapped for data parallelism: DDP's gradient buckets count with the model states.
        self.data_parallel_modules: list[nn.Module] = list(ranks.modules)

        replica = plan.stages[0].replicas[entry.dp_index]
        share = replica.micro_batch_size
        weight = self.dp * share * par.num_micro_batches / plan.inputs.global_batch_size
        # The chunk of every cp rank is the same at every stage (mesh_shape): uneven chunks
        # weight each rank's token mean by its tokens' share of the sequence.
        self.tokens = replica.context_tokens
        self.token_targets = spec.loss == "cross_entropy"
        if not self.token_targets:
            weight *= self.cp  # a plain sum: the cp ranks' parts add up (module docstring)
        elif self.tokens is not None:
            weight *= self.cp * self.tokens[entry.cp_index] / plan.inputs.seq_len
        schedule_class = get_schedule_class(SCHEDULE_CLASSES[par.schedule])
        loss_fn = loss_function(spec.loss, weight, loss_scale)
        if par.schedule in MULTI_STAGE_SCHEDULES:
            self.schedule = schedule_class(pipeline_stages, par.num_micro_batches, loss_fn=loss_fn)
        else:
            self.schedule = schedule_class(
                pipeline_stages[0], par.num_micro_batches, loss_fn=loss_fn
            )
        indices = {stage.index for stage in my_stages}
        self.is_first = 0 in indices
        self.is_last = par.num_stages - 1 in indices
        self.rows = replica_rows(plan, entry.dp_index)

    def run(self, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> float:
        """One step of the schedule on this replica's rows; the tied-weight sum after it."""
        args = tuple(t[self.rows].to(self.device) for t in inputs) if self.is_first else ()
        target = targets[self.rows].to(self.device) if self.is_last else None
        if self.cp_group is not None:
            # This rank's tokens of every sample (the same chunk at every stage); the layers
            # run them under the ring (apply_context_parallel).
            args = tuple(shard_sequence(t, self.cp_group, tokens=self.tokens) for t in args)
            if target is not None and self.token_targets:
                target = shard_sequence(target, self.cp_group, tokens=self.tokens)
        losses: list[torch.Tensor] = []
        # loss_parallel (vocabulary-split logits) must cover the loss's forward and backward,
        # both of which run inside the schedule's step.
        with loss_context(self.split_vocabulary):
            self.schedule.step(*args, target=target, losses=losses)
        self.tied.synchronize()
        # Each last-stage replica holds weighted micro-batch losses w_d × mean; their sum over
        # replicas (and their cp ranks: weighted by their tokens) and micro-batches divided by
        # dp × cp × m is the global batch's mean loss.
        if not (self.is_last and self.entry.tp_index == 0):
            return 0.0
        total = sum(float(value.detach().double().sum()) for value in losses)
        return total / (self.dp * self.cp * self.plan.parallelism.num_micro_batches)
