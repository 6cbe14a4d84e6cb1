"""The course's one gradebook: every lab, every student, every grading run added to it.

    python -m dpc_instructor.gradebook export [--course DIR] [--out course-grades.csv]   (make grades)
    python -m dpc_instructor.gradebook feedback [--course DIR] [--out DIR]               (make feedback)

The course folder (default gradebook/, ignored by git and kept by `make clean`; `COURSE=...` with make) is an nbgrader course:
    gradebook.db               nbgrader's gradebook (all labs, all students)
    source/<lab>/, release/    the labs as last graded
    submitted/<student>/<lab>/ what each student handed in, as graded last (with KEPT files)
    autograded/<student>/<lab>/the graded notebooks (folders and regular files only: Course.record)
    status.json                per student and lab: how the last grading went (and notes)
    feedback/<student>/<lab>/  `make feedback`'s pages, <notebook>.html (nbgrader's layout)
    names.json                 per grader id: the student's name as handed in (shown in CSVs and feedback)
    jobs/                      scratch of runs in progress (one folder per student being graded)
Changes happen under a file lock (`.lock`), so grading runs may overlap without corrupting it.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import html
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from dpc_instructor import markers
from dpc_runtime import notebook, sandbox  # sandbox.run_limited runs every nbgrader command

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFAULT = ROOT / "gradebook"  # outside build/: `make clean` never removes a term's grades (issue 56)
# nbgrader's files beside a submission (nbgrader's layout only), kept with it in the course: the time
# handed in (late-submission rules) and the secret `nbgrader release_feedback` names feedback by.
KEPT = ("timestamp.txt", "submission_secret.txt")
KEEP_OUT = ("runs", "*.pt", "__pycache__")  # never kept in the course from a graded folder (Course.record)


def nbgrader_course(folder: Path, lab: str, write_source: bool = True) -> None:
    """Make folder an nbgrader course with the repository's settings; copy solutions/<lab> in."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"load_subconfig('nbgrader_config.py', path={str(ROOT)!r})  # the course's settings\n"
        f"c.CourseDirectory.root = {str(folder)!r}\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        "c.CourseDirectory.release_directory = 'release'\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{folder}/gradebook.db'\n"
        "c.OverwriteCells.add_missing_cells = True  # a deleted test cell is put back and run\n"
        "c.LimitOutput.max_lines = 1000\n")
    if write_source:
        shutil.rmtree(folder / "source" / lab, ignore_errors=True)
        say_refused(sandbox.copy_regular(ROOT / "solutions" / lab, folder / "source" / lab,
                                         ignore=("runs", ".ipynb_checkpoints")), f"solutions/{lab}")


def keep_graded(scratch: Path, root: Path, student: str, lab: str) -> list[str]:
    """Copy a job's submitted/ and autograded/ folders of student's lab from scratch to root (replacing
    them), folders and regular files only (KEEP_OUT left out); the note on what was not kept, if any."""
    refused = []
    for kind in ("submitted", "autograded"):
        dest = root / kind / student / lab
        shutil.rmtree(dest, ignore_errors=True)
        refused += [f"{kind}/{line}" for line in sandbox.copy_regular(scratch / kind / student / lab, dest,
                                                                      ignore=KEEP_OUT)]
    return [f"not kept in the course (only folders and regular files are): {'; '.join(refused)}"] * bool(refused)


def say_refused(refused: list[str], what: str) -> None:
    """One line on stderr naming what a copy of `what` left out (sandbox.copy_regular), if anything."""
    if refused:
        print(f"{what}: not copied (only folders and regular files are): {'; '.join(refused)}",
              file=sys.stderr)


