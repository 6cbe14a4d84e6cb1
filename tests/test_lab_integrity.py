"""Every lab's grading can only be changed by the cells a student is meant to change.

nbgrader restores, when it grades, the source of every cell whose nbgrader metadata says it is
locked or a test (grade) cell; any other cell runs as the student left it. So a cell the grader
relies on (parameters, imports, given code, harnesses, tests) must carry that metadata, whatever the
prose around it says. Checked on the single source, solutions/<lab>/*.ipynb (labs/ is generated from
it and `src/dpc_instructor/labs.py check` keeps the two in sync); nothing is executed.

The rule, cell by cell:
  * a markdown or raw cell is free: it never runs, so what a student writes there cannot change a
    grade;
  * a code cell has nbgrader metadata that makes it an answer cell (`solution`), a test cell
    (`grade`, with points > 0) or a locked cell (`locked`): exactly what nbgrader either leaves to
    the student or restores from the source;
  * the one exception is a free scratch cell for the student: a code cell tagged `scratch` that
    holds no code (only blank lines and comments), so no later cell can depend on what it does;
  * the papermill `parameters` cell is locked (not an answer, not a test): the grader runs the lab
    with the values of the source;
  * a solution cell is never also locked (nbgrader would treat it as an answer and restore nothing);
  * grade ids are unique within a notebook (nbgrader restores cells by grade id).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpc_runtime.notebook import nbgrader, source

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "solutions").glob("*/*.ipynb"))


def cells(rel: str) -> list[dict]:
    return json.loads((ROOT / rel).read_text())["cells"]


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def where(i: int, cell: dict) -> str:
    first = next((ln for ln in source(cell).splitlines() if ln.strip()), "")
    return f"cell {i} ({nbgrader(cell).get('grade_id') or first[:60]!r})"


def is_free_scratch(cell: dict) -> bool:
    """A code cell tagged `scratch` with nothing in it that runs."""
    return "scratch" in tags(cell) and all(
        not ln.strip() or ln.lstrip().startswith("#") for ln in source(cell).splitlines())


def test_every_lab_is_checked():
    assert LABS, "no lab notebooks in solutions/"


@pytest.mark.parametrize("rel", LABS)
def test_every_code_cell_is_an_answer_a_test_or_locked(rel):
    loose = []
    for i, cell in enumerate(cells(rel)):
        if cell["cell_type"] != "code":
            continue
        meta = nbgrader(cell)
        if not any(meta.get(k) for k in ("solution", "grade", "locked")) and not is_free_scratch(cell):
            loose.append(where(i, cell))
    assert not loose, (f"{rel}: code cells without nbgrader metadata (a student's edits there survive "
                       f"grading); make them locked, a test or an answer: {loose}")


@pytest.mark.parametrize("rel", LABS)
def test_parameters_cell_is_locked(rel):
    tagged = [(i, c) for i, c in enumerate(cells(rel)) if "parameters" in tags(c)]
    assert tagged, f"{rel}: no cell tagged 'parameters'"
    for i, cell in tagged:
        meta = nbgrader(cell)
        assert meta.get("locked") is True and not meta.get("solution") and not meta.get("grade"), (
            f"{rel}: {where(i, cell)} is tagged 'parameters' but is not a locked cell: {meta}")


@pytest.mark.parametrize("rel", LABS)
def test_grade_ids_are_unique_and_present(rel):
    seen: dict[str, int] = {}
    for i, cell in enumerate(cells(rel)):
        meta = nbgrader(cell)
        if not meta:
            continue
        gid = meta.get("grade_id")
        assert gid, f"{rel}: {where(i, cell)} has nbgrader metadata but no grade_id"
        assert gid not in seen, f"{rel}: grade_id {gid!r} of cell {i} is already cell {seen[gid]}'s"
        seen[gid] = i


@pytest.mark.parametrize("rel", LABS)
def test_grade_cells_have_points_and_answers_are_not_locked(rel):
    for i, cell in enumerate(cells(rel)):
        meta = nbgrader(cell)
        if meta.get("grade"):
            points = meta.get("points")
            assert isinstance(points, (int, float)) and points > 0, (
                f"{rel}: {where(i, cell)} is a grade cell worth {points!r} points")
        if meta.get("solution"):
            assert not meta.get("locked"), f"{rel}: {where(i, cell)} is both an answer and locked"


@pytest.mark.parametrize("rel", LABS)
def test_nbgrader_accepts_the_metadata(rel):
    """nbgrader's own schema check (types, required keys, cell types), as generate_assignment does."""
    import nbformat
    from nbgrader.nbgraderformat import MetadataValidator

    MetadataValidator().validate_nb(nbformat.read(ROOT / rel, as_version=4))
