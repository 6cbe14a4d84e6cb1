"""The instructor's report (`make report`, dpc_instructor.report) on a small course built here: its numbers
are the course CSV's, its plots are PNG files, failure messages group modulo numbers and show escaped,
and the page renders in headless Chromium (fast: no grading, no kernel)."""
from __future__ import annotations

import base64
import csv
import datetime
import html.parser
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from dpc_instructor import gradebook, report

pytestmark = pytest.mark.gate  # tests/tiers.py

CHROMIUM = "/usr/bin/chromium"
PNG = b"\x89PNG\r\n\x1a\n"
# lab -> (notebook, {test cell: points})
LABS = {"01-alpha": ("alpha", {"lab01-test-load": 2, "lab01-test-batches": 3}),
        "02-beta": ("beta", {"lab02-test-sum": 4, "lab02-test-order": 1})}
DUE = datetime.datetime(2026, 1, 10, 12, 0)  # lab 2's due date (lab 1 has none)
SCRIPT = "ValueError: bad shard <script>alert('x')</script> & more"
# student -> lab -> {failed test cell: its error outputs (ename, evalue)}; None: not graded; absent: nothing handed in
CLASS: dict[str, dict[str, dict[str, list[tuple[str, str]]] | None]] = {
    "ann": {"01-alpha": {}, "02-beta": {}},
    "bob": {"01-alpha": {"lab01-test-batches": [("AssertionError", "expected 4 batches, got 3")]}, "02-beta": {}},
    "cid": {"01-alpha": {"lab01-test-batches": [("GraderCheck", "the values differ"),  # the kernel's error first
                                                ("AssertionError", "expected 4 batches, got 5")]},
            "02-beta": {"lab02-test-order": [("GraderCheck", "'order' is 0.25, the reference's 0.5")]}},
    "dee": {"01-alpha": {"lab01-test-load": [("ValueError", SCRIPT.split(": ", 1)[1])]}, "02-beta": None},
    "eve": {"01-alpha": {}, "02-beta": {}},  # lab 2 handed in late
    "fay": {"01-alpha": {}},
}
NAMES = {"fay": "Fay & <Co>"}
NOT_GRADED = "not graded: still running after 600 s (a cell that never ends?)"


def build(root: Path) -> gradebook.Course:
    """A course folder as `make grade` leaves it: gradebook.db, status.json, names.json, source/ and
    the graded notebooks with the failed test cells' errors."""
    import warnings

    from nbgrader.api import Gradebook

    course = gradebook.Course(root)
    statuses: dict[str, dict[str, dict]] = {}
    with warnings.catch_warnings(), Gradebook(course.db_url) as gb:
        warnings.simplefilter("ignore")  # SQLAlchemy's SAWarning in add_submission (as Course.record)
        for lab, (nb, cells) in LABS.items():
            gb.add_assignment(lab, duedate=DUE if lab == "02-beta" else None)
            gb.add_notebook(nb, lab)
            (root / "source" / lab).mkdir(parents=True)
            (root / "source" / lab / f"{nb}.ipynb").write_text(json.dumps(notebook(lab, {})))
            for gid, points in cells.items():
                gb.add_grade_cell(gid, nb, lab, max_score=points, cell_type="code")
        for sid, labs in CLASS.items():
            gb.add_student(sid)
            for lab, failed in labs.items():
                st = {"notes": [], "seconds": 1.0, "at": "2026-01-12 09:00:00", "seed": 7}
                if failed is None:
                    statuses.setdefault(sid, {})[lab] = {**st, "status": NOT_GRADED, "graded": False,
                                                         "graded_at": None}
                    continue
                statuses.setdefault(sid, {})[lab] = {**st, "status": "graded", "graded": True,
                                                     "graded_at": "2026-01-12 09:00:00"}
                late = sid == "eve" and lab == "02-beta"
                gb.add_submission(lab, sid, timestamp=DUE + datetime.timedelta(hours=27 if late else -20))
                nb, cells = LABS[lab]
                for gid, points in cells.items():
                    grade = gb.find_grade(gid, nb, lab, sid)
                    grade.auto_score, grade.needs_manual_grade = (0 if gid in failed else points), False
                graded = root / "autograded" / sid / lab
                graded.mkdir(parents=True)
                (graded / f"{nb}.ipynb").write_text(json.dumps(notebook(lab, failed)))
            gb.db.commit()
    (root / "status.json").write_text(json.dumps(statuses))
    (root / "names.json").write_text(json.dumps(NAMES))
    return course