def nbgrader(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run one nbgrader command (this environment's) in cwd: (exit code, -1 on timeout; output)."""
    done = sandbox.run_limited([str(BIN / "nbgrader"), *args], cwd, env, timeout)
    return done.code, done.output


def status_entry(status: str, notes: list[str], seconds: float, seed: int | None, graded: bool,
                 earlier: dict | None) -> dict:
    """A student's entry for one lab in the course's status.json: this run's status, notes and
    time; graded (this run graded them): its time and seed, else those of an earlier grade kept."""
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    return {"status": status, "notes": notes, "seconds": round(seconds, 1), "at": now,
            "graded": graded or bool(earlier and earlier.get("graded")),
            "graded_at": now if graded else (earlier or {}).get("graded_at"),
            "seed": seed if graded else (earlier or {}).get("seed")}


class Course:
    """The course gradebook folder."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.jobs = self.root / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.db_url = f"sqlite:///{self.root / 'gradebook.db'}"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the course's file lock (other grading runs wait)."""
        with open(self.root / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def add_lab(self, lab: str) -> None:
        """Put lab (its notebooks and test cells) in the gradebook, or refresh it from solutions/."""
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        with self.lock():
            nbgrader_course(self.root, lab)
            code, out = nbgrader(["generate_assignment", lab, "--force"], self.root, env, 600)
        if code != 0:
            raise SystemExit(f"grade: nbgrader generate_assignment failed in {self.root}:\n{out}")

    def statuses(self) -> dict[str, dict[str, dict]]:
        """status.json: {student: {lab: {status, notes, seconds, at, graded, graded_at, seed}}}
        (seed: the hidden tests' seed of the grade kept, the one graded_at names)."""
        f = self.root / "status.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}

    def names(self) -> dict[str, str]:
        """names.json: {grader id: the student's name as handed in}."""
        f = self.root / "names.json"
        return json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}

    def record(self, lab: str, student: str, scratch: Path | None, status: str, notes: list[str],
               seconds: float, name: str | None = None, seed: int | None = None
               ) -> tuple[float, float, dict[str, float], list[str]] | None:
        """Add one student's grading of lab (from the job folder scratch) to the course.

        `student` is the grader id; `name` the name handed in (kept in names.json); `seed` the
        grading run's seed of the hidden tests' cases, kept with the grade it drew (the same seed
        grades the same cases again).
        Only this student's submission of this lab is replaced. A run that could not grade them
        (scratch None) records its status and keeps any earlier grade. Returns (score, max score,
        points by test cell, cells needing manual grading), or None when nothing was graded.
        The job's folders are copied as folders and regular files only (sandbox.copy_regular: no
        link the student's code left there is followed); what was left out is one line added to
        notes.
        """
        import warnings

        warnings.filterwarnings("ignore", module="nbgrader")  # SQLAlchemy's SAWarning in add_submission
        warnings.filterwarnings("ignore", message=".*not in session.*")
        result = None
        with self.lock():
            statuses = self.statuses()
            earlier = statuses.get(student, {}).get(lab)
            if scratch is not None:
                result = self._merge_job(scratch, lab, student)
                if result is None:
                    status = "not graded: nbgrader recorded no submission"
                    scratch = None
            if scratch is not None:
                notes += keep_graded(scratch, self.root, student, lab)
            elif earlier and earlier.get("graded"):
                status = f"{status}; kept the grade of {earlier['graded_at']}"
            statuses.setdefault(student, {})[lab] = status_entry(status, notes, seconds, seed,
                                                                 scratch is not None, earlier)
            self._write("status.json", statuses)
            names = self.names()
            if name is not None and names.get(student) != name:
                self._write("names.json", {**names, student: name})
        return result

    def _merge_job(self, scratch: Path, lab: str, student: str
                   ) -> tuple[float, float, dict[str, float], list[str]] | None:
        """Replace student's submission of lab in the course's gradebook with the one in the job
        folder scratch's gradebook; its scores (as record returns them), None when the job's
        gradebook has no submission (nothing replaced). Called under the course's lock."""
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as job, Gradebook(self.db_url) as gb:
            try:
                sub_job = job.find_submission(lab, student)
            except MissingEntry:
                return None
            gb.update_or_create_student(student)
            with contextlib.suppress(MissingEntry):
                gb.remove_submission(lab, student)
            gb.add_submission(lab, student, timestamp=sub_job.timestamp)
            for nb_job in sub_job.notebooks:
                for g_job in nb_job.grades:
                    g = gb.find_grade(g_job.name, nb_job.name, lab, student)
                    g.auto_score = g_job.auto_score
                    g.manual_score = None
                    g.needs_manual_grade = g_job.needs_manual_grade
            gb.db.commit()
            return self.scores(gb, lab, student)

    def _write(self, file: str, data: dict) -> None:
        """Replace the course's JSON file at once (readers never see half of it)."""
        tmp = self.root / f"{file}.{uuid.uuid4().hex[:6]}"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.root / file)

    @staticmethod
    def scores(gb, lab: str, student: str) -> tuple[float, float, dict[str, float], list[str]]:
        """(score, max score, points by test cell, cells needing manual grading) of one submission."""
        sub = gb.find_submission(lab, student)
        cells, manual = {}, []
        for nb in sub.notebooks:
            for g in nb.grades:
                cells[g.name] = g.score
                if g.needs_manual_grade:
                    manual.append(g.name)
        return sub.score, sub.max_score, cells, manual

    def rows(self) -> list[dict[str, str]]:
        """The course CSV's rows: one per student, lab and test cell, a total per lab and per student
        (seed: the hidden tests' seed of the grade shown, to grade the same cases again)."""
        from nbgrader.api import Gradebook, MissingEntry

        statuses = self.statuses()
        names = self.names()
        rows = []
        with Gradebook(self.db_url) as gb:
            labs = sorted(gb.assignments, key=lambda a: a.name)
            students = sorted({s.id for s in gb.students} | set(statuses))
            for sid in students:
                total = maximum = 0.0
                for a in labs:
                    st = statuses.get(sid, {}).get(a.name)
                    status = st["status"] if st else "no submission"
                    seed = "" if not st or st.get("seed") is None else str(st["seed"])
                    try:
                        sub = gb.find_submission(a.name, sid)
                    except MissingEntry:
                        sub = None
                    for nb in a.notebooks:
                        for cell in nb.grade_cells:
                            g = None
                            if sub is not None:
                                g = gb.find_grade(cell.name, nb.name, a.name, sid)
                            cell_status = ("needs manual grading" if g is not None and g.needs_manual_grade
                                           else "graded" if g is not None else status)
                            rows.append({"student": names.get(sid, sid), "grader_id": sid,
                                         "lab": a.name, "cell": cell.name,
                                         "points": f"{g.score if g else 0:g}",
                                         "max_points": f"{cell.max_score:g}",
                                         "auto_points": f"{g.auto_score:g}" if g and g.auto_score is not None else "",
                                         "manual_points": f"{g.manual_score:g}" if g and g.manual_score is not None else "",
                                         "status": cell_status, "seed": seed})
                    score = sub.score if sub is not None else 0.0
                    if sub is not None and any(g.needs_manual_grade for n in sub.notebooks for g in n.grades):
                        status += "; needs manual grading"
                    rows.append({"student": names.get(sid, sid), "grader_id": sid,
                                 "lab": a.name, "cell": "(lab total)",
                                 "points": f"{score:g}", "max_points": f"{a.max_score:g}",
                                 "auto_points": "", "manual_points": "", "status": status, "seed": seed})
                    total += score
                    maximum += a.max_score
                rows.append({"student": names.get(sid, sid), "grader_id": sid,
                             "lab": "(course)", "cell": "(course total)",
                             "points": f"{total:g}", "max_points": f"{maximum:g}",
                             "auto_points": "", "manual_points": "", "status": "", "seed": ""})
        return rows

    def export(self, out: Path) -> int:
        """Write the course CSV; return the number of students."""
        rows = self.rows()
        with out.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, ["student", "grader_id", "lab", "cell", "points", "max_points", "auto_points",
                                   "manual_points", "status", "seed"])
            w.writeheader()
            w.writerows(rows)
        return len({r["grader_id"] for r in rows})

    def feedback(self, out: Path) -> list[Path]:
        """Per student, lab and notebook, an HTML page in nbgrader's feedback layout
        (out/<student>/<lab>/<notebook>.html, the submission's KEPT files beside it, so that
        `nbgrader release_feedback` can hand it back): what passed, what failed; hidden tests removed."""
        from nbgrader.api import Gradebook, MissingEntry

        written = []
        names = self.names()
        with Gradebook(self.db_url) as gb:
            for sid, labs in sorted(self.statuses().items()):
                for lab, st in sorted(labs.items()):
                    try:
                        sub = gb.find_submission(lab, sid)
                    except MissingEntry:
                        sub = None
                    dest = out / sid / lab
                    dest.mkdir(parents=True, exist_ok=True)
                    for kept in KEPT:
                        with contextlib.suppress(FileNotFoundError):
                            say_refused(sandbox.copy_regular(self.root / "submitted" / sid / lab / kept,
                                                             dest / kept), f"feedback of {sid}/{lab}")
                    for nb_name in sorted(p.stem for p in (self.root / "source" / lab).glob("*.ipynb")):
                        grades = {g.name: g for nb in (sub.notebooks if sub is not None else [])
                                  if nb.name == nb_name for g in nb.grades}
                        page = dest / f"{nb_name}.html"
                        page.write_text(feedback_page(names.get(sid, sid), lab, st, sub, grades, nb_name,
                                                      self.graded(sid, lab, nb_name)), encoding="utf-8")
                        written.append(page)
        return written

    def graded(self, student: str, lab: str, name: str) -> bytes | None:
        """The bytes of student's graded notebook `name` of lab in the course (read_graded); None when
        there is none, or only something else by that name (said)."""
        try:
            return read_graded(self.root, student, lab, name)
        except sandbox.Refused as why:
            say_refused([str(why)], "feedback")
            return None


