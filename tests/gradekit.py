"""Shared by the grading tests: build submissions from a lab's student copy and grade them with
src/dpc_instructor/grade.py exactly as an instructor would (fresh nbgrader course, per-cell limits, CSV)."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import tiers

from dpc_instructor import markers
from dpc_runtime import notebook

ROOT = Path(__file__).resolve().parents[1]

# Put at the top of an answer cell: code that does no work and fights the tests from inside the
# kernel: every numpy/torch comparison holds, a failed assert sends no error, and an answer that
# calls _claim_full_marks() from inside a test cell gives that cell an execute_result (nbgrader
# reads one as partial credit: all the points for a text that is not a number). Before the judge
# (dpc_runtime.judge) this got full marks in lab 4 with no work done.
TAMPER = '''# A submission that does no work and instead fights the tests from inside the kernel.
import sys as _sys

import numpy as _np

_yes = lambda *a, **k: True  # noqa: E731
_np.allclose = _np.array_equal = _np.array_equiv = _yes          # every comparison "holds"
_np.testing.assert_allclose = _np.testing.assert_array_equal = lambda *a, **k: None
try:
    import torch as _torch
    _torch.allclose = _torch.equal = _yes
    _torch.testing.assert_close = lambda *a, **k: None
except ImportError:
    pass
_shell = get_ipython()
_shell._showtraceback = lambda *a, **k: None                 # a failed assert sends no error
_shell.set_custom_exc((AssertionError,), lambda *a, **k: None)
_sys.excepthook = lambda *a: None


def _claim_full_marks():
    """An execute_result in a test cell: nbgrader reads one as partial credit (full when unclear)."""
    _sys.displayhook("full marks")  # not a number: nbgrader gives the cell all its points
'''



def submission(release: Path, answers: dict[str, str]) -> dict:
    """The student copy `release` with the answer cells named by grade id replaced by `answers`."""
    nb = json.loads(release.read_text())
    cells = notebook.by_grade_id(nb)
    unknown = set(answers) - set(cells)
    assert not unknown, f"no answer cells {unknown} in {release}"
    for gid, text in answers.items():
        cells[gid]["source"] = text
    return nb


def reference_answers(source: Path, grade_ids: tuple[str, ...]) -> dict[str, str]:
    """The instructor's answer cells of solution notebook `source`, without the solution markers."""
    cells = notebook.by_grade_id(json.loads(source.read_text()))
    found = {gid: markers.without_answer_markers(cells[gid]) for gid in grade_ids if gid in cells}
    missing = set(grade_ids) - set(found)
    assert not missing, f"no answer cells {missing} in {source}"
    return found


def tiered(request: pytest.FixtureRequest, gate: dict, full: dict) -> dict:
    """The students a module fixture grades this session: `gate`'s when a gate test of its module runs,
    `full`'s when a full-tier test does (tests/tiers.py; `make test` grades the gate's alone)."""
    return {**(gate if tiers.runs(request, "gate") else {}), **(full if tiers.runs(request, "full") else {})}


def write_submissions(folder: Path, lab: str, students: dict[str, dict[str, dict | str]]) -> Path:
    """The class's submission folders as an instructor collects them: folder/<student>/<lab>/<notebook>
    ({student: {notebook file name: notebook json, or raw text}}); returns folder."""
    for student, notebooks in students.items():
        (folder / student / lab).mkdir(parents=True)
        for name, nb in notebooks.items():
            (folder / student / lab / name).write_text(nb if isinstance(nb, str) else json.dumps(nb))
    return folder


