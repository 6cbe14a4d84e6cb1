"""Autograde a class's submissions of one lab: N students at once, each in a sandbox, into the
course's one gradebook.

    python -m dpc_instructor.grade SUBMISSIONS --lab 01-input-pipeline [--course DIR] [--jobs N] [--out CSV]

SUBMISSIONS holds one entry per student, any of:
    SUBMISSIONS/<student>/<lab>/<notebook>.ipynb     (nbgrader's layout; a timestamp.txt beside it
                                                       is kept: nbgrader's late-submission rules)
    SUBMISSIONS/<student>/<notebook>.ipynb
    SUBMISSIONS/<student>.ipynb                      (labs with one notebook)
The submissions are read, never modified.

Each student is graded in a private nbgrader course folder of their own (a copy of the lab's
source and an empty gradebook), with `nbgrader autograde` inside a sandbox (src/dpc_runtime/sandbox.py: no
network but its own loopback, only its own folder writable, memory/process/file-size limits) and
the kernel inside a second one that cannot read nbgrader's database (it holds the hidden tests).
Per-cell time limits come from the repository's nbgrader_config.py (keyed on grade ids), plus a
wall-clock limit per student. Before grading, the cells a student may not change are restored from
the release: a test or locked cell that lost its nbgrader metadata gets it back, points and flags
are the release's (the note column says what was repaired).

The result is added to the course gradebook (src/dpc_instructor/gradebook.py; default build/course): a regraded
student replaces only their own lab; everyone else is untouched; runs may overlap. The CSV written
by --out has one row per student of this run; `make grades` exports the whole course.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dpc_instructor import gradebook  # the course gradebook; runs nbgrader
from dpc_runtime import manifest, notebook, sandbox

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@dataclass
class Student:
    """One student's submission and what grading made of it."""

    id: str
    notebooks: dict[str, Path] = field(default_factory=dict)
    timestamp: Path | None = None
    status: str = "graded"
    notes: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    cells: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def lab_notebooks(lab: str) -> list[str]:
    """Notebook names (without .ipynb) of a lab's source in solutions/."""
    src = ROOT / "solutions" / lab
    if not src.is_dir():
        labs = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
        raise SystemExit(f"grade: no lab {lab!r} in solutions/ (labs: {', '.join(labs)})")
    return sorted(p.stem for p in src.glob("*.ipynb"))


def find_submissions(folder: Path, lab: str, names: list[str]) -> list[Student]:
    """One Student per entry of folder, with the notebooks found for them (or a status why not)."""
    if not folder.is_dir():
        raise SystemExit(f"grade: {folder} is not a folder of submissions")
    students = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        sid = entry.stem if entry.suffix == ".ipynb" else entry.name
        st = Student(re.sub(r"[^A-Za-z0-9_.-]", "_", sid))
        for name in names:
            candidates = ([entry] if entry.is_file() and len(names) == 1 else
                          [entry / lab / f"{name}.ipynb", entry / f"{name}.ipynb"])
            found = next((c for c in candidates if c.is_file() and c.suffix == ".ipynb"), None)
            if found:
                st.notebooks[name] = found
        stamp = entry / lab / "timestamp.txt"
        st.timestamp = stamp if stamp.is_file() else None
        missing = [n for n in names if n not in st.notebooks]
        if missing:
            st.status = f"missing notebook(s): {', '.join(n + '.ipynb' for n in missing)}"
        for name, path in st.notebooks.items():
            try:
                nb = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                    raise ValueError("no cells")
                if not all(isinstance(c, dict) and "cell_type" in c and "source" in c
                           for c in nb["cells"]):
                    raise ValueError("a cell without cell_type or source")
            except (UnicodeDecodeError, ValueError) as err:
                st.status = f"unreadable notebook {name}.ipynb: {err}"
        students.append(st)
    return students