def notebook(lab: str, failed: dict[str, list[tuple[str, str]]]) -> dict:
    """A (graded) notebook of lab: its test cells, the failed ones with their error outputs."""
    cells = [{"cell_type": "code", "id": gid, "execution_count": 1, "source": "assert True",
              "metadata": {"nbgrader": {"grade": True, "grade_id": gid, "locked": True, "points": points,
                                        "schema_version": 3, "solution": False, "task": False}},
              "outputs": [{"output_type": "error", "ename": e, "evalue": v, "traceback": [f"{e}: {v}"]}
                          for e, v in failed.get(gid, [])]}
             for gid, points in LABS[lab][1].items()]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[gradebook.Course, Path, dict, list[dict[str, str]]]:
    """The course, the report's folder, its report.json and the course CSV's rows."""
    tmp = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{gradebook.BIN}{os.pathsep}{os.environ['PATH']}")  # nbgrader's alembic
        course = build(tmp / "course")
        assert report.main(["--course", str(course.root), "--out", str(tmp / "report")]) == 0
    course.export(tmp / "grades.csv")
    with (tmp / "grades.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return course, tmp / "report", json.loads((tmp / "report" / "report.json").read_text()), rows


def test_the_numbers_are_the_csv_export_s(made):
    _, _, figures, rows = made
    totals = {(r["grader_id"], r["lab"]): r for r in rows if r["cell"] == "(lab total)"}
    graded = {(r["grader_id"], r["lab"]) for r in rows if r["status"] in ("graded", "needs manual grading")}
    for st in figures["students"]:
        course_total = next(r for r in rows if r["grader_id"] == st["grader_id"] and r["lab"] == "(course)")
        assert (st["points"], st["max_points"]) == (float(course_total["points"]), float(course_total["max_points"]))
        assert st["name"] == course_total["student"]
        for lab, mark in st["marks"].items():
            r = totals[st["grader_id"], lab]
            assert (mark["points"], mark["max_points"], mark["status"]) == (
                float(r["points"]), float(r["max_points"]), r["status"])
            assert mark["state"] == ("graded" if (st["grader_id"], lab) in graded else
                                     "no submission" if r["status"] == "no submission" else "not graded")
    assert {st["grader_id"] for st in figures["students"]} == {r["grader_id"] for r in rows} == set(CLASS)
    for lab in figures["labs"]:
        mine = [(sid, r) for (sid, name), r in totals.items() if name == lab["name"]]
        assert lab["scores"] == sorted(float(r["points"]) for sid, r in mine if (sid, lab["name"]) in graded)
        assert lab["max_points"] == float(mine[0][1]["max_points"])
        for c in lab["cells"]:
            cells = [r for r in rows if r["cell"] == c["name"] and r["status"] == "graded"]
            assert c["passed"] == sum(r["points"] == r["max_points"] for r in cells)
            assert c["failed"] == sum(r["points"] != r["max_points"] for r in cells)
    # and what the class above is: the grouped failures, late, not graded, nothing handed in
    alpha, beta = figures["labs"]
    assert alpha["scores"] == [2, 2, 3, 5, 5, 5] and beta["scores"] == [4, 5, 5, 5]
    assert [(alpha[k], beta[k]) for k in ("late", "not_graded", "no_submission")] == [(0, 1), (0, 1), (0, 1)]
    assert [(c["name"], c["passed"], c["failed"]) for c in alpha["cells"]] == [
        ("lab01-test-load", 5, 1), ("lab01-test-batches", 4, 2)]  # the gradebook's order
    assert [(f["pattern"], f["variants"], f["students"], f["cells"]) for f in alpha["failures"]] == [
        ("AssertionError: expected <n> batches, got <n>",
         ["AssertionError: expected 4 batches, got 3", "AssertionError: expected 4 batches, got 5"],
         ["bob", "cid"], ["lab01-test-batches"]),
        (SCRIPT, [SCRIPT], ["dee"], ["lab01-test-load"])]
    assert [f["variants"] for f in beta["failures"]] == [["GraderCheck: 'order' is 0.25, the reference's 0.5"]]
    eve = next(st for st in figures["students"] if st["grader_id"] == "eve")
    assert eve["marks"]["02-beta"]["late"] == 27 * 3600 and eve["marks"]["01-alpha"]["late"] == 0


class Tables(html.parser.HTMLParser):
    """Each table's rows (its cells' text), by the table's class."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.now: list[list[str]] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.now = self.tables.setdefault(dict(attrs).get("class") or "", [])
        elif tag == "tr" and self.now is not None:
            self.now.append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif self.cell is not None:
            self.cell.append(" ")  # <pre>, <span> inside a cell: words apart

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None and self.now is not None:  # its text, spaces collapsed
            self.now[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "table":
            self.now = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_the_page_shows_the_csv_s_numbers_escaped(made):
    _, out, _, rows = made
    text = (out / "index.html").read_text()
    parsed = Tables()
    parsed.feed(text)
    students = parsed.tables["tests students"]
    assert students[0] == ["student", *LABS, "total"]
    expected = []
    for sid in sorted(CLASS):
        mine = {r["lab"]: r for r in rows if r["grader_id"] == sid and r["cell"] in ("(lab total)", "(course total)")}
        line = [NAMES[sid] if sid in NAMES else sid]
        line[0] += f" ({sid})" if sid in NAMES else ""
        for lab in LABS:
            r = mine[lab]
            line.append("no submission" if r["status"] == "no submission" else "not graded"
                        if r["status"].startswith("not graded") else
                        f"{r['points']} / {r['max_points']}" + (" late" if (sid, lab) == ("eve", "02-beta") else ""))
        line.append(f"{mine['(course)']['points']} / {mine['(course)']['max_points']}")
        expected.append(line)
    assert students[1:] == expected
    failures = parsed.tables["tests failures"]
    assert failures[1][:2] == ["2", "AssertionError: expected 4 batches, got 3 and 1 more with other numbers"]
    assert failures[2][:2] == ["1", SCRIPT]  # the message whole, as text
    assert "<script" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in text
    assert "Fay &amp; &lt;Co&gt;" in text
    assert parsed.tables["tests cells"][1:3] == [["lab01-test-load", "2", "5", "1", "0", "83 %"],
                                                 ["lab01-test-batches", "3", "4", "2", "0", "67 %"]]


def test_every_plot_is_a_png_file_and_in_the_page(made):
    _, out, figures, _ = made
    text = (out / "index.html").read_text()
    plots = [out / name for lab in figures["labs"] for name in lab["plots"].values()]
    assert len(plots) == 2 * len(LABS)
    for path in plots:
        data = path.read_bytes()
        assert data[:8] == PNG and data[12:16] == b"IHDR", path
        width, height = struct.unpack(">II", data[16:24])
        assert width > 200 and height > 50, (path, width, height)
        assert f"data:image/png;base64,{base64.b64encode(data).decode()}" in text  # the page needs no file
        assert f"href='{path.name}'" in text


def test_the_page_renders_in_headless_chromium(made, tmp_path):
    if not Path(CHROMIUM).exists():  # make test installs it as root (src/dpc_setup/system.sh)
        if os.environ.get("CI"):
            pytest.fail(f"no {CHROMIUM}: make test's system step should have installed it")
        pytest.skip(f"no {CHROMIUM} to render the page (as root: apt-get install chromium)")
    _, out, _, _ = made
    shot = tmp_path / "report.png"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                           "--window-size=1280,2600", (out / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shot.exists(), done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == PNG and struct.unpack(">II", data[16:24]) == (1280, 2600)
    if os.environ.get("DPC_REPORT_SHOT"):  # keep it to look at
        shutil.copy(shot, os.environ["DPC_REPORT_SHOT"])
