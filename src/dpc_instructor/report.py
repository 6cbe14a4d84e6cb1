"""The instructor's report on the course gradebook: per lab scores, pass rates, frequent failures; per student.

    python -m dpc_instructor.report [--course DIR] [--out DIR]                          (make report)

Writes OUT (default build/report): index.html, one page that reads from the file alone (its plots are
in it as data URIs), the same plots as PNG files beside it (<lab>-scores.png: how many students got
each score, out of the lab's total; <lab>-cells.png: each test cell's pass rate) and report.json,
every figure the page shows. Per lab: the graded students' scores, each test cell's pass rate, the
most frequent failure messages (the error a failed test cell shows, as in `make feedback`; numbers
are masked to group them, so "got 3" and "got 5" are one mistake) with how many students got each,
and how many were late, not graded or handed nothing in; then one line per student across the labs.
The points, statuses and totals are the course CSV's (`make grades`: gradebook.Course.rows); late
is nbgrader's: a submission's timestamp after its lab's due date (`nbgrader db assignment add <lab>
--duedate=...`, run inside the gradebook's folder: the guide's book/guide/due-dates.md).
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpc_instructor import gradebook
from dpc_runtime import notebook

DEFAULT_OUT = gradebook.ROOT / "build" / "report"
TOP = 10  # failure messages shown per lab
GRADED = ("graded", "needs manual grading")  # a cell row's status where the gradebook holds a grade
# A number standing alone (not the 32 of float32): sign, decimals, exponent or hex; "got 3." ends a sentence.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?!\w|\.\d)")
NO_MESSAGE = "(the graded notebook shows no error for this test cell)"


@dataclass
class Mark:
    """One student's lab, as the course CSV has it (plus late)."""

    points: float
    max_points: float
    state: str  # "graded", "not graded" (handed in, the grader could not) or "no submission"
    status: str  # the CSV's status of the lab
    late: float = 0.0  # seconds after the lab's due date (0: on time, or no due date)

    def shown(self) -> str:
        """What the students' table shows: points / total, or the state."""
        return f"{self.points:g} / {self.max_points:g}" if self.state == "graded" else self.state


@dataclass
class Cell:
    """One test cell of a lab: how many graded students passed it (full points)."""

    name: str
    max_points: float
    passed: int = 0
    failed: int = 0
    manual: int = 0  # needs manual grading

    def rate(self) -> float | None:
        """Passed out of graded (None when nobody was graded)."""
        n = self.passed + self.failed + self.manual
        return self.passed / n if n else None



@dataclass
class Failure:
    """One failure message of a lab (numbers masked): the students who got it, in which test cells."""

    pattern: str  # the message with its numbers masked (<n>)
    variants: list[str] = field(default_factory=list)  # the messages grouped here, whole, first seen first
    students: list[str] = field(default_factory=list)  # grader ids
    cells: list[str] = field(default_factory=list)


@dataclass
class Lab:
    """One lab's figures."""

    name: str
    max_points: float
    scores: list[float]  # the graded students' points, lowest first
    not_graded: int
    no_submission: int
    late: int
    cells: list[Cell]
    failures: list[Failure]  # the TOP most frequent, most students first
    plots: dict[str, str] = field(default_factory=dict)  # "scores", "cells" -> PNG file name in OUT


@dataclass
class Student:
    """One student across the labs (the CSV's course total)."""

    grader_id: str
    name: str
    marks: dict[str, Mark]  # by lab
    points: float
    max_points: float


def late(course: gradebook.Course) -> dict[tuple[str, str], float]:
    """Seconds late of each submission handed in after its lab's due date, by (grader id, lab)."""
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        return {(s.student.id, a.name): float(s.total_seconds_late) for a in gb.assignments
                for s in a.submissions if s.total_seconds_late > 0}


def messages(course: gradebook.Course, student: str, lab: str) -> dict[str, str]:
    """The error each test cell of a student's graded lab shows, by grade id, as `make feedback` shows it
    (name: message); the kernel's error before the grader's own check (GraderCheck), which follows from it."""
    found: dict[str, str] = {}
    for name in sorted(p.stem for p in (course.root / "source" / lab).glob("*.ipynb")):
        data = course.graded(student, lab, name)
        try:
            nb = json.loads(data.decode("utf-8")) if data is not None else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            nb = None
        if not isinstance(nb, dict):
            continue
        for gid, cell in notebook.by_grade_id(nb).items():
            errors = sorted((o for o in cell.get("outputs", []) if o.get("output_type") == "error"),
                            key=lambda o: o.get("ename") == "GraderCheck")
            if errors:
                found[gid] = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"
    return found


