"""Import direction: the solve path never needs torch; only the runtime talks torch.distributed.

The rule of the README's Layout section: ``solvers`` knows nothing of torch or of autoplan's
CLI; the solve path (autoplan.cluster, autoplan.cost, autoplan.solve, autoplan.price,
autoplan.plan, autoplan.schedule, solvers, and ``autoplan solve``) imports without torch;
``autoplan.runtime`` is the only part that imports torch.distributed.

The path a plan travels is profile → solve → plan → run, with cost and schedule beneath: the
plan package is the contract alone, so nothing under ``autoplan.plan`` imports the cost model,
the search or the pricing that read it (``autoplan.cost``, ``autoplan.solve``,
``autoplan.price``); ``autoplan.schedule`` (schedules as data) imports nothing of autoplan but
itself and the error family.
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
    "autoplan.price",
    "autoplan.schedule",
    "autoplan.export",
    "autoplan.sweep",
]
# Single modules on the solve path (autoplan.profile as a whole holds the profiler, which needs
# torch; the solver reads only its schema). The solve command pulls in autoplan.cli, i.e. every
# command module: they must import torch lazily, inside the commands that need it.
TORCH_FREE_MODULES = [
    "autoplan.errors",
    "autoplan.files",
    "autoplan.inputs",
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


def _module_name(path: Path) -> str:
    """The dotted name a source file under REPO imports as (a package's ``__init__`` as the
    package)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, name: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import in a source file, those inside functions included,
    ``from a import b`` as ``a.b`` and relative imports resolved against the file's package
    (the file imports as ``name``, by default its place under REPO, else its stem)."""
    found: list[tuple[int, str]] = []
    name = name or (_module_name(path) if REPO in path.parents else path.stem)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
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


def test_the_scan_resolves_relative_imports(tmp_path: Path) -> None:
    # A file of the plan package: ``from ..cost import model`` is autoplan.cost.model.
    source = tmp_path / "sample.py"
    source.write_text("from ..cost import model\ndef late():\n    from .schema import Plan\n")
    modules = [module for _, module in _imported_modules(source, "autoplan.plan.sample")]
    assert modules == ["autoplan.cost.model", "autoplan.plan.schema.Plan"]


def _autoplan_imports(folder: str) -> list[tuple[str, str]]:
    """("file:line", module) for every autoplan module a folder's sources import."""
    return [
        (f"{path.relative_to(REPO)}:{line}", module)
        for path in _sources(folder)
        for line, module in _imported_modules(path)
        if _is_under(module, "autoplan")
    ]


def test_plan_imports_neither_cost_nor_solve() -> None:
    above = ("autoplan.cost", "autoplan.solve", "autoplan.price")
    imports = _autoplan_imports("autoplan/plan")
    offenders = [
        f"{where} imports {module}"
        for where, module in imports
        if any(_is_under(module, package) for package in above)
    ]
    assert offenders == []
    # The scan saw the plan package's own imports (its schema reads the schedule names).
    assert any(_is_under(module, "autoplan.schedule.names") for _, module in imports)


def test_schedule_imports_nothing_above_it() -> None:
    allowed = ("autoplan.schedule", "autoplan.errors")
    imports = _autoplan_imports("autoplan/schedule")
    offenders = [
        f"{where} imports {module}"
        for where, module in imports
        if not any(_is_under(module, package) for package in allowed)
    ]
    assert offenders == []
    assert any(_is_under(module, "autoplan.errors") for _, module in imports)


def _type_checking_imports(tree: ast.Module) -> set[int]:
    """Lines of imports under ``if TYPE_CHECKING:``: annotations only (every module has
    ``from __future__ import annotations``), never run, so no edge of the import graph."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def import_graph(folders: tuple[str, ...] = ("autoplan", "solvers")) -> dict[str, set[str]]:
    """Each module's imports of the other modules of ``folders``, wherever in its file the
    import sits; ``from package import name`` is the submodule when ``name`` is one, else the
    package's ``__init__``."""
    paths = {_module_name(path): path for path in _sources(*folders)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        skipped = _type_checking_imports(ast.parse(path.read_text()))
        targets: set[str] = set()
        for line, module in _imported_modules(path):
            while module and module not in paths:
                module = module.rpartition(".")[0]
            if module and module != name and line not in skipped:
                targets.add(module)
        graph[name] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert import_cycles(graph) == []
    # The graph holds the function-level edges too: the CLI imports commands' modules late.
    assert "autoplan.price.staleness" in graph["autoplan.cli.validate_cmd"]


def test_the_cycle_finder_sees_a_function_level_cycle() -> None:
    graph = import_graph()
    # The cost model importing the emitter in a function would close emit -> cost -> emit.
    graph["autoplan.cost.model"] = graph["autoplan.cost.model"] | {"autoplan.solve.emit"}
    cycles = import_cycles(graph)
    assert len(cycles) == 1
    assert {"autoplan.solve.emit", "autoplan.cost.model"} <= set(cycles[0])


def test_type_checking_imports_are_no_edge() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import b\nimport c\n"
    assert _type_checking_imports(ast.parse(source)) == {3}
