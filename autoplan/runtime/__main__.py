"""``python -m autoplan.runtime plan.json [--steps N] [--report PATH] [--seed S] [--executor E]
[--data FILE [--data-dtype D] [--no-shuffle]] [--checkpoint-dir DIR [--save-every N] [--resume]]
[--trust-factory | --factory F]``.

Every rank reads the plan, checks the launch against it, trains, and rank 0 writes the report.
A plan or launch that cannot run is one line on stderr and exit code 2, before any training.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.checks import check_factory_trust
from autoplan.errors import AutoplanError, InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.runtime.launch_check import LaunchEnv, check_launch

if TYPE_CHECKING:  # imported where used: they import torch
    from autoplan.runtime.checkpoint import CheckpointConfig
    from autoplan.runtime.token_data import TokenSource

# The token dtypes, repeated here so that --help and a bad launch need no torch import (a
# test checks they agree with token_data.TOKEN_DTYPES).
TOKEN_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")

__all__ = ["main"]

EXIT_BAD_INPUT = 2


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m autoplan.runtime", description="Train a plan (run under torchrun)."
    )
    parser.add_argument("plan", type=Path, help="Plan JSON written by `autoplan solve`.")
    parser.add_argument("--steps", type=int, default=10, help="Training steps (default 10).")
    parser.add_argument("--report", type=Path, help="Where rank 0 writes the run report JSON.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of weights and data.")
    parser.add_argument(
        "--executor",
        choices=("auto", "mesh", "groups"),
        default="auto",
        help="'mesh' (one DeviceMesh, torch's pipelining; uniform plans), 'groups' (per-stage "
        "process groups; any plan) or 'auto' (mesh when the plan is uniform; the default).",
    )
    parser.add_argument(
        "--trust-factory",
        action="store_true",
        help="Run a plan whose model is a factory ('package.module:callable'): import and call "
        "the code it names.",
    )
    parser.add_argument(
        "--factory", help="The factory you expect the plan to name (trusts that one only)."
    )
    add_data_and_checkpoint_arguments(parser)
    parser.add_argument("--verbose", "-v", action="store_true", help="Log each step (rank 0).")
    return parser.parse_args(argv)


def add_data_and_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The token-file and checkpoint options (``token_data``, ``checkpoint``)."""
    parser.add_argument(
        "--data",
        type=Path,
        help="Token file to train on: .npy or raw .bin of token ids (default: synthetic data).",
    )
    parser.add_argument(
        "--data-dtype",
        choices=TOKEN_DTYPES,
        help="The ids' dtype in a .bin (default: uint16 when the vocabulary fits, else uint32).",
    )
    parser.add_argument(
        "--no-shuffle",
        action="store_true",
        help="Read the samples in file order (default: a seeded permutation per epoch).",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="Save checkpoints (DCP) here: step-NNNNNNNN/ folders."
    )
    parser.add_argument(
        "--save-every", type=int, help="Save every N steps (default: after the last step only)."
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="Start from the latest checkpoint in --checkpoint-dir (any plan of the same model, "
        "dtype and batch may have saved it); --steps counts from the start of training.",
    )


def data_and_checkpoint(
    args: argparse.Namespace,
) -> tuple[TokenSource | None, CheckpointConfig | None]:
    """The parsed options as ``train``'s ``data`` and ``checkpoint`` (imports torch)."""
    from autoplan.runtime.checkpoint import CheckpointConfig
    from autoplan.runtime.token_data import TokenSource

    if args.data is None and (args.data_dtype is not None or args.no_shuffle):
        raise InputError("--data-dtype and --no-shuffle describe a --data file; give one")
    if args.checkpoint_dir is None and (args.save_every is not None or args.resume):
        raise InputError("--save-every and --resume need --checkpoint-dir")
    folder = args.checkpoint_dir
    if folder is not None and folder.exists() and not folder.is_dir():
        raise InputError(f"--checkpoint-dir {printable(str(folder))}: is a file; give a folder")
    data = (
        None
        if args.data is None
        else TokenSource(args.data, args.data_dtype, shuffle=not args.no_shuffle)
    )
    checkpoint = (
        None
        if args.checkpoint_dir is None
        else CheckpointConfig(args.checkpoint_dir, args.save_every, args.resume)
    )
    return data, checkpoint


def main(argv: list[str] | None = None) -> int:
    """Run one rank; returns the process exit code."""
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        plan = read_json_model(args.plan, Plan)
        # A plan from elsewhere runs no code of its own choosing (run and launch pass
        # --factory once the user has trusted it).
        check_factory_trust(
            plan.inputs.model.name,
            trusted=args.trust_factory,
            named=args.factory,
            source="the plan",
            action="training",
        )
        env = LaunchEnv.from_environ().in_plan(plan)
        # Checked here first, before torch is even imported, so a wrong launch fails fast.
        check_launch(plan, env)
        data, checkpoint = data_and_checkpoint(args)
        from autoplan.runtime.trainer import train

        report = train(
            plan,
            args.steps,
            seed=args.seed,
            executor=args.executor,
            data=data,
            checkpoint=checkpoint,
        )
    except AutoplanError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        _leave_process_groups()
        return EXIT_BAD_INPUT
    if env.rank == 0 and args.report is not None:
        write_json_model(args.report, report)
    _leave_process_groups()
    return 0


def _leave_process_groups() -> None:
    if "torch.distributed" in sys.modules:  # else no group was ever made
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    exit_code = main()
    if "torch.distributed" in sys.modules:
        # Training ran: end without the interpreter's teardown (mesh.exit_process says why).
        from autoplan.runtime.world import exit_process

        exit_process(exit_code)
    sys.exit(exit_code)
