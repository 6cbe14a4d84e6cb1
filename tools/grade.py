"""Autograde a folder of lab submissions with nbgrader and export the grades as CSV.

    python tools/grade.py SUBMISSIONS --lab 01-input-pipeline --out grades.csv

SUBMISSIONS holds one entry per student, any of:
    SUBMISSIONS/<student>/<lab>/<notebook>.ipynb     (nbgrader's layout)
    SUBMISSIONS/<student>/<notebook>.ipynb
    SUBMISSIONS/<student>.ipynb                      (labs with one notebook)
The submissions are copied, never modified. Grading happens in a fresh nbgrader course folder
(--workdir, default build/grading/<lab>) whose source is solutions/<lab>, with the per-cell
time limits of the repository's nbgrader_config.py (keyed on grade ids). Each student is graded
in a process of their own with a wall-clock limit, and every process it started is killed
afterwards. A notebook nbgrader gives up on (a loop that catches BaseException survives its cell
interrupt, and nbgrader then discards the notebook) or that outlives the limit is reported
"not graded" with the reason, instead of blocking everyone else. The CSV has one row per student: score,
max score, status, and the points of every test cell.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "src"))
from helpers.launch import MARKER, kill_launch  # noqa: E402  (one process-tree killer for all)


@dataclass
class Student:
    """One student's submission and what grading made of it."""

    id: str
    notebooks: dict[str, Path] = field(default_factory=dict)
    status: str = "graded"
    score: float = 0.0
    max_score: float = 0.0
    cells: dict[str, float] = field(default_factory=dict)


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
        missing = [n for n in names if n not in st.notebooks]
        if missing:
            st.status = f"missing notebook(s): {', '.join(n + '.ipynb' for n in missing)}"
        for name, path in st.notebooks.items():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                st.status = f"unreadable notebook {name}.ipynb: {err}"
        students.append(st)
    return students


def nbgrader(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run one nbgrader command in its own process group; kill all it started on timeout."""
    launch_id = uuid.uuid4().hex
    proc = subprocess.Popen([str(BIN / "nbgrader"), *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**env, MARKER: launch_id})
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        return -1, ""
    finally:
        kill_launch(launch_id, [proc])  # kernels included: they carry the marker too


def setup_course(workdir: Path, lab: str, cell_timeout: int | None) -> dict[str, str]:
    """A fresh nbgrader course folder for lab; returns the environment to run nbgrader in."""
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions" / lab, workdir / "source" / lab,
                    ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    (workdir / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"load_subconfig('nbgrader_config.py', path={str(ROOT)!r})  # the course's settings\n"
        f"c.CourseDirectory.root = {str(workdir)!r}\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        "c.CourseDirectory.release_directory = 'release'\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{workdir}/gradebook.db'\n")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT / "src")}
    if cell_timeout:
        env["DPC_CELL_TIMEOUT"] = str(cell_timeout)
    code, out = nbgrader(["generate_assignment", lab, "--force"], workdir, env, 600)
    if code != 0:
        raise SystemExit(f"grade: nbgrader generate_assignment failed:\n{out}")
    return env


def grade(students: list[Student], workdir: Path, lab: str, env: dict[str, str],
          notebook_timeout: float) -> None:
    """Autograde each student with a wall-clock limit; fill in status, score and cells."""
    from nbgrader.api import Gradebook, MissingEntry

    for st in students:
        if st.status != "graded":
            print(f"  {st.id}: {st.status}")
            continue
        dest = workdir / "submitted" / st.id / lab
        dest.mkdir(parents=True)
        for name, path in st.notebooks.items():
            shutil.copy(path, dest / f"{name}.ipynb")
        start = time.monotonic()
        code, out = nbgrader(["autograde", lab, "--student", st.id, "--force"], workdir, env,
                             notebook_timeout)
        took = time.monotonic() - start
        if code == -1:
            st.status = (f"not graded: still running after {notebook_timeout:.0f} s (a cell that "
                         f"survives interrupts?): grade by hand")
        elif code != 0:
            log = workdir / f"autograde-{st.id}.log"
            log.write_text(out)
            st.status = f"not graded: {why_failed(out)} (log: {log})"
        print(f"  {st.id}: {st.status} ({took:.0f} s)")
    with Gradebook(f"sqlite:///{workdir}/gradebook.db") as gb:
        assignment = gb.find_assignment(lab)
        for st in students:
            st.max_score = assignment.max_score
            for nb in assignment.notebooks:
                for cell in nb.grade_cells:
                    st.cells[cell.name] = 0.0
            if st.status != "graded":
                continue
            try:
                sub = gb.find_submission(lab, st.id)
            except MissingEntry:
                st.status = "not graded: no submission recorded"
                continue
            st.score = sub.score
            for nb in sub.notebooks:
                for g in nb.grades:
                    st.cells[g.name] = g.score


def why_failed(log: str) -> str:
    """One line on why nbgrader gave up on a notebook, from its log."""
    if "CellTimeoutError" in log:
        preview = re.search(r"preview of the cell contents:\s*\n\s*-+\s*\n(.*?)\n", log)
        cell = f" ({preview.group(1).strip()!r} ...)" if preview else ""
        return (f"a cell{cell} kept running after its time limit and an interrupt (does it catch "
                f"KeyboardInterrupt or BaseException?); nbgrader cannot grade the rest: grade by hand")
    errors = [ln.split("|", 1)[-1].strip() for ln in log.splitlines() if "| ERROR]" in ln]
    return "autograde failed: " + (errors[0] if errors else (log.strip().splitlines() or ["?"])[-1])


def write_csv(students: list[Student], lab: str, out: Path) -> None:
    """One row per student: student, lab, score, max_score, status, then each test cell's points."""
    cells = sorted({c for st in students for c in st.cells})
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "lab", "score", "max_score", "status", *cells])
        for st in students:
            w.writerow([st.id, lab, f"{st.score:g}", f"{st.max_score:g}", st.status,
                        *(f"{st.cells.get(c, 0.0):g}" for c in cells)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submissions", type=Path)
    p.add_argument("--lab", required=True)
    p.add_argument("--out", type=Path, default=Path("grades.csv"))
    p.add_argument("--workdir", type=Path, default=None,
                   help="nbgrader course folder to grade in (default build/grading/<lab>)")
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="default seconds per cell (cells listed in nbgrader_config.py keep theirs)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="wall-clock seconds for one student's whole lab")
    a = p.parse_args(argv)
    names = lab_notebooks(a.lab)
    students = find_submissions(a.submissions.resolve(), a.lab, names)
    if not students:
        raise SystemExit(f"grade: {a.submissions} holds no submissions")
    workdir = (a.workdir or ROOT / "build" / "grading" / a.lab).resolve()
    print(f"grading {len(students)} submission(s) of {a.lab} in {workdir}")
    env = setup_course(workdir, a.lab, a.cell_timeout)
    grade(students, workdir, a.lab, env, a.notebook_timeout)
    write_csv(students, a.lab, a.out)
    for st in students:
        print(f"{st.id:>20}: {st.score:g} / {st.max_score:g}  {st.status}")
    print(f"grades written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
