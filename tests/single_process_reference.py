"""Single-process training of a plan's whole model on its whole global batch: the reference
that distributed runs must equal (same seed, same synthetic batches, same AdamW)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from autoplan.files import read_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.data import Batch, training_batches
from autoplan.runtime.loss import loss_function
from autoplan.runtime.model_stage import build_full_model
from autoplan.runtime.report import RunReport
from autoplan.zoo import get_model_spec

__all__ = ["assert_run_equals_reference", "reference_training"]


def reference_training(
    plan: Plan,
    steps: int,
    seed: int = 0,
    learning_rate: float = 1e-3,
    data_seed: int | None = None,
    batches: Iterator[Batch] | None = None,
) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """Per step: the loss, and every parameter's gradient by name (before the update); a tied
    weight's gradient appears under each of its names.

    ``seed`` and ``learning_rate`` are ``autoplan.runtime.trainer``'s defaults; the data seed is
    ``seed + 1`` as there, unless ``data_seed`` is given; ``batches`` replaces that data.
    """
    model = build_full_model(plan.inputs.model.name, plan.inputs.dtype, seed)
    spec = get_model_spec(plan.inputs.model.name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    if batches is None:
        batches = training_batches(plan, seed + 1 if data_seed is None else data_seed)
    loss_fn = loss_function(spec.loss)
    losses, gradients = [], []
    for _ in range(steps):
        inputs, targets = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), targets)
        loss.backward()
        losses.append(loss.item())
        gradients.append(
            {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False)}
        )
        optimizer.step()
    return losses, gradients


def assert_run_equals_reference(
    plan: Plan,
    run: Path,
    steps: int,
    tolerance: float,
    *,
    data_seed: int | None = None,
    held_part: Callable[[int, str, torch.Tensor], torch.Tensor] | None = None,
    tied_head: bool = False,
) -> RunReport:
    """The run written to ``run`` (its ``report.json`` and every rank's per-step gradients,
    ``rank{r}_step{s}.pt``) equals ``reference_training``: each step's loss, and every
    parameter's gradient, each named by some rank, within ``tolerance``; returns the report.

    ``data_seed``: the reference's data (``reference_training``). ``held_part(rank, name,
    gradient)``: the part of the reference gradient that ``rank`` holds under ``name`` (its
    experts' rows), where a rank holds less than the whole parameter. ``tied_head``: the
    head's output weight is tied to the embedding, so no rank need name it (its gradient is
    the embedding's); every other name must be covered, and no rank names one the model has
    not."""
    losses, reference = reference_training(plan, steps, data_seed=data_seed)
    report = read_json_model(run / "report.json", RunReport)
    assert [record.step for record in report.steps] == list(range(steps))
    for record, expected in zip(report.steps, losses, strict=True):
        assert abs(record.loss - expected) < tolerance, (record.loss, expected)
    for step in range(steps):
        covered: set[str] = set()
        for rank in range(plan.world_size):
            dumped = torch.load(run / f"rank{rank}_step{step}.pt")
            assert dumped, f"rank {rank} dumped no gradients"
            for name, grad in dumped.items():
                expected = reference[step][name]
                if held_part is not None:
                    expected = held_part(rank, name, expected)
                assert grad.shape == expected.shape, (name, grad.shape, expected.shape)
                error = (grad - expected).abs().max().item()
                assert error < tolerance, f"step {step} rank {rank} {name}: {error:.3g}"
                covered.add(name)
        names = set(reference[step])
        if tied_head:
            untied = {name for name in names if "head.output" not in name}
            assert untied <= covered <= names, names ^ covered
        else:
            assert covered == names, names ^ covered
    return report
