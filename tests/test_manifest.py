"""course.yml, read through dpc_runtime.manifest: the chapters and their labs, slow cells, ranks;
the chapter tables of the README, chapter 0 and chapter 1 agree with it."""
from __future__ import annotations

import json
import re

import pytest
from gradekit import ROOT

from dpc_runtime import manifest

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_chapters_are_numbered_in_order_and_pair_with_existing_labs():
    chapters = manifest.chapters()
    assert [c.number for c in chapters] == list(range(len(chapters)))
    for c in chapters:
        assert c.slug.startswith(f"{c.number:02d}-"), c
        if c.lab:
            assert c.lab.startswith(f"{c.number:02d}-"), f"lab {c.lab} must follow chapter {c.number}"
            assert (ROOT / "solutions" / c.lab).is_dir() and (ROOT / "labs" / c.lab).is_dir(), c.lab
    labs = {p.name for p in (ROOT / "solutions").iterdir() if p.is_dir()}
    assert labs == {c.lab for c in chapters if c.lab}, "every lab follows exactly one chapter"


def test_ranks_and_slow_cells_per_lab():
    assert manifest.lab_ranks("07-ddp-syncbn") == 2 and manifest.lab_ranks("01-input-pipeline") == 1
    assert manifest.lab_ranks("no-such-lab") == 1
    assert manifest.slow_cells()["lab07-run"] == 300


def test_cell_timeout_by_grade_id_and_default(monkeypatch):
    cell = {"metadata": {"nbgrader": {"grade_id": "lab07-run"}}}
    assert manifest.cell_timeout(cell) == 300
    monkeypatch.delenv("DPC_CELL_TIMEOUT", raising=False)
    assert manifest.cell_timeout({"metadata": {}}) == manifest.DEFAULT_CELL_TIMEOUT
    monkeypatch.setenv("DPC_CELL_TIMEOUT", "45")
    assert manifest.cell_timeout({"metadata": {"tags": ["slow"]}}) == 45  # tags never count


def test_a_lab_with_two_notebooks_is_one_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "course.yml"
    path.write_text("solutions/05-x/a.ipynb: {ranks: 2}\nsolutions/05-x/b.ipynb: {ranks: 3}\n")
    monkeypatch.setattr(manifest, "MANIFEST", path)
    with pytest.raises(KeyError, match="2 notebooks for lab '05-x'"):
        manifest.lab_settings("05-x")


def rows(markdown: str) -> dict[int, str]:
    """The rows of the chapter table in a markdown text: chapter number -> the whole row."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^\| (\d+) \|.*$", markdown, re.M)}


def markdown_of(notebook: str) -> str:
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("where", ["README.md", "course/00-setup-and-devices.ipynb",
                                   "course/01-why-several-devices.ipynb"])
def test_chapter_tables_agree_with_the_manifest(where):
    text = (ROOT / where).read_text() if where.endswith(".md") else markdown_of(where)
    table = rows(text)
    chapters = manifest.chapters()
    assert sorted(table) == [c.number for c in chapters], f"{where}: one row per chapter of course.yml"
    for c in chapters:
        row = table[c.number]
        assert c.slug in row, f"{where}: the row of chapter {c.number} must name {c.slug}"
        if c.lab:
            assert c.lab in row or re.search(rf"\blab {c.number}\b", row), (
                f"{where}: chapter {c.number}'s row must name its lab {c.lab}")
        else:
            assert row.rstrip().endswith("| — |"), f"{where}: chapter {c.number} has no lab in course.yml"
