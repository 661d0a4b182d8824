"""Plans as people read them, for ``show``, ``compare``, ``simulate`` and the solve summary.

Each view builds a Document (``document.py``: sections of cells, no layout); ``render.py``
prints it as tables that fit the terminal, stacked rows when they do not, Markdown or JSON.
No torch.
"""

from autoplan.view.compare import compare_document, compare_rows
from autoplan.view.document import Document, Section
from autoplan.view.memory_bars import memory_section
from autoplan.view.plan_tables import (
    alternatives_section,
    breakdown_section,
    idle_section,
    overview_section,
    plan_document,
    replicas_text,
    stages_section,
)
from autoplan.view.render import FORMATS, OutputFormat, print_document
from autoplan.view.summary import solve_summary

__all__ = [
    "FORMATS",
    "Document",
    "OutputFormat",
    "Section",
    "alternatives_section",
    "breakdown_section",
    "compare_document",
    "compare_rows",
    "idle_section",
    "memory_section",
    "overview_section",
    "plan_document",
    "print_document",
    "replicas_text",
    "solve_summary",
    "stages_section",
]
