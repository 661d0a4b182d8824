"""Long context: Llama-3.1-8B and Qwen2-7B at 131,072 tokens on h100-a100-l4, cp 1 and searched.

The model is the Hugging Face config of Llama-3.1-8B (tests/data/hf/llama-3.1-8b: Llama-3-8B's
shape with 131,072 positions; the zoo's llama3-8b stops at 8,192), profiled here at one sample
of 131,072 tokens in bf16 (flash attention: 28 GiB saved per block without recompute, and
the vocabulary's fp32 log-softmax of 67 GB at the head). Global batch 8, the shipped
``h100-a100-l4`` cluster (2 × 8 H100, 2 × 8 A100-80GB, 2 × 8 L4).

Rows: each solve with every other knob searched (tp, SP, pp, shares, recompute, offload,
ZeRO), with
- cp pinned to 1 (tensor and pipeline parallelism only),
- cp pinned to 1 without activation offload,
- cp searched (1, 2, 4, 8: ring attention within a node),
- cp searched without activation offload,
and at the chosen plan: predicted iteration time, what fits, and the fullest GPU's memory in
its parts (weights + gradients + optimizer states, saved activations of the micro-batches in
flight, the largest transient; a head's transient is its loss's logits-sized fp32 temporaries).
The cost model's ring terms are ``autoplan.cost.context_parallel``.

Before the solves, the memory terms that decide what fits, per GPU of a replica of 8 GPUs
(tp × cp = 8, each within a node) and of one GPU, for one sample, read from the cost model's
own per-layer costs (``CostModel.tables``, ``CostModel.transient_bytes``): a block's saved
activations without recompute (flash attention: no s × s scores are kept or allocated, the
core keeps its output and log-sum-exp), what full recompute keeps of it (its input) and
re-materialises in its backward, the ring's K, V chunk in flight, the head's saved fp32
log-softmax of its vocabulary shard and its loss's temporaries. Tensor parallelism divides
the vocabulary (the loss runs under ``loss_parallel``), cp the tokens: both divide the head.

Then Qwen2-7B (tests/data/hf/qwen2-7b, 131,072 positions), whose 4 key-value heads stop tensor
parallelism at tp 4 (a GPU keeps a quarter of each layer's activations, where cp 8 keeps an
eighth): cp pinned to 1 and searched.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cluster.schema import Cluster
from autoplan.errors import AutoplanError
from autoplan.plan.schema import Plan
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_outcome

__all__ = ["main"]

HF = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
SEQ_LEN = 131_072
GLOBAL_BATCH = 8
CLUSTER = "h100-a100-l4"
TIME_LIMIT_S = 60.0
# (model, its config folder, rows of (knobs, pinned options))
CASES = [
    (
        "Llama-3.1-8B",
        "llama-3.1-8b",
        [
            ("cp 1", {"cp": 1}),
            ("cp 1, no offload", {"cp": 1, "offload": False}),
            ("cp searched", {}),
            ("cp searched, no offload", {"offload": False}),
        ],
    ),
    ("Qwen2-7B", "qwen2-7b", [("cp 1", {"cp": 1}), ("cp searched", {})]),
]


def _shape(plan: Plan) -> str:
    """Each stage's replicas in one line: 'layers 0-25: H100 tp8 cp1 ×2 (1, none)'."""
    parts = []
    for stage in plan.stages:
        kinds: dict[str, int] = {}
        for r in stage.replicas:
            offload = ", offload" if r.offload else ""
            kind = (
                f"{r.gpu_type} tp{r.tensor_parallel_degree} cp{r.context_parallel_degree} "
                f"({r.micro_batch_size}, {r.recompute}{offload})"
            )
            kinds[kind] = kinds.get(kind, 0) + 1
        replicas = " + ".join(f"{n}× {kind}" for kind, n in kinds.items())
        parts.append(f"{stage.layer_start}-{stage.layer_end - 1}: {replicas}")
    sp = " SP" if plan.parallelism.sequence_parallel else ""
    return f"pp {plan.parallelism.pipeline_degree}{sp} | " + " | ".join(parts)