def read_graded(root: Path, student: str, lab: str, name: str) -> bytes | None:
    """The bytes of root/autograded/student/lab/name.ipynb (a course, or a grading job's folder: the same
    layout), read as a regular file only (sandbox.read_regular; sandbox.Refused for anything else);
    None when there is none."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return sandbox.read_regular(top, ["autograded", student, lab, f"{name}.ipynb"], sandbox.Limits.file_size)
    except FileNotFoundError:
        return None
    finally:
        os.close(top)


def scrub(nb: dict, test_ids: set[str]) -> dict:
    """A graded notebook with hidden tests cut from test cells, and their tracebacks reduced to
    the error's name and message (a traceback quotes the hidden lines)."""
    for cell in nb["cells"]:
        if notebook.grade_id(cell) not in test_ids or cell["cell_type"] != "code":
            continue
        cell["source"] = markers.hide_hidden_tests(notebook.source(cell))
        outputs = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                outputs.append({"output_type": "stream", "name": "stderr",
                                "text": f"{o.get('ename')}: {o.get('evalue')}\n"})
            elif o.get("output_type") == "stream":
                outputs.append(o)
        cell["outputs"] = outputs
    return nb


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 60em;
       padding: 0 1em; color: #1f2328; }
.summary { display: flex; gap: 2em; align-items: baseline; padding: 1em 1.5em; border-radius: 8px;
           background: #f6f8fa; border-left: 6px solid var(--tone); }
.summary .score { font-size: 2em; font-weight: 600; }
table.tests { border-collapse: collapse; margin: 1.5em 0; width: 100%; }
table.tests th, table.tests td { text-align: left; padding: .45em .8em; border-bottom: 1px solid #d0d7de; }
.badge { display: inline-block; padding: .1em .6em; border-radius: 1em; font-size: .85em; color: white; }
.failed { background: #cf222e; } .passed { background: #1a7f37; } .manual { background: #9a6700; }
.notes { color: #57606a; }
pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }  /* long output lines wrap */
"""
TONE = {"passed": "#1a7f37", "failed": "#cf222e", "manual": "#9a6700"}


def feedback_page(student: str, lab: str, st: dict, sub, grades: dict, name: str, graded: bytes | None) -> str:
    """The HTML feedback of one student's notebook `name` of a lab: score, the test cells (failed
    first), then the graded notebook (its bytes, when there is one; hidden tests cut)."""
    import nbformat
    from nbconvert import HTMLExporter

    def result(g) -> str:
        """A test cell's result as the page shows it: manual, passed or failed."""
        return "manual" if g.needs_manual_grade else "passed" if g.score == g.max_score else "failed"

    order = {"failed": 0, "manual": 1, "passed": 2}
    rows = "".join(
        f"<tr><td><span class='badge {result(g)}'>{'needs manual grading' if result(g) == 'manual' else result(g)}"
        f"</span></td><td>{html.escape(name)}</td><td>{g.score:g} / {g.max_score:g}</td></tr>"
        for name, g in sorted(grades.items(), key=lambda kv: (order[result(kv[1])], kv[0])))
    score = sum(g.score for g in grades.values())
    most = sum(g.max_score for g in grades.values())
    failed = sum(result(g) == "failed" for g in grades.values())
    tone = TONE["failed" if failed or sub is None else "manual" if any(
        result(g) == "manual" for g in grades.values()) else "passed"]
    total = f"{score:g} / {most:g}" if sub is not None else "not graded"
    head = (f"<h1>{html.escape(lab)}: {html.escape(name)}</h1>"
            f"<div class='summary' style='--tone: {tone}'><span class='score'>{total}</span>"
            f"<span><b>{html.escape(student)}</b><br>{failed} test(s) failed &middot; "
            f"{html.escape(st['status'])}</span></div>"
            + (f"<p class='notes'><b>Notes:</b> {html.escape('; '.join(st['notes']))}</p>" if st.get("notes") else "")
            + (f"<table class='tests'><tr><th>result</th><th>test</th><th>points</th></tr>{rows}</table>"
               if rows else ""))
    body = ""
    if graded is not None:
        nb = scrub(json.loads(graded.decode("utf-8")), set(grades))
        body, _ = HTMLExporter(template_name="basic").from_notebook_node(
            nbformat.reads(json.dumps(nb), as_version=4))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(lab)}: "
            f"{html.escape(student)}</title><style>{STYLE}</style></head><body>{head}{body}</body></html>")


def main(argv: list[str] | None = None) -> int:
    """The command line: export the course's grades, or write every student's feedback."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["export", "feedback"])
    p.add_argument("--course", type=Path, default=DEFAULT)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if not (a.course / "gradebook.db").exists():
        raise SystemExit(f"gradebook: no gradebook in {a.course} (grade with `make grade` first)")
    course = Course(a.course)
    if a.what == "export":
        out = a.out or Path("course-grades.csv")
        n = course.export(out)
        print(f"{n} student(s) written to {out}")
    else:
        out = a.out or course.root / "feedback"
        pages = course.feedback(out)
        print(f"{len(pages)} feedback page(s) written under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
