"""The catalog model on a shape it was not fitted on: GPT-Neo-2.7B's block (hidden 2560, 20
heads, sequence 2048) on GH200, against the per-layer times Sailor's authors published for it.

Source: eth-easl/sailor (MIT licence), ``sailor/Planner/sailor_planner/profiles/GPT-Neo-2.7/
GH-96/profile.json``, measured with their Megatron-DeepSpeed profiler (fp32 storage on TF32
tensor cores, unfused attention) on Clariden's GH200 nodes; its per-micro-batch-size, per-tp
forward and backward seconds of one transformer block (rows 2-32 repeat one measurement) are
copied below as milliseconds. The efficiency curve was fitted on OPT-350 (hidden 1024) and
OPT-30 (hidden 7168) layers only (``bench/fit_efficiency.py``), so this is an out-of-sample
check of the catalog on the shape between them.

The prediction is the shipped Megatron-DeepSpeed profile of GPT-Neo-2.7B
(``profiles/calibration/gpt-neo-2.7b.megatron.tf32.profile.json``) costed by the catalog on a
GH200 node of run-14's cluster file (``../shared/calibration/runs/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import Cluster
from autoplan.cost.model import CostModel
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile

__all__ = ["GPT_NEO_GH200_MS", "ShapeCheck", "gpt_neo_gh200_checks", "main"]

_ROOT = Path(__file__).resolve().parents[1]
PROFILE = _ROOT / "profiles" / "calibration" / "gpt-neo-2.7b.megatron.tf32.profile.json"
CLUSTER = _ROOT.parent / "shared" / "calibration" / "runs" / "run-14.yaml"

# (micro-batch size, tp) -> (forward ms, backward ms) of one GPT-Neo-2.7B block on GH200.
GPT_NEO_GH200_MS: dict[tuple[int, int], tuple[float, float]] = {
    (1, 1): (2.127, 5.833),
    (1, 2): (2.745, 4.561),
    (1, 4): (1.505, 2.316),
    (16, 1): (36.527, 97.783),
    (16, 2): (22.933, 55.931),
    (16, 4): (12.312, 28.476),
    (32, 4): (25.363, 58.691),
}


@dataclass(frozen=True)
class ShapeCheck:
    """One measured (micro-batch, tp) of the block and the catalog's prediction."""

    micro_batch: int
    tp: int
    measured_ms: tuple[float, float]
    predicted_ms: tuple[float, float]

    @property
    def ratio(self) -> float:
        """Predicted over measured forward + backward."""
        return sum(self.predicted_ms) / sum(self.measured_ms)


def gpt_neo_gh200_checks() -> list[ShapeCheck]:
    """Every measured row against the catalog (module docstring)."""
    profile = read_json_model(PROFILE, Profile)
    cluster = Cluster.model_validate(yaml.safe_load(CLUSTER.read_text()))
    model = CostModel(profile, cluster, gpu_specs(cluster))
    block = next(i for i, layer in enumerate(profile.layers) if layer.kind == "block")
    out = []
    for (micro_batch, tp), measured in GPT_NEO_GH200_MS.items():
        layer = model.tables(0, tp, micro_batch).layers[block]
        predicted = (layer.forward_ms(), layer.backward_ms("none"))
        out.append(ShapeCheck(micro_batch, tp, measured, predicted))
    return out


def main() -> None:
    """Print the table."""
    print("\nGPT-Neo-2.7B block on GH200 (hidden 2560, not fitted on): measured (Sailor's")
    print("published profile) against the catalog; ratio = predicted / measured fwd + bwd")
    print(f"{'mb':>3} {'tp':>3} {'fwd ms':>9} {'model':>8} {'bwd ms':>9} {'model':>8} {'ratio':>6}")
    for check in gpt_neo_gh200_checks():
        (mf, mb), (pf, pb) = check.measured_ms, check.predicted_ms
        print(
            f"{check.micro_batch:>3} {check.tp:>3} {mf:>9.3f} {pf:>8.3f} {mb:>9.3f} {pb:>8.3f} "
            f"{check.ratio:>6.2f}"
        )
