"""nbgrader's side of a notebook, read in one place: a cell's nbgrader metadata, grade id and text.

(The answer and hidden-test markers are the instructor's business: dpc_instructor.markers reads them.)"""
from __future__ import annotations

from typing import Any

Cell = dict[str, Any]


def nbgrader(cell: Cell) -> dict[str, Any]:
    """The cell's nbgrader metadata ({} for a cell nbgrader does not manage)."""
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def grade_id(cell: Cell) -> str | None:
    """The cell's nbgrader grade id, or None."""
    return nbgrader(cell).get("grade_id")


def source(cell: Cell) -> str:
    """The cell's text (nbformat stores it as one string or a list of lines)."""
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def by_grade_id(nb: dict[str, Any]) -> dict[str, Cell]:
    """The notebook's cells that have a grade id, by grade id."""
    return {gid: c for c in nb["cells"] if (gid := grade_id(c))}
