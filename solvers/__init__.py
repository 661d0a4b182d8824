"""Optimisation algorithms on plain numbers: no torch, no autoplan.

- ``partition_dp``: exact dynamic programming over contiguous layer partitions of a pipeline.
- ``share_ilp``: an integer program (PuLP) for uneven data-parallel batch shares.
- ``oracle``: brute-force enumeration of the same spaces, for tests on small instances.
"""

from solvers.partition_dp import PartitionResult, StageCost, best_partition, pipeline_objective
from solvers.share_ilp import ShareClass, ShareProblem, ShareSolution, solve_shares

__all__ = [
    "PartitionResult",
    "ShareClass",
    "ShareProblem",
    "ShareSolution",
    "StageCost",
    "best_partition",
    "pipeline_objective",
    "solve_shares",
]
