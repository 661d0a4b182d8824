"""``sweep``: one cluster file solved at several sizes and global batches, each run priced.

``scale.py`` makes the cluster of each size (proportional to the file's node groups, or by a
GPU mix), ``runner.py`` solves each configuration and prices it, ``schema.py`` holds the row
model, ``csv_file.py`` and ``plot.py`` write the rows. No torch.
"""

from autoplan.sweep.runner import DEFAULT_TRAIN_TOKENS, configurations, run_sweep
from autoplan.sweep.scale import check_gpu_mix, largest_remainder, scale_cluster
from autoplan.sweep.schema import SweepRow

__all__ = [
    "DEFAULT_TRAIN_TOKENS",
    "SweepRow",
    "check_gpu_mix",
    "configurations",
    "largest_remainder",
    "run_sweep",
    "scale_cluster",
]