def main() -> None:
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    console = Console(width=200)
    cluster = load_cluster(example_cluster_path(CLUSTER))
    for name, folder, rows in CASES:
        start = time.monotonic()
        profile = profile_model(f"hf:{HF / folder / 'config.json'}", SEQ_LEN, 1, "bf16")
        table = Table(
            title=f"{name}, {SEQ_LEN:,} tokens, global batch {GLOBAL_BATCH}, {CLUSTER} "
            f"(profiled in {time.monotonic() - start:.0f} s)"
        )
        console.print(_terms(profile, cluster, name))
        for column in ("knobs", "iteration (s)", "fits", "fullest GPU (GiB)", "plan"):
            table.add_column(column)
        for label, pins in rows:
            table.add_row(label, *_row(profile, cluster, pins))
        console.print(table)


# (tp, cp, sequence parallelism) of the replicas the terms table compares.
SHAPES = [(1, 1, False), (8, 1, True), (4, 2, True), (2, 4, True), (1, 8, False)]


def _terms(profile: Profile, cluster: Cluster, name: str) -> Table:
    """The memory terms at this sequence length, per GPU, by (tp, cp) (module docstring)."""
    model = cost_model(profile, cluster, SolveOptions())
    h100 = next(c.index for c in model.classes if c.gpu.name == "H100")
    block = next(i for i, layer in enumerate(profile.layers) if layer.kind == "block")
    head = next(i for i, layer in enumerate(profile.layers) if layer.kind == "head")
    blocks = sum(layer.kind == "block" for layer in profile.layers)
    divides = profile.layers[block].tensor_parallel
    table = Table(
        title=f"{name}: memory terms per GPU (GiB), one sample of {profile.seq_len:,} tokens, "
        f"bf16, on H100 ({blocks} blocks)"
    )
    table.add_column("term")
    shapes = [
        s for s in SHAPES if s[0] == 1 or (divides and divides.degree_must_divide % s[0] == 0)
    ]
    for tp, cp, sp in shapes:
        table.add_column(f"tp {tp}{' SP' if sp else ''} cp {cp}", justify="right")
    rows: dict[str, list[str]] = {}
    for tp, cp, sp in shapes:
        layers = model.tables(h100, tp, 1, sp, cp).layers
        b, h = layers[block], layers[head]
        figures = {
            "a block's saved activations, no recompute": b.saved_bytes["none"],
            f"all {blocks} blocks' saved, no recompute": blocks * b.saved_bytes["none"],
            "a block under full recompute (its input)": b.saved_bytes["full"],
            "a block re-materialised in its backward": model.transient_bytes(b, "full"),
            "the ring's K, V chunk in flight": b.ring_buffer_bytes,
            "the head's saved (fp32 log-softmax shard, final norm)": h.saved_bytes["none"],
            "the head's loss temporaries (transient)": model.transient_bytes(h, "none"),
            "weights + gradients + Adam, whole model, ZeRO 0": sum(
                model.static_bytes(sum(c.params_per_gpu for c in layers), 1, 0)
            ),
        }
        for term, value in figures.items():
            rows.setdefault(term, []).append(f"{value / 1024**3:.2f}")
    for term, values in rows.items():
        table.add_row(term, *values)
    return table


def _row(profile: Profile, cluster: Cluster, pins: dict[str, object]) -> list[str]:
    """One solve's figures: iteration (s), fits, fullest GPU (GiB), plan."""
    options = SolveOptions(time_limit_s=TIME_LIMIT_S, **pins)
    try:
        outcome = solve_outcome(profile, cluster, GLOBAL_BATCH, options)
    except AutoplanError as error:
        return ["-", "no", "-", str(error).splitlines()[0]]
    plan = outcome.plan
    fullest = max(plan.prediction.memory, key=lambda m: m.total_bytes + m.reserved_bytes)
    states = fullest.weights_bytes + fullest.gradients_bytes + fullest.optimizer_bytes
    parts = (fullest.total_bytes, states, fullest.activations_bytes, fullest.transient_bytes)
    total, states, saved, transient = (f"{x / 1024**3:.1f}" for x in parts)
    fits = "no" if outcome.violation else "yes"
    if outcome.timed_out:
        fits += " (time limit: best found)"
    return [
        f"{plan.prediction.iteration_time_ms / 1e3:.2f}",
        fits,
        f"{total} = {states} states + {saved} saved + {transient} transient "
        f"({fullest.gpu_type}, rank {fullest.pipeline_rank}; + "
        f"{fullest.reserved_bytes / 1024**3:.1f} reserved)",
        _shape(plan),
    ]


if __name__ == "__main__":
    main()
