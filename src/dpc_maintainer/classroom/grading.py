"""Grading and feedback: the course's grader (sandboxed) on what the instructor collected, whose CSV must give
full marks to the filled notebook and 0 to the unfilled one; then feedback through nbgrader (`gradebook
feedback`, release_feedback, each student's fetch_feedback), and the pages each student will open.
"""
from __future__ import annotations

import csv
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpc_maintainer.classroom.accounts import as_user
from dpc_maintainer.classroom.common import COURSE_ID, FOLDER, ROOT, StepFailed, run

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def grade(room: Classroom, lab: str, submitted: Path) -> None:
    """The course's grader (sandboxed) on what was collected; filled: full marks, unfilled: 0."""
    out = room.dir / f"grades-{lab}.csv"
    over_slurm: dict[str, Any] = {}  # --spawner slurm: one SLURM task per student, on the class's cluster
    if room.cluster is not None:
        over_slurm = {"env": {**os.environ, "SLURM_CONF": str(room.cluster.conf)}}
    run([sys.executable, "-m", "dpc_instructor.grade", str(submitted), "--lab", lab,
         "--course", str(room.course), "--out", str(out), "--parameters", room.parameters,
         *(["--slurm"] if over_slurm else [])], f"grade {lab}", room.log, cwd=ROOT, timeout=3600, **over_slurm)
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    wrong = []
    for s in room.students:
        r = rows.get(s.name)
        if r is None:
            wrong.append(f"{s.name}: no row")
            continue
        score, top = float(r["score"]), float(r["max_score"])
        print(f"classroom:   {s.name} ({'filled' if s.filled else 'unfilled'}): {score:g}/{top:g} {r['status']}")
        if top <= 0 or (score != top if s.filled else score != 0):
            wrong.append(f"{s.name} ({'filled' if s.filled else 'unfilled'}): {score:g}/{top:g} "
                         f"{r['status']} {r['notes']}")
    if wrong:
        raise StepFailed("grades: " + "; ".join(wrong))


def give_feedback(room: Classroom, lab: str) -> None:
    """`gradebook feedback` (nbgrader's layout), release_feedback, then each student's `make feedback` (fetch_feedback)."""
    run([sys.executable, "-m", "dpc_instructor.gradebook", "feedback", "--course", str(room.course)],
        "gradebook feedback", room.log, cwd=ROOT)
    for s in room.students:
        folder = room.course / "feedback" / s.name / lab
        have = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
        if not any(n.endswith(".html") for n in have) or "submission_secret.txt" not in have:
            raise StepFailed(f"feedback for {s.name}: {folder} holds {have or 'nothing'} "
                             "(nbgrader's layout needs <notebook>.html, timestamp.txt, submission_secret.txt)")
    run([str(ROOT / ".venv/bin/nbgrader"), "release_feedback", lab, f"--course={COURSE_ID}",
         f"--Exchange.root={room.exchange}", f"--CourseDirectory.root={room.course}"],
        "nbgrader release_feedback", room.log, cwd=room.course)
    for s in room.students:  # each student fetches it the one way their README gives
        as_user(room, s, ["make", "-s", "feedback", f"LAB={lab}"], f"{s.home}/{FOLDER}", f"make feedback as {s.name}")


def feedback_pages(room: Classroom, lab: str) -> dict[str, list[str]]:
    """Per student, the paths (under their home) of the feedback pages fetch_feedback wrote."""
    pages = {}
    for s in room.students:
        found = sorted(Path(s.home, FOLDER, "labs", lab, "feedback").glob("*/*.html"))
        if not found:
            raise StepFailed(f"fetch_feedback wrote no page for {s.name}")
        pages[s.name] = [str(p.relative_to(s.home)) for p in found]
    return pages
