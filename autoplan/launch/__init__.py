"""Launch files for a plan: per-node torchrun commands and a Slurm batch script (torch-free)."""

from autoplan.launch.slurm import slurm_script
from autoplan.launch.torchrun import NodeLaunch, node_launches, shell_line, torchrun_argv

__all__ = ["NodeLaunch", "node_launches", "shell_line", "slurm_script", "torchrun_argv"]
