"""Import direction: the solve path never needs torch; only the runtime talks torch.distributed.

DESIGN.md's rule: ``solvers`` knows nothing of torch or of autoplan's CLI; the solve path
(autoplan.cluster, autoplan.cost, autoplan.solve, autoplan.plan, solvers, and ``autoplan solve``)
imports without torch; ``autoplan.runtime`` is the only part that imports torch.distributed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Packages walked recursively, every module imported with torch blocked.
TORCH_FREE_PACKAGES = [
    "solvers",
    "autoplan.cluster",
    "autoplan.cost",
    "autoplan.solve",
    "autoplan.plan",
    "autoplan.export",
    "autoplan.sweep",
]
# Single modules on the solve path (autoplan.profile as a whole holds the profiler, which needs
# torch; the solver reads only its schema). The solve command pulls in autoplan.cli, i.e. every
# command module: they must import torch lazily, inside the commands that need it.
TORCH_FREE_MODULES = [
    "autoplan.errors",
    "autoplan.files",
    "autoplan.profile.schema",
    "autoplan.cli.solve_cmd",
    "autoplan.cli.export_cmd",
    "autoplan.cli",
    # The Python API imports torch only inside api.profile.
    "autoplan.api",
]

# torch.distributed._tools holds single-process tools (MemTracker for the profiler's memory
# figures): no process group, no communication. Everything else in torch.distributed is the
# runtime's alone.
ALLOWED_OUTSIDE_RUNTIME = ("torch.distributed._tools",)

_BLOCKED_IMPORT_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "torch" or fullname.startswith("torch."):
                raise ImportError(f"torch is blocked on the solve path (importing {fullname})")
            return None

    sys.meta_path.insert(0, BlockTorch())
    imported = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        imported.append(name)
        for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
            importlib.import_module(info.name)
            imported.append(info.name)
    for name in MODULES:
        importlib.import_module(name)
        imported.append(name)
    assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch loaded"
    print(len(imported), " ".join(imported))
    """
)


def test_solve_path_imports_with_torch_blocked() -> None:
    script = (
        f"PACKAGES = {TORCH_FREE_PACKAGES!r}\nMODULES = {TORCH_FREE_MODULES!r}\n"
        + _BLOCKED_IMPORT_SCRIPT
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    count, _, names = result.stdout.strip().partition(" ")
    imported = names.split()
    # The walk really reached the modules, not just empty packages.
    assert int(count) == len(imported)
    assert "autoplan.cluster.catalog" in imported
    assert "autoplan.plan.validate" in imported
    assert any(name.startswith("autoplan.cost.") for name in imported)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in a source file, ``from a import b`` as ``a.b``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def _sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py"))


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_runtime_imports_torch_distributed() -> None:
    runtime = REPO / "autoplan" / "runtime"
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _sources("autoplan", "solvers")
        if runtime not in path.parents
        for line, module in _imported_modules(path)
        if _is_under(module, "torch.distributed")
        and not any(_is_under(module, allowed) for allowed in ALLOWED_OUTSIDE_RUNTIME)
    ]
    assert offenders == []


def test_solvers_import_neither_torch_nor_the_cli() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _sources("solvers")
        for line, module in _imported_modules(path)
        if _is_under(module, "torch") or _is_under(module, "autoplan.cli")
    ]
    assert offenders == []


def test_the_scan_sees_imports_in_every_form(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "import torch.distributed as dist\n"
        "from torch import distributed\n"
        "from torch.distributed.pipelining import PipelineStage\n"
        "def late():\n    import torch.distributed.fsdp\n"
    )
    modules = [module for _, module in _imported_modules(source)]
    assert all(_is_under(module, "torch.distributed") for module in modules)
    assert len(modules) == 4
