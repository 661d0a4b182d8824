"""The measured per-layer times in ``../shared/calibration/layer_times.csv`` and what they are
compared with: the profiles of the models measured, and what the source implies about how.

The source (Sailor, SOSP'25, measured with Megatron-DeepSpeed) records per (model, GPU, tp,
micro-batch, layer) forward and backward ms on one GPU of a tp group. It does not record the
precision, the links or whether the backward recomputes the forward; each is inferred here
from the data and stated:

- Models: Megatron-DeepSpeed GPTs with OPT-350's and OPT-30's shapes (pre-LayerNorm, GELU,
  learned positions, an untied head, the vocabulary padded to 50304 as Megatron pads to a
  multiple of 128): the CSV's parameter counts per layer equal those of these models
  (embedding 53,608,448 and 375,259,136; block 12,596,224 and 616,655,872). Attention is
  profiled unfused (``attention='math'``): the CSV's saved activations per sample (43·s·h
  elements for OPT-350) include one s×s tensor per head, as unfused attention keeps. The
  embedding and head are Megatron's: the embedding transposes its output to [s, b, h] (a copy)
  and applies dropout; the head ends in Megatron's cross-entropy (the softmax computed in
  place and saved in the forward, a light backward), not torch's.
- Precision: TF32 where a pass ran faster than the GPU's FP32 peak, else FP32 (GPUs without
  TF32 run FP32).
- Backward: a plain backward does about 1.9× its forward's FLOPs and bytes. OPT-30's
  measured backwards take 2.0× their forwards, OPT-350's 2.3-3.1× on all seven GPUs, and at
  tp > 1 the backward pays the same all-reduces as the forward (so the forward is not
  recomputed in it): the backward's matmuls run slower than the forward's at h 1024. The
  catalog's ``backward_matmul_efficiency`` (fitted) carries that.
- The embedding's measured backwards are 2-4 µs, less than one kernel launch: the timer did
  not see its gradient kernels. Those rows are shown but not counted.
- Links: ``CALIBRATION_MACHINES`` (fitted by ``bench/fit_efficiency.py``; see there).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.calibrate.measured_runs import MEASURED_GPU_NAMES
from autoplan.cluster.catalog import peak_tflops
from autoplan.cluster.schema import GpuSpec
from autoplan.profile.schema import LayerProfile, Profile

__all__ = [
    "CALIBRATION_CSV",
    "CALIBRATION_GPUS",
    "CALIBRATION_MACHINES",
    "CALIBRATION_MODELS",
    "SEQ_LEN",
    "Link",
    "Row",
    "calibration_profiles",
    "infer_precision",
    "plain_opt_350",
    "predict_row",
    "read_rows",
    "sailor_gpt_neo_2_7b",
    "sailor_opt_30",
    "sailor_opt_350",
]

SEQ_LEN = 2048
CALIBRATION_CSV = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "layer_times.csv"

# Calibration GPU names → catalog names (the product reads the same table for measured runs).
CALIBRATION_GPUS = MEASURED_GPU_NAMES

# Megatron pads the vocabulary to a multiple of 128: 50272 → 50304.
_PADDED_VOCAB = 50304


def _sailor_gpt(
    layers: int, hidden: int, heads: int, batch_size: int, seq_len: int, megatron: bool = True
) -> Any:
    import torch
    from torch import nn

    from autoplan.zoo.gpt import GPT, GPTConfig

    class MegatronCrossEntropy(torch.autograd.Function):
        """Megatron's (vocab-parallel) cross-entropy: softmax computed in place in the
        forward and saved; the backward is the softmax less one at the target, scaled."""

        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor) -> torch.Tensor:
            shifted = logits - logits.max(dim=-1, keepdim=True).values
            target = shifted[..., 0].clone()  # token 0 stands in for the targets
            exp = shifted.exp_()
            total = exp.sum(dim=-1)
            ctx.save_for_backward(exp.div_(total.unsqueeze(-1)))
            return total.log() - target

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            (softmax,) = ctx.saved_tensors
            softmax[..., 0] -= 1.0
            return softmax.mul_(grad.unsqueeze(-1))

    class Embedding(nn.Module):
        """Megatron's embedding: lookups and sum, then dropout. The dropout is written as
        CUDA's fused kernel moves it (read x, write the output and a 1-byte mask): on CPU
        fake tensors torch decomposes dropout into a float mask and three passes."""

        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
            x = self.inner(token_ids)
            keep = torch.empty_like(x, dtype=torch.bool)
            return x * keep

    class Head(nn.Module):
        """Final LayerNorm, output projection and Megatron's cross-entropy on fp32 logits."""

        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return MegatronCrossEntropy.apply(self.inner(x).float())

    config = GPTConfig(layers, hidden, heads, _PADDED_VOCAB, seq_len, tie_embeddings=False)
    model = GPT(config)
    if megatron:
        model.layers["embed"] = Embedding(model.layers["embed"])
        model.layers["head"] = Head(model.layers["head"])
    return model, torch.zeros((batch_size, seq_len), dtype=torch.long)


