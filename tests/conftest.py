"""Property tests draw the same examples on every run: a suite that passes once passes again
(``derandomize``), and no example database is written beside the code."""

from hypothesis import settings

settings.register_profile("autoplan", derandomize=True, database=None)
settings.load_profile("autoplan")


# The slowest files, slowest first (single-core seconds measured with ``--durations`` on this
# project's 2-core machine, 2026-12-06): run first, so that two workers finish together. With
# pytest-xdist's ``--dist loadfile`` a file is one unit of work, handed out in collection
# order (the Makefile turns off xdist's own reorder, which puts files with the most tests
# first and left the solver oracle, ~200 s in a few tests, running alone at the end).
SLOWEST_FIRST = (
    "test_solver_oracle.py",
    "test_readme_commands.py",
    "test_context_parallel_runtime.py",
    "test_launch.py",
    "test_search_bounds_oracle.py",
    "test_sequence_parallel_oracle.py",
    "test_runtime_distributed.py",
    "test_expert_parallel_cost.py",
    "test_runtime_solved.py",
    "test_context_parallel_oracle.py",
    "test_runtime_sequence_parallel.py",
    "test_offload_runtime.py",
)


def pytest_collection_modifyitems(items: list) -> None:
    """The files of ``SLOWEST_FIRST`` first, in its order; every other file after them, and
    the tests of each file, in the order collected."""
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
