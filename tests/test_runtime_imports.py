"""autoplan.runtime's modules import each other without a cycle, not even inside functions.

A cycle hidden in a function-level import (``check`` and ``async_pb``, now ``async_stage``,
once imported each other so) works until someone moves the import to the top; this test reads
every import statement of the package's modules, wherever it sits, and looks for a cycle among
them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import autoplan.runtime

PACKAGE = "autoplan.runtime"
ROOT = Path(autoplan.runtime.__file__).parent


def _module_names() -> set[str]:
    names = {f"{PACKAGE}.{path.stem}" for path in ROOT.glob("*.py") if path.stem != "__init__"}
    return names | {PACKAGE}


def _path(module: str) -> Path:
    return ROOT / "__init__.py" if module == PACKAGE else ROOT / f"{module.split('.')[-1]}.py"


def _imports(module: str, modules: set[str]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(_path(module).read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            # ``from autoplan.runtime import tensor_parallel`` imports the submodule.
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= subs & modules or ({node.module} & modules)
    return found - {module}


def import_graph() -> dict[str, set[str]]:
    """Each runtime module's imports of other runtime modules."""
    modules = _module_names()
    return {module: _imports(module, modules) for module in sorted(modules)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (first repeated last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_runtime_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_function_level_cycle() -> None:
    graph = import_graph()
    # The edge check -> async_stage plus a function-level async_stage -> check, as once written.
    graph["autoplan.runtime.async_stage"] = graph["autoplan.runtime.async_stage"] | {
        "autoplan.runtime.check"
    }
    graph["autoplan.runtime.check"] = graph["autoplan.runtime.check"] | {
        "autoplan.runtime.async_stage"
    }
    cycle = find_cycle(graph)
    assert cycle is not None
    assert {"autoplan.runtime.check", "autoplan.runtime.async_stage"} <= set(cycle)


def test_function_level_imports_are_read() -> None:
    # trainer imports the executors only when it picks one: those edges must be seen.
    graph = import_graph()
    assert "autoplan.runtime.mesh_executor" in graph["autoplan.runtime.trainer"]
    assert "autoplan.runtime.trainer" in graph[PACKAGE]