@dataclass
class Rows:
    """The course CSV's rows sorted out (sort_rows): every student's line and marks, each lab's total
    points and test cells, each student's test cells' rows of a lab."""

    students: dict[str, Student] = field(default_factory=dict)  # grader id -> its line
    totals: dict[str, float] = field(default_factory=dict)  # lab -> its total points
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)  # lab -> test cell -> its figures
    rows_of: dict[tuple[str, str], list[dict[str, str]]] = field(default_factory=dict)  # (grader id, lab) -> rows


def sort_rows(course: gradebook.Course) -> Rows:
    """The course CSV's rows (gradebook.Course.rows) by student, lab and test cell; every lab's mark."""
    lateness = late(course)
    got = Rows()
    for r in course.rows():
        sid, lab = r["grader_id"], r["lab"]
        st = got.students.setdefault(sid, Student(sid, r["student"], {}, 0.0, 0.0))
        if lab == "(course)":
            st.points, st.max_points = float(r["points"]), float(r["max_points"])
        elif r["cell"] == "(lab total)":
            got.totals[lab] = float(r["max_points"])
            rows = got.rows_of.get((sid, lab), [])
            graded = any(c["status"] in GRADED for c in rows) if rows else r["status"].startswith("graded")
            state = "graded" if graded else "no submission" if r["status"] == "no submission" else "not graded"
            st.marks[lab] = Mark(float(r["points"]), float(r["max_points"]), state, r["status"],
                                 lateness.get((sid, lab), 0.0) if graded else 0.0)
        else:
            got.cells.setdefault(lab, {}).setdefault(r["cell"], Cell(r["cell"], float(r["max_points"])))
            got.rows_of.setdefault((sid, lab), []).append(r)
    return got


def failed_cells(rows: Rows, sid: str, lab: str) -> list[str]:
    """The test cells of lab that student sid failed, each of its cells counted in its figures."""
    failed = []
    for r in rows.rows_of.get((sid, lab), []):
        c = rows.cells[lab][r["cell"]]
        if r["status"] == "needs manual grading":
            c.manual += 1
        elif float(r["points"]) == c.max_points:
            c.passed += 1
        else:
            c.failed += 1
            failed.append(r["cell"])
    return failed


def lab_failures(course: gradebook.Course, rows: Rows, lab: str) -> list[Failure]:
    """lab's most common failure messages (TOP, numbers alike), counting its cells' figures on the way."""
    failures: dict[str, Failure] = {}
    for st in rows.students.values():
        if st.marks[lab].state != "graded":
            continue
        failed = failed_cells(rows, st.grader_id, lab)
        said = messages(course, st.grader_id, lab) if failed else {}
        for gid in failed:
            text = said.get(gid, NO_MESSAGE)
            f = failures.setdefault(NUMBER.sub("<n>", text), Failure(NUMBER.sub("<n>", text)))
            for items, item in ((f.variants, text), (f.students, st.grader_id), (f.cells, gid)):
                if item not in items:
                    items.append(item)
    return sorted(failures.values(), key=lambda f: (-len(f.students), f.pattern))[:TOP]


def figures(course: gradebook.Course) -> tuple[list[Lab], list[Student]]:
    """Every lab's figures and every student's line, from the course CSV's rows (gradebook.Course.rows)."""
    rows = sort_rows(course)
    labs = []
    for lab, most in rows.totals.items():
        marks = [st.marks[lab] for st in rows.students.values()]
        top = lab_failures(course, rows, lab)  # counts the cells' figures first
        done = [m for m in marks if m.state == "graded"]
        labs.append(Lab(lab, most, sorted(m.points for m in done),
                        sum(m.state == "not graded" for m in marks), sum(m.state == "no submission" for m in marks),
                        sum(m.late > 0 for m in done), list(rows.cells.get(lab, {}).values()), top))
    return labs, list(rows.students.values())


def slug(lab: str) -> str:
    """A lab's name as a file name and an HTML id."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", lab)


def plot_scores(lab: Lab, path: Path) -> None:
    """The lab's score distribution: how many graded students got each score, out of its total."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(5.6, 3.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    whole = lab.max_points.is_integer() and lab.max_points <= 60 and all(s.is_integer() for s in lab.scores)
    edges = ([k - 0.5 for k in range(int(lab.max_points) + 2)] if whole
             else [lab.max_points * k / 20 for k in range(21)])
    ax.hist(lab.scores, bins=edges, color="#0969da", edgecolor="white")
    ax.set_xlim(edges[0], edges[-1])
    ax.xaxis.set_major_locator(MaxNLocator(integer=whole))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"points out of {lab.max_points:g}")
    ax.set_ylabel("students")
    ax.set_title(f"{lab.name}: scores of {len(lab.scores)} graded", fontsize=10)
    if not lab.scores:
        ax.text(0.5, 0.5, "nobody graded", transform=ax.transAxes, ha="center", color="#57606a")
    ax.spines[["top", "right"]].set_visible(False)
    fig.savefig(path, format="png")


