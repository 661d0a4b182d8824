"""Run as the ranks of a launch (2 or 3 processes, tests/forked_ranks.py, one cp group): a
float64 training step of gpt-tiny (learned positions) and llama-tiny (RoPE, grouped-query
attention) with context parallelism 2 (or 3: ``SPLITS_OF_3``), against the same step in one
process on whole sequences: with equal chunks, and with uneven ones (a 3:1 split of the 16
tokens, the larger chunk on either rank: ``SPLITS``).

``python -m torch.distributed.run --nproc-per-node 2 tests/cp_driver.py OUT`` writes
``OUT/rank<r>.json``: per model and split (``"gpt-tiny"`` equal, ``"gpt-tiny@12,4"`` uneven),
the largest absolute differences of the loss, of the rank's logits and of every parameter's
gradient from the single-process step, and of the logits of the rank's tokens run alone
without the ring (a control that must differ).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autoplan.runtime.context_parallel import (
    chunk_positions,
    context_parallel,
    reduce_gradients,
    shard_sequence,
)
from autoplan.runtime.world import exit_process
from autoplan.zoo import get_model_spec

BATCH, SEQ = 2, 16
# Tokens of each cp rank: equal chunks (None), then 3:1 with the larger chunk on rank 0 and on
# rank 1 (the K/V buffers of the ring differ in size from step to step); under 3 processes
# three different counts (each step of the ring receives a chunk of another size).
SPLITS: tuple[tuple[int, ...] | None, ...] = (None, (12, 4), (4, 12))
SPLITS_OF_3: tuple[tuple[int, ...] | None, ...] = ((6, 2, 8),)


def result_key(model: str, tokens: tuple[int, ...] | None) -> str:
    """The key of a model's result under a split in the written JSON."""
    return model if tokens is None else f"{model}@{','.join(map(str, tokens))}"


def _loss(logits: torch.Tensor, targets: torch.Tensor, tokens: int) -> torch.Tensor:
    # The mean over the whole batch's tokens: each cp rank adds its tokens' share.
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / tokens


def _compare(
    name: str, group: dist.ProcessGroup, tokens: tuple[int, ...] | None
) -> dict[str, float]:
    spec = get_model_spec(name)
    torch.manual_seed(0)
    model = spec.build().double()
    ids = spec.example_input(BATCH, SEQ)
    reference = copy.deepcopy(model)
    whole = reference(ids)
    targets = torch.randint(0, whole.shape[-1], (BATCH, SEQ))
    _loss(whole, targets, BATCH * SEQ).backward()

    with context_parallel(group, SEQ, tokens):
        logits = model(shard_sequence(ids, group, tokens=tokens))
    loss = _loss(logits, shard_sequence(targets, group, tokens=tokens), BATCH * SEQ)
    loss.backward()
    reduce_gradients(model, group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)

    mine = chunk_positions(SEQ, dist.get_world_size(group), dist.get_rank(group), tokens)
    with torch.no_grad():  # the control: the chunk alone, as if it were the whole sequence
        alone = reference(shard_sequence(ids, group, tokens=tokens))
    expected_loss = _loss(whole, targets, BATCH * SEQ).detach()
    out = {
        "loss": (total - expected_loss).abs().item(),
        "logits": (logits - whole.index_select(1, mine)).abs().max().item(),
        "loss_value": total.item(),
        "control_logits": (alone - whole.index_select(1, mine)).abs().max().item(),
    }
    grads = dict(reference.named_parameters())
    worst = 0.0
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None, parameter_name
        worst = max(worst, (parameter.grad - grads[parameter_name].grad).abs().max().item())
    out["gradients"] = worst
    out["parameters"] = sum(1 for _ in model.parameters())
    out["tokens"] = logits.shape[1]
    return out


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    group = dist.group.WORLD
    splits = SPLITS if dist.get_world_size() == 2 else SPLITS_OF_3
    result = {
        result_key(name, tokens): _compare(name, group, tokens)
        for name in ("gpt-tiny", "llama-tiny")
        for tokens in splits
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
