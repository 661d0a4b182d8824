"""What a view says, apart from how it is laid out: a titled list of sections of cells.

The plan viewers (``show``, ``compare``, ``simulate``, the solve summary) build a Document;
``autoplan.view.render`` lays it out as a rich table that fits the terminal, as stacked
key–value rows when it does not, as Markdown or as JSON. Cells are text; a cell may be a rich
``Text`` (a coloured memory bar) in columns marked ``text_only``, which only the terminal
layouts show. A ``Figure`` cell is text that also carries its number and unit, so that JSON
output gives numbers (``{"fwd_ms": 117.2}``) where the tables show '117 ms'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text

__all__ = ["Cell", "Document", "Figure", "Section", "cell_text"]


class Figure(str):
    """A cell's text (``str``: shown as it is) with the number it stands for, in ``unit``
    ('ms', 'bytes', 'fraction', 'per_s'; '' for a plain number), for JSON output."""

    value: float | int
    unit: str

    def __new__(cls, text: str, value: float | int, unit: str) -> Figure:
        figure = super().__new__(cls, text)
        figure.value = value
        figure.unit = unit
        return figure


Cell = str | Text


def cell_text(cell: Cell) -> str:
    """The plain text of a cell."""
    return cell.plain if isinstance(cell, Text) else cell


@dataclass
class Section:
    """A titled table. ``key_value`` sections have two columns (what, value) and no header;
    ``right`` holds the indices of right-aligned columns; ``row_styles`` a rich style per row
    ('' for none); ``note`` a line printed under the table (``text_note``: a further one only
    the terminal layouts print, about the ``text_only`` columns); ``heading_columns`` how many
    leading columns name a row in the stacked layout (e.g. 'rank 0 · GPU A100 · tp 1')."""

    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    key_value: bool = False
    right: frozenset[int] = frozenset()
    text_only: frozenset[int] = frozenset()
    row_styles: list[str] = field(default_factory=list)
    note: str = ""
    text_note: str = ""
    heading_columns: int = 1

    def add(self, *cells: Cell, style: str = "") -> None:
        """Append a row (as many cells as columns)."""
        if len(cells) != len(self.columns):
            raise ValueError(
                f"{len(cells)} cells for the {len(self.columns)} columns of {self.title}"
            )
        self.rows.append(list(cells))
        self.row_styles.append(style)


@dataclass
class Document:
    """A view: a title and its sections, in order."""

    title: str
    sections: list[Section] = field(default_factory=list)