def sailor_opt_350(batch_size: int, seq_len: int) -> Any:
    """OPT-350's shape as Megatron-DeepSpeed builds it: 24 blocks, h 1024, 16 heads."""
    return _sailor_gpt(24, 1024, 16, batch_size, seq_len)


def sailor_opt_30(batch_size: int, seq_len: int) -> Any:
    """OPT-30's shape as Megatron-DeepSpeed builds it: 48 blocks, h 7168, 56 heads."""
    return _sailor_gpt(48, 7168, 56, batch_size, seq_len)


def sailor_gpt_neo_2_7b(batch_size: int, seq_len: int) -> Any:
    """GPT-Neo-2.7B's shape as Megatron-DeepSpeed builds it (``gpt_neo_model.py``: the same
    pre-LayerNorm GELU block with unfused attention; its local layers mask a 256-token
    window but still compute the full s×s scores): 32 blocks, h 2560, 20 heads."""
    return _sailor_gpt(32, 2560, 20, batch_size, seq_len)


def plain_opt_350(batch_size: int, seq_len: int) -> Any:
    """OPT-350's shape as the zoo's GPT (torch's embedding and cross-entropy)."""
    return _sailor_gpt(24, 1024, 16, batch_size, seq_len, megatron=False)


# CSV model → (factory, tensor-parallel divisor: gcd of heads and MLP size).
CALIBRATION_MODELS = {
    "OPT-350": ("bench.calibration_data:sailor_opt_350", 16),
    "OPT-30": ("bench.calibration_data:sailor_opt_30", 56),
}

# The CSV's layer kinds → the profile layer they compare with (first embedding, first block,
# the head).
_KIND_INDEX = {"embedding": 0, "transformer": 1, "head": -1}


def calibration_profiles() -> dict[str, Profile]:
    """The profile of each calibration model in fp32 (the runs were FP32 or TF32: 4 bytes), as
    Megatron-DeepSpeed ran it (module docstring)."""
    from autoplan.profile import profile_model

    return {
        model: profile_model(
            factory, SEQ_LEN, 1, "fp32", attention="math", tensor_parallel_divisor=divisor
        )
        for model, (factory, divisor) in CALIBRATION_MODELS.items()
    }


@dataclass(frozen=True)
class Row:
    """One measured configuration of one layer kind (the median over the CSV's rows of that
    kind: the source repeats one measurement across a configuration's blocks)."""

    model: str
    gpu: str  # catalog name
    tp: int
    micro_batch: int
    kind: str  # 'embedding', 'transformer' or 'head'
    forward_ms: float
    backward_ms: float

    def layer(self, profiles: dict[str, Profile]) -> LayerProfile:
        return profiles[self.model].layers[_KIND_INDEX[self.kind]]

    @property
    def backward_counted(self) -> bool:
        """Whether the backward is a real measurement (module docstring: not the
        embedding's)."""
        return self.kind != "embedding"


