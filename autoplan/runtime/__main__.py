"""``python -m autoplan.runtime plan.json [--steps N] [--report PATH] [--seed S] [--executor E]
[--trust-factory | --factory F]``.

Every rank reads the plan, checks the launch against it, trains, and rank 0 writes the report.
A plan or launch that cannot run is one line on stderr and exit code 2, before any training.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from autoplan.checks import check_factory_trust
from autoplan.errors import AutoplanError
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.launch_check import LaunchEnv, check_launch

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
    parser.add_argument("--verbose", "-v", action="store_true", help="Log each step (rank 0).")
    return parser.parse_args(argv)


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
        from autoplan.runtime.trainer import train

        report = train(plan, args.steps, seed=args.seed, executor=args.executor)
    except AutoplanError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import torch.distributed as dist

    if env.rank == 0 and args.report is not None:
        write_json_model(args.report, report)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