def plot_cells(lab: Lab, path: Path) -> None:
    """Each test cell's pass rate (full points, out of the graded students), one bar per cell."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 1.0 + 0.32 * max(len(lab.cells), 1)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    rates = [100 * (c.rate() or 0.0) for c in lab.cells]
    y = list(range(len(lab.cells)))[::-1]  # the first cell on top
    ax.barh(y, rates, color=[tone(r / 100) for r in rates], height=0.7)
    for yi, c, r in zip(y, lab.cells, rates):
        n = c.passed + c.failed + c.manual
        ax.text(min(r, 100) + 1.5, yi, f"{c.passed}/{n}", va="center", fontsize=8, color="#1f2328")
    ax.set_yticks(y, [c.name for c in lab.cells], fontsize=8)
    ax.set_xlim(0, 112)
    ax.set_xticks([0, 25, 50, 75, 100], ["0 %", "25 %", "50 %", "75 %", "100 %"])
    ax.set_title(f"{lab.name}: test cells passed", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.savefig(path, format="png")


def tone(fraction: float) -> str:
    """A colour for a pass rate or a score fraction: green when all, amber from a half, red below."""
    return gradebook.TONE["passed" if fraction >= 1 else "manual" if fraction >= 0.5 else "failed"]


STYLE = gradebook.STYLE + """
body { max-width: 76em; }
h2 { margin-top: 2.2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
nav a { margin-right: 1em; }
.plots { display: flex; flex-wrap: wrap; gap: 1.5em; margin: 1.2em 0; align-items: flex-start; }
.plots figure { margin: 0; } .plots img { max-width: 100%; border: 1px solid #d0d7de; border-radius: 6px; }
figcaption { font-size: .8em; color: #57606a; }
table.tests td.num, table.tests th.num { text-align: right; font-variant-numeric: tabular-nums;
                                         white-space: nowrap; }
.bar { display: inline-block; height: .7em; border-radius: 3px; vertical-align: middle; margin-right: .5em; }
td pre { margin: 0; font-size: .9rem; }
.late { background: #8250df; } .state { color: #57606a; font-style: italic; }
.wide { overflow-x: auto; }
table.students td { white-space: nowrap; } table.students th { vertical-align: bottom; }
table.failures td:first-child { width: 5em; }
td.low { background: #ffebe9; } td.full { background: #dafbe1; }
"""


def esc(text: object) -> str:
    """text for HTML (quotes too: it goes in attributes)."""
    return html.escape(str(text), quote=True)


def data_uri(path: Path) -> str:
    """A PNG file as a data URI (the page needs no file beside it)."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def lab_section(lab: Lab, out: Path) -> str:
    """One lab's part of the page: summary, plots, test cells, frequent failures."""
    n = len(lab.scores)
    mean = f"{statistics.fmean(lab.scores):.3g}" if lab.scores else "–"
    facts = [f"{n} graded"]
    if lab.scores:
        facts.append(f"median {statistics.median(lab.scores):g}, lowest {lab.scores[0]:g}, highest {lab.scores[-1]:g}")
    facts += [f"{lab.late} late", f"{lab.not_graded} not graded", f"{lab.no_submission} no submission"]
    shade = tone(statistics.fmean(lab.scores) / lab.max_points) if n and lab.max_points else "#57606a"
    summary = (f"<div class='summary' style='--tone: {shade}'>"
               f"<span class='score'>{mean} / {lab.max_points:g}</span>"
               f"<span><b>mean score</b><br>{esc(' · '.join(facts))}</span></div>")
    plots = "".join(
        f"<figure><img src='{data_uri(out / name)}' alt='{esc(alt)}'>"
        f"<figcaption>{esc(alt)} (<a href='{esc(name)}'>{esc(name)}</a>)</figcaption></figure>"
        for name, alt in ((lab.plots["scores"], f"{lab.name}: how many graded students got each score"),
                          (lab.plots["cells"], f"{lab.name}: each test cell's pass rate")))
    rows = "".join(
        f"<tr><td>{esc(c.name)}</td><td class='num'>{c.max_points:g}</td>"
        f"<td class='num'>{c.passed}</td><td class='num'>{c.failed}</td><td class='num'>{c.manual}</td>"
        f"<td class='num'>" + (f"<span class='bar' style='width: {4 * (c.rate() or 0):.2f}em; "
                               f"background: {tone(c.rate() or 0)}'></span>{100 * (c.rate() or 0):.0f} %"
                               if c.rate() is not None else "–") + "</td></tr>"
        for c in lab.cells)
    cells = (f"<table class='tests cells'><tr><th>test cell</th><th class='num'>points</th><th class='num'>passed</th>"
             f"<th class='num'>failed</th><th class='num'>needs manual grading</th><th class='num'>pass rate</th></tr>"
             f"{rows}</table>")
    if lab.failures:
        failures = ("<table class='tests failures'><tr><th class='num'>students</th><th>message</th>"
                    "<th>test cells</th></tr>"
                    + "".join(
                        f"<tr><td class='num'>{len(f.students)}</td><td><pre>{esc(f.variants[0])}</pre>"
                        + (f"<span class='notes'>and {len(f.variants) - 1} more with other numbers</span>"
                           if len(f.variants) > 1 else "")
                        + f"</td><td>{esc(', '.join(f.cells))}</td></tr>" for f in lab.failures)
                    + "</table>")
    else:
        failures = "<p class='notes'>No graded student failed a test cell.</p>"
    return (f"<section id='lab-{esc(slug(lab.name))}'><h2>{esc(lab.name)}</h2>{summary}"
            f"<div class='plots'>{plots}</div><h3>Test cells</h3>{cells}"
            f"<h3>Most frequent failures</h3>{failures}</section>")


def mark_cell(mark: Mark) -> str:
    """A student's lab in the students' table."""
    if mark.state != "graded":
        return f"<td class='num mark' title='{esc(mark.status)}'><span class='state'>{esc(mark.state)}</span></td>"
    fraction = mark.points / mark.max_points if mark.max_points else 1.0
    kind = "full" if fraction >= 1 else "low" if fraction < 0.5 else ""
    badge = (f" <span class='badge late' title='{mark.late / 3600:.1f} h after the due date'>late</span>"
             if mark.late else "")
    return f"<td class='num mark {kind}' title='{esc(mark.status)}'>{esc(mark.shown())}{badge}</td>"


def page(labs: list[Lab], students: list[Student], course: gradebook.Course, out: Path) -> str:
    """The whole report as one HTML page."""
    nav = "".join(f"<a href='#lab-{esc(slug(lab.name))}'>{esc(lab.name)}</a>" for lab in labs)
    head = "".join(f"<th class='num'>{esc(lab.name)}</th>" for lab in labs)
    lines = "".join(
        f"<tr><td>{esc(st.name)}"
        + (f" <span class='notes'>({esc(st.grader_id)})</span>" if st.name != st.grader_id else "")
        + "</td>" + "".join(mark_cell(st.marks[lab.name]) for lab in labs)
        + f"<td class='num'><b>{st.points:g} / {st.max_points:g}</b></td></tr>" for st in students)
    table = (f"<div class='wide'><table class='tests students'><tr><th>student</th>{head}"
             f"<th class='num'>total</th></tr>{lines}</table></div>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Course report</title>"
            f"<style>{STYLE}</style></head><body><h1>Course report</h1>"
            f"<p class='notes'>{len(students)} student(s), {len(labs)} lab(s), from the gradebook in "
            f"{esc(course.root)}: the same points as <code>make grades</code>. Late: handed in after the lab's "
            f"due date; not graded: handed in, but the grader could not grade it (hover for the status). "
            f"Failures: the error a failed test cell shows (as in the feedback), grouped when only their "
            f"numbers differ; the {TOP} most frequent per lab.</p>"
            f"<nav>{nav}<a href='#students'>students</a></nav>"
            + "".join(lab_section(lab, out) for lab in labs)
            + f"<section id='students'><h2>Students</h2>{table}</section></body></html>")


def write(course: gradebook.Course, out: Path) -> Path:
    """Write the report (index.html, the PNG plots, report.json) into out; return the page."""
    out.mkdir(parents=True, exist_ok=True)
    labs, students = figures(course)
    for lab in labs:
        lab.plots = {"scores": f"{slug(lab.name)}-scores.png", "cells": f"{slug(lab.name)}-cells.png"}
        plot_scores(lab, out / lab.plots["scores"])
        plot_cells(lab, out / lab.plots["cells"])
    (out / "report.json").write_text(json.dumps(
        {"course": str(course.root), "labs": [asdict(lab) for lab in labs],
         "students": [asdict(st) for st in students]}, indent=1, ensure_ascii=False), encoding="utf-8")
    index = out / "index.html"
    index.write_text(page(labs, students, course, out), encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> int:
    """The command line: the course's report, written where it says."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--course", type=Path, default=gradebook.DEFAULT)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    if not (a.course / "gradebook.db").exists():
        raise SystemExit(f"report: no gradebook in {a.course} (grade with `make grade` first)")
    index = write(gradebook.Course(a.course), a.out)
    print(f"report written to {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