def read_rows(path: Path = CALIBRATION_CSV) -> list[Row]:
    """Every (model, GPU, tp, micro-batch, layer kind) of the CSV, medians over its rows."""
    grouped: dict[tuple[str, str, int, int, str], list[dict[str, str]]] = defaultdict(list)
    with path.open() as handle:
        for row in csv.DictReader(handle):
            key = (
                row["model"],
                CALIBRATION_GPUS[row["gpu"]],
                int(row["tp"]),
                int(row["micro_batch"]),
                row["layer_kind"],
            )
            grouped[key].append(row)
    return [
        Row(
            model=model,
            gpu=gpu,
            tp=tp,
            micro_batch=micro_batch,
            kind=kind,
            forward_ms=statistics.median(float(r["fwd_ms"]) for r in rows),
            backward_ms=statistics.median(float(r["bwd_ms"]) for r in rows),
        )
        for (model, gpu, tp, micro_batch, kind), rows in sorted(grouped.items())
    ]


def infer_precision(
    rows: list[Row], profiles: dict[str, Profile], specs: dict[str, GpuSpec]
) -> dict[tuple[str, str], str]:
    """(model, GPU) → 'tf32' where a transformer pass beat the FP32 peak, else 'fp32'."""
    out: dict[tuple[str, str], str] = {}
    for row in rows:
        key = (row.model, row.gpu)
        out.setdefault(key, "fp32")
        spec = specs[row.gpu]
        if row.kind != "transformer" or "tf32" not in spec.peak_tflops:
            continue
        layer = row.layer(profiles)
        tpp = layer.tensor_parallel
        share = 1.0 / row.tp if (tpp is not None and row.tp > 1) else 1.0
        for flops, ms in (
            (layer.forward_flops, row.forward_ms),
            (layer.backward_flops, row.backward_ms),
        ):
            tflops = flops * share * row.micro_batch / (ms * 1e9)
            if tflops > peak_tflops(spec, "fp32"):
                out[key] = "tf32"
    return out


@dataclass(frozen=True)
class Link:
    """The link a calibration machine's tp group all-reduces over (alpha-beta)."""

    bandwidth_gb_per_s: float
    latency_us: float


# The links the calibration data imply, per GPU and tp degree (the source does not record its
# machines): fitted by bench/fit_efficiency.py on the tp > 1 rows, given the compute model
# fitted on the tp = 1 rows; an effective per-step latency (it includes what the framework
# adds per collective call). Read as: NVLink on the SXM and superchip parts; PCIe on
# RTX-2080 and Titan-RTX at every tp; on RTX-3090, pairs joined by NVLink bridges, PCIe
# beyond a pair and a slow network (~1.5 GB/s) between the 4-GPU nodes at tp 8.
# (per-step latency µs, {tp: bandwidth GB/s})
_FITTED_LINKS: dict[str, tuple[float, dict[int, float]]] = {
    "A100-40GB": (40, {2: 86.2, 4: 142.2}),
    "A100-80GB": (30, {2: 53.6, 4: 151.7}),
    "GH200": (40, {2: 85.7, 4: 250.7}),
    "RTX-2080": (30, {2: 4.0, 4: 4.9, 8: 5.2}),
    "RTX-3090": (80, {2: 32.0, 4: 6.1, 8: 1.6}),
    "Titan-RTX": (20, {2: 3.9, 4: 4.7, 8: 5.1}),
    "V100-16GB": (30, {2: 37.8, 4: 51.8, 7: 65.0, 8: 92.4}),
}
CALIBRATION_MACHINES: dict[str, dict[int, Link]] = {
    gpu: {tp: Link(bandwidth, latency) for tp, bandwidth in bandwidths.items()}
    for gpu, (latency, bandwidths) in _FITTED_LINKS.items()
}


def predict_row(
    row: Row,
    layer: LayerProfile,
    spec: GpuSpec,
    precision: str,
    link: Link | None,
) -> tuple[float, float]:
    """(forward, backward) ms the cost model predicts for one row on ``spec``, the tp
    all-reduces over ``link``."""
    from autoplan.cluster.catalog import spec_for_dtype
    from autoplan.cost.layers import layer_cost

    resolved = spec_for_dtype(spec, precision)
    cost = layer_cost(
        layer,
        resolved,
        peak_tflops(spec, precision),
        tp=row.tp,
        micro_batch_size=row.micro_batch,
        profile_micro_batch_size=1,
        efficiency=resolved.efficiency,
        intra_node_bandwidth_gb_per_s=None if link is None else link.bandwidth_gb_per_s,
        intra_node_latency_us=0.0 if link is None else link.latency_us,
    )
    return cost.forward_ms(), cost.backward_ms("none")
