"""The last stage of grading: a student's result added to the course gradebook (record), and the run's
CSV (write_csv).

The result is added to the course gradebook (src/dpc_instructor/gradebook.py; default gradebook/): a
regraded student replaces only their own lab; everyone else is untouched; runs may overlap. The CSV
written by --out has one row per student of this run; `make grades` exports the whole course.
"""
from __future__ import annotations

import csv
from pathlib import Path

from dpc_instructor.grading.intake import Student
from dpc_instructor.grading.run import Run


def record(st: Student, run: Run, graded: Path | None) -> Student:
    """Add st's grading to run.course (graded: the job folder it was graded in, None when it
    was not), and take its score and points from there."""
    with run.lock:
        recorded = run.course.record(run.lab, st.id, graded, st.status, st.notes, st.seconds, st.name, run.seed)
    if recorded:
        st.score, st.max_score, st.cells, by_hand = recorded
        if by_hand:
            st.status = f"graded; needs manual grading: {', '.join(by_hand)}"
    return st


def write_csv(students: list[Student], lab: str, seed: int, out: Path) -> None:
    """One row per student: student (the name handed in), grader_id, lab, score, max_score, status,
    notes, seed (the run's hidden cases), each test cell's points."""
    cells = sorted({c for st in students for c in st.cells})
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "grader_id", "lab", "score", "max_score", "status", "notes", "seed", *cells])
        for st in students:
            w.writerow([st.name, st.id, lab, f"{st.score:g}", f"{st.max_score:g}", st.status,
                        "; ".join(st.notes), seed, *(f"{st.cells.get(c, 0.0):g}" for c in cells)])
