"""Run every benchmark of ``bench/`` (each module with a ``main()``) and print its table."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    names = sorted(
        info.name
        for info in pkgutil.iter_modules([str(Path(__file__).parent)])
        if info.name.startswith("bench_")
    )
    only = set(sys.argv[1:])
    for name in names:
        if only and name not in only:
            continue
        module = importlib.import_module(f"bench.{name}")
        module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
