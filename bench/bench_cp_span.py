"""Uneven cp chunks across GPU types: Llama-3.1-8B at 131,072 tokens on h100-a100-l4.

One sample of 131,072 tokens (the profile of bench_long_context: the Hugging Face config of
Llama-3.1-8B, bf16), the whole model as one stage, one micro-batch in flight, the fastest
recompute mode that fits (``autoplan.solve.context_span.price_split``; no offload, no ZeRO).
A cp rank is one node (tp 8 with sequence parallelism), so a cp group of two ranks is two
nodes. Per pair of node types, the time of one sample's forward + backward:

- each node alone (cp 1), and the two as two data-parallel replicas, samples shared by speed
  (per sample 1 / (1/t_a + 1/t_b), the gradient all-reduce left out: it is the same for a
  cp group, which reduces over the same two nodes);
- the two as one cp group across the types, even chunks and the best split
  (``best_split``: every split of tokens in multiples of 8, each a rank's even count divisible
  by tp under SP), and two nodes of one type as a cp group for reference.

The ring between node types runs on the cluster's inter-rack link (25 GB/s a node, shared by
the 8 tp rings), within a type on its InfiniBand (H100 400, A100 200 GB/s a node). Each ring
step sends the chunk its rank holds, so the larger chunk's transfer sets the step where the
link is slow: the split that balances compute then lengthens the ring. A second table prices
H100 + A100 as if their racks were joined at 200 GB/s a node (a cluster that is not shipped:
``JOINED``), where the link no longer decides.

A third table is what ``autoplan solve`` makes of it (``autoplan.solve.context_span_family``):
the spanning family's best (or, where it is pruned, its floor) beside the other families' best
and the plan written, on tests/data/cpu-span.yaml (gpt-tiny at 64 tokens that no node holds)
and for Llama-3.1-8B above at 8 samples on the shipped cluster and at 2 on the joined one
(where the bound's recompute, forced by memory, keeps the family from pricing its splits).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cluster.schema import Cluster, InterNodeLink
from autoplan.cost.context_span import ContextMember, ContextSpan
from autoplan.cost.model import CostModel
from autoplan.limits import GIB
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.context_span import SpanSplit, best_split, price_split
from autoplan.solve.context_span_family import span_family

__all__ = ["main"]

HF = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
SPAN_CLUSTER = HF.parent / "cpu-span.yaml"
SEQ_LEN = 131_072
CLUSTER = "h100-a100-l4"
TP = 8
PAIRS = [("H100", "A100-80GB"), ("H100", "L4"), ("A100-80GB", "L4")]
# The hypothetical link of the second table: H100 and A100 racks joined at A100's InfiniBand.
JOINED = InterNodeLink(groups=["h100", "a100"], bandwidth_gb_per_s=200)


def _class(model: CostModel, name: str) -> int:
    return next(c.index for c in model.classes if c.gpu.name == name)


def _price(model: CostModel, members: tuple[ContextMember, ...]) -> SpanSplit | None:
    layers = (0, len(model.profile.layers))
    return price_split(model, ContextSpan(members, TP), 1, layers, 1, sequence_parallel=True)


def _cells(found: SpanSplit | None, model: CostModel) -> list[str]:
    if found is None:
        return ["-", "-", "does not fit"]
    split = " + ".join(
        f"{model.classes[m.device_class].gpu.name} {m.tokens:,}" for m in found.span.members
    )
    fullest = max(
        peak / model.usable_bytes(m.device_class)
        for peak, m in zip(found.peak_bytes, found.span.members, strict=True)
    )
    peak = max(found.peak_bytes) / GIB
    return [
        split,
        f"{found.work_ms / 1e3:.2f}",
        f"{found.recompute}, {peak:.1f} GiB ({fullest:.0%})",
    ]


def main() -> None:
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    console = Console(width=200)
    cluster = load_cluster(example_cluster_path(CLUSTER))
    start = time.monotonic()
    profile = profile_model(f"hf:{HF / 'llama-3.1-8b' / 'config.json'}", SEQ_LEN, 1, "bf16")
    took = time.monotonic() - start
    joined = cluster.model_copy(update={"inter_node_links": [*cluster.inter_node_links, JOINED]})
    for title, pairs, on in (
        (f"{CLUSTER} as shipped", PAIRS, cluster),
        ("H100 and A100 racks joined at 200 GB/s a node (not shipped)", PAIRS[:1], joined),
    ):
        model = cost_model(profile, on, SolveOptions())
        console.print(_table(model, pairs, f"{title} (profiled in {took:.0f} s)"))
    console.print(_solved_table(profile, cluster))


def _solved_table(llama: Profile, cluster: Cluster) -> Table:
    """What ``autoplan solve`` writes where the spanning family is searched (module
    docstring): the family's best or floor beside the other families' best."""
    table = Table(title="autoplan solve with the spanning-context family (context_span_family)")
    for column in (
        "case",
        "other families' best (ms)",
        "spanning family (ms)",
        "family CPU s",
        "solve's plan",
    ):
        table.add_column(column)
    cases = [
        (
            "gpt-tiny, 64 tokens fp64, 1 sample, cpu-span (tests/data: no node holds it)",
            profile_model("gpt-tiny", 64, 1, "fp64"),
            load_cluster(SPAN_CLUSTER),
            1,
            SolveOptions(cp_min_seq_len=64),
        ),
        (
            f"Llama-3.1-8B, {SEQ_LEN:,} tokens, 8 samples, {CLUSTER}",
            llama,
            cluster,
            8,
            SolveOptions(),
        ),
        (
            f"Llama-3.1-8B, {SEQ_LEN:,} tokens, 2 samples, {CLUSTER}, H100 and A100 racks "
            "joined at 200 GB/s (not shipped)",
            llama,
            cluster.model_copy(update={"inter_node_links": [*cluster.inter_node_links, JOINED]}),
            2,
            SolveOptions(),
        ),
    ]
    for name, profile, on, batch, options in cases:
        model = cost_model(profile, on, options)
        others = [c for c in solve_candidates(model, batch, options).candidates if c.cost.feasible]
        other_ms = others[0].iteration_ms if others else math.inf
        start = time.process_time()
        family = span_family(model, batch, options, other_ms)
        took = time.process_time() - start
        plan = solve(profile, on, batch, options)
        (replica, *_) = plan.stages[0].replicas
        if replica.context_tokens is not None:
            types = [
                plan.rank_map[r].gpu_type for r in replica.ranks[:: replica.tensor_parallel_degree]
            ]
            chosen = "spanning cp: " + " + ".join(
                f"{t} {n}" for t, n in zip(types, replica.context_tokens, strict=True)
            )
        else:
            chosen = f"{len(plan.stages)} stage(s), cp {replica.context_parallel_degree}"
        spanning = (
            f"{family.best.iteration_ms:.3f}"
            if family.best is not None
            else f"none faster (floor {family.floor_ms:.0f})"
        )
        table.add_row(
            name,
            "none fits" if not others else f"{other_ms:.3f}",
            spanning,
            f"{took:.2f}",
            f"{chosen}, {plan.prediction.iteration_time_ms:.3f} ms",
        )
    return table


def _table(model: CostModel, pairs: list[tuple[str, str]], title: str) -> Table:
    table = Table(
        title=f"Llama-3.1-8B, one sample of {SEQ_LEN:,} tokens, a cp rank = one node (tp {TP} + "
        f"SP), forward + backward of the whole model: {title}"
    )
    for column in ("nodes", "as", "tokens per rank", "s per sample", "recompute, fullest GPU"):
        table.add_column(column)
    layers = (0, len(model.profile.layers))
    for a, b in pairs:
        ka, kb = _class(model, a), _class(model, b)
        alone = {
            name: _price(model, (ContextMember(k, 1, SEQ_LEN),)) for name, k in ((a, ka), (b, kb))
        }
        for name, found in alone.items():
            table.add_row(f"1 {name}", "cp 1", *_cells(found, model))
        times = [f.work_ms for f in alone.values() if f is not None]
        dp = 1 / sum(1 / t for t in times) if times else None
        table.add_row(
            f"1 {a} + 1 {b}",
            "dp 2 (samples by speed)",
            "-",
            "-" if dp is None else f"{dp / 1e3:.2f}",
            "per sample: 1 / (1/t_a + 1/t_b) of the rows above that fit",
        )
        half = SEQ_LEN // 2
        even = _price(model, (ContextMember(ka, 1, half), ContextMember(kb, 1, half)))
        table.add_row(f"1 {a} + 1 {b}", "cp 2 across types, even", *_cells(even, model))
        start = time.monotonic()
        best = best_split(model, ((ka, 1), (kb, 1)), TP, 1, layers, 1, sequence_parallel=True)
        took = time.monotonic() - start
        table.add_row(
            f"1 {a} + 1 {b}", f"cp 2 across types, best ({took:.0f} s)", *_cells(best, model)
        )
    for name in ("H100", "A100-80GB"):
        k = _class(model, name)
        same = _price(model, (ContextMember(k, 2, SEQ_LEN // 2),))
        table.add_row(f"2 {name}", "cp 2, one type", *_cells(same, model))
    return table


if __name__ == "__main__":
    main()