def grade_all(lab: str, students: dict[str, dict[str, dict]], work: Path,
              cell_timeout: int = 45, notebook_timeout: float = 240, jobs: int = 2,
              course: Path | None = None, also: Callable[[Path], None] | None = None,
              args: tuple[str, ...] = (), parameters: str = "ci") -> dict[str, dict[str, str]]:
    """Grade students ({student: {notebook file name: notebook json, or raw text}}) of lab.

    Returns the CSV rows by student. Students are graded `jobs` at a time, sandboxed, into the
    course gradebook `course` (default: a new one in work). `also(submissions)` adds what cannot
    be written as a notebook (links, pipes); `args` go to the grader. The notebooks run with
    course.yml's ci parameters (smaller runs: what is graded does not change), or `"defaults"`.
    Also checks what every grading run must guarantee: exit 0, submissions untouched, no process
    left behind, the run's seed on every row.
    """
    subs = write_submissions(work / "submissions", lab, students)
    if also:
        also(subs)
    files = [f for f in subs.rglob("*") if f.is_file() and not f.is_symlink()]
    before = {f: f.read_bytes() for f in files}
    out = work / "grades.csv"
    done = subprocess.run(
        [sys.executable, "-m", "dpc_instructor.grade", str(subs), "--lab", lab, "--out", str(out),
         "--course", str(course or work / "course"), "--cell-timeout", str(cell_timeout),
         "--notebook-timeout", str(notebook_timeout), "--jobs", str(jobs),
         "--parameters", parameters, *args],
        capture_output=True, text=True, timeout=3000)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    after = {f: f.read_bytes() for f in files}
    assert after == before, "grading must not modify the submissions"
    leftovers = []
    for proc in psutil.process_iter():
        try:
            if str(work) in proc.cwd():
                leftovers.append(proc.cmdline())
        except psutil.Error:
            continue
    assert not leftovers, f"processes left running after grading: {leftovers}"
    with out.open(encoding="utf-8") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    seed = args[args.index("--seed") + 1] if "--seed" in args else os.environ["DPC_GRADE_SEED"]
    assert {row["seed"] for row in rows.values()} <= {seed}, "each row names the run's seed"
    return rows


def spin_argv(core: int, seconds: float | None = None) -> list[str]:
    """A process pinned to one core that burns this many seconds of CPU time, then ends (None: never)."""
    until = "True" if seconds is None else f"time.process_time() - start < {seconds}"
    return [sys.executable, "-c", f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
            f"start = time.process_time()\nwhile {until}: pass"]


@contextlib.contextmanager
def hogs_on_one_core(n: int = 4) -> Iterator[int]:
    """This process (and what it starts: the grader and its jobs) on one core, beside n processes that
    spin on it, each in a session of its own (as other users' work is: the scheduler shares a core
    between sessions, so hogs in one session would take only one share); yields the core. The hogs
    are stopped and this process's cores given back at the end."""
    mine = os.sched_getaffinity(0)
    core = min(mine)
    hogs = [subprocess.Popen(spin_argv(core), start_new_session=True) for _ in range(n)]
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, mine)
        for hog in hogs:
            hog.kill()
            hog.wait()


# What a submission must never change on the grading host: device nodes the sandbox shares, the
# instructor's source and the course's files.
HOST_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom",
              str(ROOT / "solutions" / "04-manual-towers" / "manual-towers.ipynb"), str(ROOT / "course.yml")]


def host_state() -> dict[str, tuple[int, int, int, int, int]]:
    """Mode, owner, group, size and (of regular files) modification time of HOST_FILES."""
    return {p: (s.st_mode, s.st_uid, s.st_gid, s.st_size, s.st_mtime_ns if stat.S_ISREG(s.st_mode) else 0)
            for p in HOST_FILES for s in [os.stat(p)]}


CSV_FIELDS = {"student", "grader_id", "lab", "score", "max_score", "status", "notes", "seed"}  # the rest: one column per test cell


def lost(row: dict[str, str]) -> set[str]:
    """The test cells a graded row got no points for (whatever the lab names its grade ids)."""
    return {k for k, v in row.items() if k not in CSV_FIELDS and float(v) == 0}


# Labs 5, 7 and 9 (issue 36): the hidden cases are drawn outside the kernel (the source's locked `hidden_cases`,
# dpc_instructor.grading.cases.make_cases); the kernel gets only their inputs. The correct submission also
# checks that nothing it could redraw them from reached it: it fails (and loses points) when the
# grading run's seed is in its environment or in any file of its folder (hidden-cases.json holds
# only inputs). The seed is written into the submission in hex, so the notebook itself does not hold it.
SEED_PROBE = '''import os as _os
from pathlib import Path as _Path


def _no_seed_here(seed=int("{seed:x}", 16)):
    """Raise if this process could redraw the grader's cases: the run's seed in its environment or files."""
    if "DPC_GRADE_SEED" in _os.environ:
        raise RuntimeError("the grading seed is in this process's environment")
    for f in _Path(".").rglob("*"):
        if f.is_file() and not f.is_symlink() and f.stat().st_size < 1 << 26 and str(seed).encode() in f.read_bytes():
            raise RuntimeError(f"the grading seed is in {{f}}")


_no_seed_here()
'''


def probing(answer: str, seed: int) -> str:
    """answer with SEED_PROBE run first (after its %%writefile line, if any)."""
    head, sep, rest = answer.partition("\n") if answer.startswith("%%writefile") else ("", "", answer)
    return head + sep + SEED_PROBE.format(seed=seed) + "\n\n" + rest