def repair(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """nb with the nbgrader metadata of every test/locked cell set to the release's.

    A cell keeps its grade id when it has one; a code or markdown cell that lost its metadata is
    matched to the missing release cell whose source it most resembles. nbgrader then restores the
    sources of test and locked cells from its database (and re-adds deleted ones).
    """
    meta = notebook.by_grade_id(release)
    notes = []
    seen = set()
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid in meta and gid not in seen:
            seen.add(gid)
            want = notebook.nbgrader(meta[gid])
            have = notebook.nbgrader(cell)
            if not want.get("solution") and {k: have.get(k) for k in want} != want:
                notes.append(f"restored the metadata of {gid}")
            cell["metadata"]["nbgrader"] = dict(want) if not want.get("solution") else {**have, **want}
    for gid, rel in meta.items():
        if gid in seen or notebook.nbgrader(rel).get("solution"):
            continue
        bare = [c for c in nb["cells"] if not notebook.nbgrader(c) and c["cell_type"] == rel["cell_type"]]

        def score(c: dict, rel: dict = rel) -> float:
            return difflib.SequenceMatcher(None, notebook.source(c), notebook.source(rel)).ratio()

        best = max(bare, key=score, default=None)
        if best is not None and score(best) >= 0.6:
            best.setdefault("metadata", {})["nbgrader"] = dict(notebook.nbgrader(rel))
            notes.append(f"restored the lost metadata of {gid}")
            seen.add(gid)
        else:
            notes.append(f"re-added the deleted cell {gid}")
    return nb, notes


@dataclass
class Run:
    """What every job of one grading run shares."""

    course: gradebook.Course
    lab: str
    template: Path
    release: dict[str, dict]
    cell_timeout: int | None
    notebook_timeout: float
    limits: sandbox.Limits
    sandboxed: bool
    lock: threading.Lock = field(default_factory=threading.Lock)


def job_env(scratch: Path, cell_timeout: int | None) -> dict[str, str]:
    """The environment of one student's nbgrader and kernel: sandbox.clean_env, plus Jupyter's
    folders in the job folder (jupyter_client writes a kernel's connection file to TMPDIR, which the
    kernel's sandbox must see: it is the runtime folder)."""
    env = sandbox.clean_env(scratch / "home", scratch / "runtime")
    env.update(JUPYTER_PATH=str(scratch / "share"), JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    if cell_timeout:
        env["DPC_CELL_TIMEOUT"] = str(cell_timeout)
    return env


def prepare(course: gradebook.Course, lab: str, names: list[str], cell_timeout: int | None,
            notebook_timeout: float, sandboxed: bool) -> Run:
    """The lab in the course gradebook, and a template course folder every job copies."""
    course.add_lab(lab)
    template = course.jobs / f"template-{lab}-{uuid.uuid4().hex[:8]}"
    gradebook.nbgrader_course(template, lab)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    code, out = gradebook.nbgrader(["generate_assignment", lab, "--force"], template, env, 600)
    if code != 0:
        raise SystemExit(f"grade: nbgrader generate_assignment failed:\n{out}")
    release = {n: json.loads((template / "release" / lab / f"{n}.ipynb").read_text()) for n in names}
    shutil.rmtree(template / "release")
    limits = sandbox.Limits()
    return Run(course, lab, template, release, cell_timeout, notebook_timeout, limits, sandboxed)


def grade_one(st: Student, run: Run) -> Student:
    """Grade one student; whatever goes wrong is that student's status, never the whole run's."""
    try:
        return _grade_one(st, run)
    except Exception as err:  # noqa: BLE001  (a malformed notebook must not stop the class)
        st.status = f"not graded: the grader could not process this submission ({type(err).__name__}: {err})"
        with run.lock:
            run.course.record(run.lab, st.id, None, st.status, st.notes, st.seconds)
        return st


def _grade_one(st: Student, run: Run) -> Student:
    """Grade one student in a private course folder and sandbox; add the result to the gradebook."""
    if st.status != "graded":
        with run.lock:
            run.course.record(run.lab, st.id, None, st.status, st.notes, 0.0)
        return st
    lab = run.lab
    scratch = run.course.jobs / f"{lab}-{st.id}-{uuid.uuid4().hex[:8]}"
    try:
        return _grade_in(st, run, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _grade_in(st: Student, run: Run, scratch: Path) -> Student:
    """Grade st in the job folder scratch (removed by the caller)."""
    lab = run.lab
    shutil.copytree(run.template, scratch)
    gradebook.nbgrader_course(scratch, lab, write_source=False)
    dest = scratch / "submitted" / st.id / lab
    dest.mkdir(parents=True)
    for name, path in st.notebooks.items():
        nb, notes = repair(json.loads(path.read_text(encoding="utf-8")), run.release[name])
        st.notes += [f"{name}: {n}" for n in notes]
        (dest / f"{name}.ipynb").write_text(json.dumps(nb))
    if st.timestamp:
        shutil.copy(st.timestamp, dest / "timestamp.txt")
    home, khome = scratch / "home", scratch / "kernel-home"
    for d in (home, khome, scratch / "runtime", scratch / "share"):
        d.mkdir()
    env = job_env(scratch, run.cell_timeout)
    argv = [str(BIN / "nbgrader"), "autograde", lab, "--student", st.id, "--force"]
    if run.sandboxed:
        graded = scratch / "autograded" / st.id / lab
        # The kernel's home is its own: nbgrader's holds the course's configuration.
        sandbox.kernel_spec(scratch / "share", writable=[graded, khome], read=[scratch / "runtime"],
                            setenv={"HOME": str(khome), "IPYTHONDIR": str(khome / ".ipython"),
                                    "TMPDIR": "/tmp"})
        argv = sandbox.bwrap_argv(argv, writable=[scratch], caps=True, env=env, cwd=scratch)
    start = time.monotonic()
    done = sandbox.run_limited(argv, scratch, env, run.notebook_timeout, run.limits)
    code, out = done.code, done.output
    st.seconds = time.monotonic() - start
    if code == -1:
        st.status = (f"not graded: still running after {run.notebook_timeout:.0f} s (a cell that "
                     f"survives interrupts?): grade by hand")
    elif done.out_of_memory:
        st.status = f"not graded: used more than {run.limits.memory >> 30} GiB of memory"
    elif code != 0:
        log = run.course.root / "logs" / f"autograde-{lab}-{st.id}.log"
        log.parent.mkdir(exist_ok=True)
        log.write_text(out)
        st.status = f"not graded: {why_failed(out, code, run.limits)} (log: {log})"
    with run.lock:
        recorded = run.course.record(run.lab, st.id, scratch if st.status == "graded" else None,
                                     st.status, st.notes, st.seconds)
    if recorded:
        st.score, st.max_score, st.cells, by_hand = recorded
        if by_hand:
            st.status = f"graded; needs manual grading: {', '.join(by_hand)}"
    return st


def why_failed(log: str, code: int, limits: sandbox.Limits) -> str:
    """One line on why nbgrader gave up on a notebook, from its log."""
    if code in (-25, 153) or "File size limit exceeded" in log:
        return f"wrote a file over {limits.file_size >> 20} MiB (the limit for any one file)"
    if "CellTimeoutError" in log:
        preview = re.search(r"preview of the cell contents:\s*\n\s*-+\s*\n(.*?)\n", log)
        cell = f" ({preview.group(1).strip()!r} ...)" if preview else ""
        return (f"a cell{cell} kept running after its time limit and an interrupt (does it catch "
                f"KeyboardInterrupt or BaseException?); nbgrader cannot grade the rest: grade by hand")
    errors = [ln.split("|", 1)[-1].strip() for ln in log.splitlines() if "| ERROR]" in ln]
    return "autograde failed: " + (errors[0] if errors else (log.strip().splitlines() or ["?"])[-1])


def default_jobs(lab: str, students: int) -> int:
    """As many students at once as the machine has cores for the lab's ranks (at least 1)."""
    return max(1, min(students, (os.cpu_count() or 1) // manifest.lab_ranks(lab)))


def write_csv(students: list[Student], lab: str, out: Path) -> None:
    """One row per student: student, lab, score, max_score, status, notes, each test cell's points."""
    cells = sorted({c for st in students for c in st.cells})
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "lab", "score", "max_score", "status", "notes", *cells])
        for st in students:
            w.writerow([st.id, lab, f"{st.score:g}", f"{st.max_score:g}", st.status,
                        "; ".join(st.notes), *(f"{st.cells.get(c, 0.0):g}" for c in cells)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submissions", type=Path)
    p.add_argument("--lab", required=True)
    p.add_argument("--out", type=Path, default=Path("grades.csv"))
    p.add_argument("--course", type=Path, default=None,
                   help=f"the course gradebook folder (default {gradebook.DEFAULT})")
    p.add_argument("--jobs", type=int, default=None,
                   help="students graded at once (default: cores / the lab's ranks)")
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="default seconds per cell (cells listed in nbgrader_config.py keep theirs)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="wall-clock seconds for one student's whole lab")
    a = p.parse_args(argv)
    sandboxed = not sandbox.disabled()
    sandbox.require()
    names = lab_notebooks(a.lab)
    students = find_submissions(a.submissions.resolve(), a.lab, names)
    if not students:
        raise SystemExit(f"grade: {a.submissions} holds no submissions")
    course = gradebook.Course(a.course or gradebook.DEFAULT)
    jobs = a.jobs or default_jobs(a.lab, len(students))
    print(f"grading {len(students)} submission(s) of {a.lab} into {course.root}, {jobs} at a time"
          f"{'' if sandboxed else ' (NOT sandboxed)'}")
    run = prepare(course, a.lab, names, a.cell_timeout, a.notebook_timeout, sandboxed)
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(jobs) as pool:
            for st in pool.map(lambda s: grade_one(s, run), students):
                print(f"  {st.id}: {st.score:g} / {st.max_score:g}  {st.status} ({st.seconds:.0f} s)",
                      flush=True)
    finally:
        shutil.rmtree(run.template, ignore_errors=True)
    took = time.monotonic() - start
    write_csv(students, a.lab, a.out)
    print(f"graded {len(students)} in {took:.0f} s ({60 * len(students) / max(took, 1e-9):.2f} "
          f"students/min at {jobs} job(s)); grades written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
