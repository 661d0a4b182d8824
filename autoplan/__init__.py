"""autoplan: plans how to train a PyTorch model on a cluster of mixed GPUs.

The steps, each a module of its own and each leaving a file a person can read:
``profile`` (model → per-layer profile) → ``solve`` (profile + cluster → plan) →
``plan`` (the emitted, validated plan) → ``runtime`` (torchrun executes the plan).
"""

__version__ = "0.1.0"
