"""Autograde a class's submissions of one lab: N students at once, each in a sandbox, into the
course's one gradebook.

    python -m dpc_instructor.grade SUBMISSIONS --lab 01-input-pipeline [--course DIR] [--jobs N] [--out CSV]

SUBMISSIONS holds one entry per student, any of:
    SUBMISSIONS/<student>/<lab>/<notebook>.ipynb     (nbgrader's layout; timestamp.txt and
                                                       submission_secret.txt beside it are kept:
                                                       late-submission rules, release_feedback)
    SUBMISSIONS/<student>/<notebook>.ipynb
    SUBMISSIONS/<student>.ipynb                      (labs with one notebook)
The submissions are read, never modified, and only as regular files: a symbolic link, a named
pipe, a device or a hard link anywhere on the way is refused (that student's status says so) and
nothing of its target is read; a notebook may have MAX_NOTEBOOK bytes. Any name is a student:
the grader's id for it is the name when plain, else a slug and a hash (grader_id); the CSV, the
course's gradebook exports and the feedback show the name as handed in.

Each student is graded in a private nbgrader course folder of their own (a copy of the lab's
source and an empty gradebook). `nbgrader autograde` runs in a sandbox (src/dpc_runtime/sandbox.py:
no network but its own loopback, only its own folder writable, memory/process/file-size/disk
limits, never root: as the sandbox's user) and starts the kernel in a second one that cannot read
nbgrader's database (it holds the hidden tests) and has no network at all (the kernel talks to
nbgrader over IPC sockets). Per-cell time limits come from the repository's nbgrader_config.py
(keyed on grade ids), plus a wall-clock limit per student. Before grading, what honest editing
breaks is repaired (repair: copied cells, lost or edited metadata, moved or deleted locked cells;
the note column says what was repaired).

A job that fails for the grading machine's reason, not the submission's (its sandbox or its kernel
did not start, or something outside killed it: host_failure; or a cell ran past its time limit while
the machine was busy: busy_timeout, from what the job's threads ran and waited for a CPU while that
cell ran, dpc_runtime.cpuwait), is run again, up to RETRIES more times, in the same run, each try with
twice the time limits of the one before; "not graded" then names that cause, and the run's last line
counts the students graded again and those not graded. A cell past its limit is the submission's
only when its processes were not kept waiting (a sleeping or a busy loop, a slow answer on a calm
machine): the note or the status then says what was measured. Nothing is copied out of a job (nor into one) but
folders and regular files (dpc_runtime.sandbox.copy_regular): a link the student's code left in
its folder is never followed, and the note column says what was left out.

Hidden tests draw their cases from one seed per run (dpc_runtime.judge.rng; --seed, else a new
one, printed): the reference and every student of a run see the same cases, and no answer can hold
the values of the next run's. A lab whose hidden case *is* the answer (lab 10: a drawn job and its
culprit) has them made outside every kernel (make_cases): a locked cell of its source defines
`hidden_cases(draw)`; the grader runs the source's cells up to that one in a sandbox of its own
with the run's seed and hands the reference and every student only the cases' inputs
(dpc_runtime.judge.CASES_FILE beside the notebook); their kernels get no seed (job_env), and which
test cell judges which case, and the answer the reference must give it, stay with the grader
(assign_cases).

The result is added to the course gradebook (src/dpc_instructor/gradebook.py; default build/course): a regraded
student replaces only their own lab; everyone else is untouched; runs may overlap. The CSV written
by --out has one row per student of this run; `make grades` exports the whole course.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import difflib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from dpc_instructor import gradebook, nbgrader_hooks  # the course gradebook (runs nbgrader); nbgrader's changes
from dpc_runtime import judge, manifest, notebook, sandbox

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SOCKETS = Path("/tmp/kernel-sockets")  # in nbgrader's sandbox (its own /tmp): see _grade_in


@dataclass
class Student:
    """One student's submission and what grading made of it (`name` as handed in, `id` the
    grader's: see grader_id)."""

    name: str
    id: str
    notebooks: dict[str, bytes] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)  # gradebook.KEPT files handed in beside them
    status: str = "graded"
    notes: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    cells: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    retried: list[str] = field(default_factory=list)  # why each try but the last failed (host_failure)


PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*")
JUNK = {".ipynb_checkpoints", ".DS_Store", ".git", "__MACOSX"}  # not students
MAX_NOTEBOOK = 32 << 20  # bytes a submitted notebook may have
MAX_STAMP = 1 << 10


def grader_id(name: str) -> str:
    """The grader's id for a student's name: the name itself when plain (ASCII letters, digits, '_',
    '.', single '-' inside; at most 64), else a readable ASCII slug, '--' and a hash of the name.

    A plain name never holds '--', so a hashed id never equals one; two names differing in any way
    (script, case, space vs '_') get different ids; no id starts with '-' (never read as an option).
    """
    if len(name) <= 64 and PLAIN_ID.fullmatch(name):
        return name
    raw = name.encode("utf-8", "surrogateescape")
    ascii_ = unicodedata.normalize("NFKD", raw.decode("utf-8", "replace")).encode("ascii", "ignore")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", ascii_.decode()).strip("_")[:40] or "student"
    return f"{slug}--{hashlib.sha256(raw).hexdigest()[:16]}"


def shown(name: str) -> str:
    """A name as the CSV and the gradebook show it (bytes that are not UTF-8 replaced)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def lab_notebooks(lab: str) -> list[str]:
    """Notebook names (without .ipynb) of a lab's source in solutions/."""
    src = ROOT / "solutions" / lab
    if not src.is_dir():
        labs = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
        raise SystemExit(f"grade: no lab {lab!r} in solutions/ (labs: {', '.join(labs)})")
    return sorted(p.stem for p in src.glob("*.ipynb"))


def _take(st: Student, top: int, entry: str, lab: str, names: list[str], single: bool) -> None:
    """Read st's notebooks (and gradebook.KEPT files) from the entry `entry` of the open folder top."""
    for name in names:
        options = [[entry]] if single else [[entry, lab, f"{name}.ipynb"], [entry, f"{name}.ipynb"]]
        for parts in options:
            try:
                st.notebooks[name] = sandbox.read_regular(top, parts, MAX_NOTEBOOK)
                break
            except FileNotFoundError:
                continue
    for kept in gradebook.KEPT if not single else ():
        with contextlib.suppress(FileNotFoundError):
            st.kept[kept] = sandbox.read_regular(top, [entry, lab, kept], MAX_STAMP)


def find_submissions(folder: Path, lab: str, names: list[str]) -> list[Student]:
    """One Student per entry of folder, with the notebooks read for them (or a status why not).

    Only regular files and folders are read, never through a link (sandbox.read_regular); what is refused
    becomes that student's status, and nothing of it is read or copied.
    """
    if not folder.is_dir():
        raise SystemExit(f"grade: {folder} is not a folder of submissions")
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    students = []
    try:
        for entry in sorted(os.listdir(top)):
            if entry in JUNK:
                continue
            mode = os.stat(entry, dir_fd=top, follow_symlinks=False).st_mode
            single = stat.S_ISREG(mode) and entry.endswith(".ipynb") and len(names) == 1
            name = entry[:-len(".ipynb")] if entry.endswith(".ipynb") and not stat.S_ISDIR(mode) else entry
            st = Student(shown(name), grader_id(name))
            try:
                if not (single or stat.S_ISDIR(mode)):
                    raise sandbox.Refused(f"{entry} is {sandbox.file_kind(mode)}: only regular files "
                                          f"and folders are read")
                _take(st, top, entry, lab, names, single)
            except sandbox.Refused as why:
                st.status = f"not graded: {shown(str(why))}"
                st.notebooks, st.kept = {}, {}
                students.append(st)
                continue
            missing = [n for n in names if n not in st.notebooks]
            if missing:
                st.status = f"missing notebook(s): {', '.join(n + '.ipynb' for n in missing)}"
            for nb_name, data in st.notebooks.items():
                try:
                    nb = json.loads(data.decode("utf-8"))
                    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                        raise ValueError("no cells")
                    if not all(isinstance(c, dict) and "cell_type" in c and "source" in c
                               for c in nb["cells"]):
                        raise ValueError("a cell without cell_type or source")
                except (UnicodeDecodeError, ValueError) as err:
                    st.status = f"unreadable notebook {nb_name}.ipynb: {err}"
            students.append(st)
    finally:
        os.close(top)
    kept: dict[str, Student] = {}
    for st in students:  # two entries, one student (ann/ and ann.ipynb): neither is guessed
        if st.id in kept:
            first = kept[st.id]
            first.status = (f"not graded: handed in twice (a folder and a notebook named "
                            f"{first.name}): keep one")
            first.notebooks, first.kept = {}, {}
        else:
            kept[st.id] = st
    return list(kept.values())


def repair(nb: dict, release: dict) -> tuple[dict, list[str]]:
    """nb with what honest editing breaks put right, and a note for each repair.

    - a cell id used twice (a copied cell) gets a new id; a copy of a graded cell becomes a cell of
      the student's own (the first keeps the grade id);
    - every test/locked cell gets the release's nbgrader metadata: a cell keeps its grade id when
      it has one; a cell that lost its metadata is matched to the missing release cell whose source
      it most resembles;
    - graded cells are put back in the release's order, a deleted test/locked one re-added in its
      place (the student's own cells stay after the graded cell they followed). nbgrader then
      restores the sources of test/locked cells from its database.
    """
    meta = notebook.by_grade_id(release)
    notes = []
    ids: set[str] = set()
    seen: set[str] = set()
    for cell in nb["cells"]:
        cid = cell.get("id")
        if isinstance(cid, str) and cid in ids:
            cell["id"] = uuid.uuid4().hex[:8]
            notes.append(f"gave a copied cell (id {cid}) an id of its own")
        if isinstance(cid, str):
            ids.add(cell["id"])
        gid = notebook.grade_id(cell)
        if gid in seen:
            cell.setdefault("metadata", {}).pop("nbgrader", None)
            notes.append(f"a copy of {gid} became a cell of your own (the first keeps the grade id)")
        elif gid in meta:
            seen.add(gid)
            want = notebook.nbgrader(meta[gid])
            have = notebook.nbgrader(cell)
            same = [k for k in want if k != "checksum"]  # the checksum differs with --parameters ci
            if not want.get("solution") and any(have.get(k) != want[k] for k in same):
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
    return nb, notes + _reorder(nb, release)


def _longest_in_order(order: list[str], fixed: list[str]) -> set[str]:
    """The most cells of order that already follow fixed's order (the rest are the moved ones)."""
    rank = [fixed.index(g) for g in order]
    best: list[list[int]] = []
    for i, r in enumerate(rank):
        prev = max((best[j] for j in range(i) if rank[j] < r), key=len, default=[])
        best.append([*prev, i])
    return {order[i] for i in max(best, key=len, default=[])}


def _reorder(nb: dict, release: dict) -> list[str]:
    """Put nb's graded cells in the release's order, deleted test/locked ones re-added (see repair)."""
    fixed = [g for g in map(notebook.grade_id, release["cells"]) if g]
    anchors = set(fixed)
    head: list[dict] = []
    after: dict[str, list[dict]] = {}
    present: dict[str, dict] = {}
    current = None
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid and gid in anchors:
            present[gid] = cell
            current = gid
            after[gid] = []
        else:
            (after[current] if current else head).append(cell)
    notes = []
    order = [g for g in map(notebook.grade_id, nb["cells"]) if g and g in anchors]
    moved = sorted(set(order) - _longest_in_order(order, fixed), key=fixed.index)
    if moved:
        notes.append(f"put the moved cell(s) {', '.join(moved)} back in their place")
    release_cells = notebook.by_grade_id(release)
    cells = head
    for gid in fixed:
        if gid not in present and notebook.nbgrader(release_cells[gid]).get("solution"):
            continue  # a deleted answer: its tests fail (a stub would undo an answer put elsewhere)
        if gid not in present:
            cell = json.loads(json.dumps(release_cells[gid]))
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
            if "id" in cell:  # nbformat 4.5: ids are unique
                cell["id"] = uuid.uuid4().hex[:8]
            present[gid] = cell
            notes.append(f"re-added the deleted cell {gid}")
        cells += [present[gid], *after.get(gid, [])]
    nb["cells"] = cells
    return notes


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
    seed: int  # of the hidden tests' cases (dpc_runtime.judge.seed): the reference's and every student's
    cases: str | None = None  # the notebook whose hidden cases are made outside the kernels (make_cases)
    lock: threading.Lock = field(default_factory=threading.Lock)


def job_env(scratch: Path, cell_timeout: int | None, seed: int | None, scale: float = 1) -> dict[str, str]:
    """The environment of one student's nbgrader and kernel: sandbox.clean_env, plus Jupyter's
    folders in the job folder (jupyter_client writes a kernel's connection file to TMPDIR, which the
    kernel's sandbox must see: it is the runtime folder) and the run's seed of the hidden tests;
    seed None (a lab whose hidden cases are made outside the kernel: make_cases): no seed at all,
    not even one the grader's own environment holds (the kernel's rng() draws from 0); scale: of every
    cell's time limit (dpc_runtime.manifest.cell_timeout)."""
    env = sandbox.clean_env(scratch / "home", scratch / "runtime")
    env.update(JUPYTER_PATH=str(scratch / "share"), JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    env.pop(judge.SEED_VARIABLE, None)
    if seed is not None:
        env[judge.SEED_VARIABLE] = str(seed)
    if cell_timeout:
        env["DPC_CELL_TIMEOUT"] = str(cell_timeout)
    env["DPC_CELL_TIME_SCALE"] = f"{scale:g}"
    return env


def set_parameters(path: Path, values: dict[str, object]) -> None:
    """Give the notebook at path these parameter values: `NAME = value` lines added to its
    `parameters` cell (as papermill injects them; a locked cell, so nbgrader restores it)."""
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    lines = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    cell["source"] = notebook.source(cell).rstrip("\n") + "\n# the grader's --parameters\n" + lines
    path.write_text(json.dumps(nb, indent=1))


def prepare(course: gradebook.Course, lab: str, names: list[str], cell_timeout: int | None,
            notebook_timeout: float, sandboxed: bool, seed: int, limits: sandbox.Limits = sandbox.Limits(),
            parameters: str = "defaults") -> Run:
    """The lab in the course gradebook, and a template course folder every job copies (its
    notebooks run with `parameters`: their defaults, or course.yml's `ci` values), with the
    reference's records the judge compares every student's with (reference), its hidden tests'
    cases drawn with `seed`."""
    course.add_lab(lab)
    template = course.jobs / f"template-{lab}-{uuid.uuid4().hex[:8]}"
    gradebook.nbgrader_course(template, lab)
    if parameters == "ci":
        for name in names:
            values = manifest.notebooks().get(f"solutions/{lab}/{name}.ipynb", {}).get("ci") or {}
            set_parameters(template / "source" / lab / f"{name}.ipynb", values)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    code, out = gradebook.nbgrader(["generate_assignment", lab, "--force"], template, env, 600)
    if code != 0:
        raise SystemExit(f"grade: nbgrader generate_assignment failed:\n{out}")
    release = {n: json.loads((template / "release" / lab / f"{n}.ipynb").read_text()) for n in names}
    shutil.rmtree(template / "release")
    outside = [n for n in names if cases_cell(json.loads((template / "source" / lab / f"{n}.ipynb").read_text()))
               is not None]
    if len(outside) > 1:
        raise SystemExit(f"grade: {lab}: only one notebook may define hidden_cases (here: {', '.join(outside)})")
    run = Run(course, lab, template, release, cell_timeout, notebook_timeout, limits, sandboxed, seed,
              outside[0] if outside else None)
    reference(run)
    return run


CASES_FUNCTION = "hidden_cases"  # a lab's maker of its hidden cases: hidden_cases(draw) (make_cases)
TRUTH = "hidden-truth.json"  # written by the cases job: each case's test cell and expected answer
MAX_CASES = 64 << 20  # bytes the cases' inputs (or their truth) may have


def cases_cell(nb: dict) -> int | None:
    """The index of nb's locked code cell that defines hidden_cases(draw) at its top level (a lab
    whose hidden cases the grader makes outside the kernel), else None."""
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code" or not notebook.nbgrader(cell).get("locked"):
            continue
        try:
            tree = ast.parse(notebook.source(cell))
        except SyntaxError:  # a cell magic (%%writefile): no definition of ours
            continue
        if any(isinstance(node, ast.FunctionDef) and node.name == CASES_FUNCTION for node in tree.body):
            return i
    return None


def make_cases(run: Run, name: str) -> tuple[bytes, list[dict]]:
    """The hidden cases of notebook `name`, made outside every kernel: in a sandbox of its own (no
    student's code there), the source's code cells up to the one defining hidden_cases run, then
    hidden_cases(draw) with the run's generator (dpc_runtime.judge.rng of the run's seed). Each case
    is (input, the grade id of the test cell that judges it[, the answer the reference must give]).
    Returns the inputs (JSON: what goes beside the notebook, judge.CASES_FILE) and, per case, its
    cell and expected answer (what stays with the grader: assign_cases)."""
    source = run.template / "source" / run.lab
    nb = json.loads((source / f"{name}.ipynb").read_text())
    upto = cases_cell(nb)
    assert upto is not None, name
    cells = [notebook.source(c) for c in nb["cells"][:upto + 1] if c.get("cell_type") == "code"]
    tests = {gid for gid, c in notebook.by_grade_id(nb).items() if notebook.nbgrader(c).get("grade")}
    done = None
    for _attempt in range(RETRIES + 1):
        scratch = run.course.jobs / f"cases-{run.lab}-{uuid.uuid4().hex[:8]}"
        try:
            gradebook.say_refused(sandbox.copy_regular(source, scratch, ignore=("*.ipynb", judge.CASES_FILE)),
                                  f"grade: the cases job's copy of solutions/{run.lab}")
            (scratch / "cells.json").write_text(json.dumps(cells))
            for d in (scratch / "home", scratch / "tmp"):
                d.mkdir()
            env = sandbox.clean_env(scratch / "home", scratch / "tmp")
            env[judge.SEED_VARIABLE] = str(run.seed)
            argv = [sandbox.PYTHON, "-c", "import sys; from dpc_instructor.grade import make_cases_here; "
                    "make_cases_here(sys.argv[1])", "cells.json"]
            if run.sandboxed:
                argv = sandbox.bwrap_argv(argv, writable=[scratch], env=env, cwd=scratch)
                sandbox.hand_over(scratch)
            done = sandbox.run_limited(argv, scratch, env, run.notebook_timeout, run.limits, watch=scratch)
            if done.code == 0:
                top = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    inputs = sandbox.read_regular(top, [judge.CASES_FILE], MAX_CASES)
                    truth = json.loads(sandbox.read_regular(top, [TRUTH], MAX_CASES))
                finally:
                    os.close(top)
                wrong = sorted({str(t.get("cell")) for t in truth} - tests)
                if len(json.loads(inputs)) != len(truth) or wrong:
                    raise SystemExit(f"grade: the hidden cases of {run.lab} ({name}.ipynb's {CASES_FUNCTION}) "
                                     f"name cells that are no test cells: {', '.join(wrong)}")
                return inputs, truth
            if host_failure(done) is None:
                break
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    tail = done.output[-3000:] if done else ""
    raise SystemExit(f"grade: the hidden cases of {run.lab} could not be made (solutions/{run.lab}/{name}.ipynb "
                     f"up to its {CASES_FUNCTION}, exit {done.code if done else '?'}):\n{tail}")


def make_cases_here(cells_file: str) -> None:
    """The cases job's own code (make_cases), in its sandbox: run the cells, then hidden_cases(draw);
    write the inputs (judge.CASES_FILE) and each case's cell and expected answer (TRUTH)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for i, cell in enumerate(json.loads(Path(cells_file).read_text())):
        if not shell.run_cell(cell).success:  # its traceback is printed
            raise SystemExit(f"make_cases: code cell {i} of the source failed")
    inputs, truth = [], []
    for case in shell.user_ns[CASES_FUNCTION](judge.rng()):
        inputs.append(case[0])
        truth.append({"cell": case[1], **({"expect": judge.plain(case[2])} if len(case) > 2 else {})})
    Path(judge.CASES_FILE).write_text(json.dumps(inputs))
    Path(TRUTH).write_text(json.dumps(truth))


def assign_cases(records: dict[str, list[dict]], truth: list[dict]) -> None:
    """The reference's records of one notebook ({grade id: records}) judged as the cases' truth
    says, in place: a record of case i (judge.record's `case`) counts only in the test cell case i
    belongs to, everywhere else judged=False (so every test cell can run the student's code on all
    cases, and the kernel never learns which case is which cell's); there the reference's value must
    be the expected answer, when the case has one. Raises ValueError when the reference gets a case
    wrong or a case is recorded in no cell of its own."""
    seen = set()
    for gid, items in records.items():
        for item in items:
            case = item.get("case")
            if case is None:
                continue
            if not isinstance(case, int) or not 0 <= case < len(truth):
                raise ValueError(f"{gid} recorded {item.get('name')!r} for case {case!r} of {len(truth)}")
            mine = truth[case]["cell"] == gid
            item["judged"] = item.get("judged") is not False and mine
            if not mine:
                continue
            seen.add(case)
            if "expect" in truth[case] and (why := judge.verdict([{**item, "value": truth[case]["expect"]}], [item])):
                raise ValueError(f"{gid} got the hidden case {case} wrong: {why}")
    missing = sorted(set(range(len(truth))) - seen)
    if missing:
        raise ValueError(f"no test cell recorded the hidden case(s) {missing} in the cell each belongs to")


def grade_one(st: Student, run: Run) -> Student:
    """Grade one student; whatever goes wrong is that student's status, never the whole run's."""
    try:
        return _grade_one(st, run)
    except Exception as err:  # noqa: BLE001  (a malformed notebook must not stop the class)
        st.status = f"not graded: the grader could not process this submission ({type(err).__name__}: {err})"
        return record(st, run, None)


def _grade_one(st: Student, run: Run) -> Student:
    """Grade one student in a private course folder and sandbox, again when a try fails for the
    grading machine's reason (host_failure); add the result to the gradebook."""
    if st.status != "graded":
        return record(st, run, None)
    notebooks = {}
    for name, data in st.notebooks.items():
        nb, notes = repair(json.loads(data.decode("utf-8")), run.release[name])
        st.notes += [f"{name}: {n}" for n in notes]
        notebooks[name] = nb
    start = time.monotonic()

    def judged(scratch: Path, done: sandbox.Outcome, host: str | None) -> Student:
        st.seconds = time.monotonic() - start
        return _grade_in(st, run, scratch, done, host)

    return _tries(run, st.id, notebooks, st.kept,
                  lambda scratch: nbgrader_hooks.job_config(reference=scratch / REFERENCE), judged, st.retried)


RETRIES = 2  # more tries of a job that failed for the grading machine's reason (host_failure)
# jupyter_client's words for a kernel that never started (before any cell of the notebook ran)
KERNEL_NOT_STARTED = ("Kernel died before replying to kernel_info", "Kernel didn't respond in")
HOST_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}


def host_failure(done: sandbox.Outcome) -> str | None:
    """Why a job failed for the grading machine's reason, not the submission's (None: it did not).

    Its sandbox did not start (bwrap's own error, before anything ran); a kernel's did not, or its
    kernel died or stayed silent before any cell ran (jupyter_client's error while starting it);
    or the job was killed by a signal none of our limits sends (its time limit ends it with -1,
    its memory, disk and file-size limits are named by the outcome and the exit code). Student
    code cannot reach the job's processes (its kernel has a PID namespace of its own).
    """
    if done.code in (0, -1) or done.out_of_memory or done.disk_full:
        return None
    lines = [ln.strip() for ln in done.output.splitlines() if ln.strip()]
    bwrap = next((ln for ln in lines if ln.startswith("bwrap: ")), None)
    if lines and lines[0].startswith("bwrap: "):
        return f"its sandbox did not start ({lines[0]})"
    kernel = next((ln for ln in lines if any(words in ln for words in KERNEL_NOT_STARTED)), None)
    if kernel:
        return f"the kernel did not start ({bwrap or kernel})"
    number = -done.code if done.code < 0 else done.code - 128 if done.code > 128 else 0
    if number in HOST_SIGNALS:
        return f"the job was killed from outside ({signal.Signals(number).name}), not by a limit"
    return None


def cell_timeouts(output: str) -> list[tuple[str, int, float]]:
    """The cells that ran past their time limit in a job, from its log (nbgrader_hooks.TimedExecute's
    lines): (the cell's grade id, or its index, its limit in s, when it was interrupted: time.time())."""
    return [(m[1], int(m[2]), float(m[3])) for m in re.finditer(nbgrader_hooks.TIMEOUT_LINE, output)]


def cpu_while(done: sandbox.Outcome, limit: float, end: float) -> tuple[float, float]:
    """Seconds the job's threads ran, and waited for a CPU, in the `limit` seconds before `end`."""
    return done.cpu.between(end - limit, end) if done.cpu else (0.0, 0.0)


def busy_timeout(done: sandbox.Outcome) -> str | None:
    """Why a try whose kernel ran was the machine's failure: a cell ran past its time limit while the
    job's threads waited for a CPU longer than they ran (they got less than half the CPU they wanted:
    the same cell on a calm machine takes at most half the time) and for at least a quarter of the
    limit. None when no cell ran past its limit, or the time was the submission's (a spinning cell
    runs; a sleeping one neither runs nor waits: the few seconds it waits beside other work are not
    what kept it past its limit)."""
    for gid, limit, end in cell_timeouts(done.output):
        ran, waited = cpu_while(done, limit, end)
        if waited > max(ran, limit / 4):
            return (f"cell {gid} ran past its {limit} s limit while the job's processes waited {waited:.0f} s "
                    f"for a CPU and ran {ran:.0f} s: the machine was busy")
    return None


def measured(done: sandbox.Outcome) -> str:
    """What the job's threads did while its first cell past its limit ran, in words ('' when none did)."""
    for gid, limit, end in cell_timeouts(done.output)[:1]:
        ran, waited = cpu_while(done, limit, end)
        return (f"cell {gid}: in its {limit} s the job's processes ran {ran:.1f} s and waited "
                f"{waited:.1f} s for a CPU")
    return ""


T = TypeVar("T")


def _tries(run: Run, sid: str, notebooks: dict[str, dict], kept: dict[str, bytes],
           config: Callable[[Path], str], then: Callable[[Path, sandbox.Outcome, str | None], T],
           retried: list[str]) -> T:
    """_autograde in a fresh job folder, up to RETRIES more times while a try fails for the grading
    machine's reason (host_failure, busy_timeout; each cause added to retried), each try with twice
    the time limits of the one before; then(job folder, outcome, that reason or None) of the last
    try, while its folder is still there (removed after)."""
    for attempt in range(RETRIES + 1):
        scratch = run.course.jobs / f"{run.lab}-{sid}-{uuid.uuid4().hex[:8]}"
        try:
            done = _autograde(run, scratch, sid, notebooks, kept, config(scratch), scale=2 ** attempt)
            host = host_failure(done) or busy_timeout(done)
            if host is None or attempt == RETRIES:
                return then(scratch, done, host)
            retried.append(host)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    raise AssertionError("unreachable")


def _autograde(run: Run, scratch: Path, sid: str, notebooks: dict[str, dict], kept: dict[str, bytes],
               config: str, scale: float = 1) -> sandbox.Outcome:
    """Run nbgrader's autograde of these notebooks for student sid in the job folder scratch (a
    copy of the template), sandboxed; `config`: the job's lines for nbgrader_hooks (the judge's);
    scale: of the cells' and the notebook's time limits."""
    lab = run.lab
    gradebook.say_refused(sandbox.copy_regular(run.template, scratch), "grade: the job's template")
    gradebook.nbgrader_course(scratch, lab, write_source=False)
    with (scratch / "nbgrader_config.py").open("a") as f:
        f.write(config)
    dest = scratch / "submitted" / sid / lab
    dest.mkdir(parents=True)
    for name, nb in notebooks.items():
        (dest / f"{name}.ipynb").write_text(json.dumps(nb))
    for name, data in kept.items():
        (dest / name).write_bytes(data)
    home, khome = scratch / "home", scratch / "kernel-home"
    for d in (home, khome, scratch / "runtime", scratch / "share", scratch / "autograded"):
        d.mkdir()
    env = job_env(scratch, run.cell_timeout, None if run.cases else run.seed, scale)
    argv = [str(BIN / "nbgrader"), "autograde", lab, f"--student={sid}", "--force"]
    if run.sandboxed:
        graded = scratch / "autograded" / sid / lab
        # The kernel's home is its own: nbgrader's holds the course's configuration. It sees its
        # graded folder, its home, the runtime folder (its connection file) and SOCKETS (its IPC
        # sockets: a short path in the private /tmp of nbgrader's sandbox, as a socket's must be).
        # Not the rest of the job folder: the reference's records and gradebook.db (hidden tests).
        sandbox.kernel_spec(scratch / "share", writable=[graded, khome, scratch / "runtime", SOCKETS],
                            setenv={"HOME": str(khome), "IPYTHONDIR": str(khome / ".ipython"),
                                    "TMPDIR": "/tmp"})
        with (scratch / "nbgrader_config.py").open("a") as f:  # the kernel's sandbox has no network
            f.write(f"import os\nos.makedirs({str(SOCKETS)!r}, exist_ok=True)\n"
                    "c.KernelManager.transport = 'ipc'\n"
                    f"c.KernelManager.ip = {str(SOCKETS / 'kernel')!r}\n")
        # nbgrader (trusted) runs as the sandbox's user, never root, in a sandbox of its own that
        # can start the kernel's (host_proc).
        argv = sandbox.bwrap_argv(argv, writable=[scratch], env=env, cwd=scratch, host_proc=True)
        sandbox.hand_over(scratch)
    return sandbox.run_limited(argv, scratch, env, run.notebook_timeout * scale, run.limits, watch=scratch)


REFERENCE = "reference-records.json"  # in the template: the judge's reference (see reference)


def reference(run: Run) -> None:
    """Run the lab's source (the solution, hidden tests included) through the grader once, and keep
    what its test cells recorded as every student's reference (dpc_runtime.judge), in the
    template. Cached in the course (or the folder DPC_REFERENCES names), keyed by a hash of the
    notebooks, of the judge's and grader's code and of the run's seed (the hidden tests' cases).
    A lab with hidden cases made outside the kernel (run.cases): they are made first (make_cases),
    go beside the notebook in the template (the reference and every student run on those inputs)
    and are cached with the records, which say which cell judges each case (assign_cases)."""
    lab = run.lab
    sources = {n: (run.template / "source" / lab / f"{n}.ipynb").read_bytes() for n in sorted(run.release)}
    key = hashlib.sha256(f"seed {run.seed}\0".encode())
    for name, data in sources.items():
        key.update(name.encode() + b"\0" + data)
    for path in (judge.__file__, nbgrader_hooks.__file__, __file__):
        key.update(Path(path or "").read_bytes())
    folder = Path(os.environ.get("DPC_REFERENCES") or run.course.root / "references")
    cached = folder / f"{lab}-{key.hexdigest()[:16]}.json"
    cached_cases = cached.with_name(f"{cached.stem}.cases.json")
    beside = run.template / "source" / lab / judge.CASES_FILE
    if not cached.exists() or (run.cases and not cached_cases.exists()):
        truth: list[dict] | None = None
        if run.cases:
            inputs, truth = make_cases(run, run.cases)
            beside.write_bytes(inputs)

        def keep(scratch: Path, done: sandbox.Outcome, host: str | None) -> None:
            records = scratch / "records.json"
            failed = (f"{host} on all {RETRIES + 1} tries" if host
                      else None if done.code == 0 else why_failed(done, run.limits))
            if failed is None:
                from nbgrader.api import Gradebook

                with Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as gb:
                    score, most, cells, _ = gradebook.Course.scores(gb, lab, "reference")
                lost = [c for c, points in cells.items() if not points]
                failed = f"its test cells {', '.join(lost)} failed" if score < most and lost else None
            if failed or not records.exists():
                raise SystemExit(f"grade: the reference solution of {lab} (solutions/{lab}) does not pass "
                                 f"its own tests: {failed or 'no records'}\n{done.output[-3000:]}")
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.name}.{uuid.uuid4().hex[:6]}")
            if truth is not None and run.cases:
                top = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    saved = json.loads(sandbox.read_regular(top, ["records.json"], MAX_CASES))
                finally:
                    os.close(top)
                try:
                    assign_cases(saved.get(run.cases, {}), truth)
                except ValueError as err:
                    raise SystemExit(f"grade: the reference solution of {lab} (solutions/{lab}) does not pass "
                                     f"its own hidden cases: {err}") from None
                tmp.write_text(json.dumps(saved))
                cases_tmp = cached_cases.with_name(f"{cached_cases.name}.{uuid.uuid4().hex[:6]}")
                cases_tmp.write_bytes(beside.read_bytes())
                cases_tmp.replace(cached_cases)  # before the records: they mark the pair complete
            else:
                gradebook.say_refused(sandbox.copy_regular(records, tmp), "grade: the reference's records")
            tmp.replace(cached)  # two runs computing it at once: either's whole file

        retried: list[str] = []
        _tries(run, "reference", {n: json.loads(d) for n, d in sources.items()}, {},
               lambda scratch: nbgrader_hooks.job_config(record_to=scratch / "records.json"), keep, retried)
        for cause in retried:
            print(f"grade: the reference of {lab} was graded again: {cause}", file=sys.stderr)
    elif run.cases:
        gradebook.say_refused(sandbox.copy_regular(cached_cases, beside), "grade: the hidden cases")
    gradebook.say_refused(sandbox.copy_regular(cached, run.template / REFERENCE), "grade: the reference's records")


def _grade_in(st: Student, run: Run, scratch: Path, done: sandbox.Outcome, host: str | None) -> Student:
    """st's grade from the outcome `done` of the last try in the job folder scratch (removed by the
    caller), judged against the reference; host: that try's failure of the grading machine
    (host_failure, busy_timeout)."""
    code, out = done.code, done.output
    if st.retried:
        st.notes.append("graded again after a failure of the grading machine, not of this submission: "
                        + "; ".join(f"try {i}: {cause}" for i, cause in enumerate(st.retried, 1)))
    if host and (code == 0 or code == -1):  # the last try too ran past a limit on a busy machine
        st.status = (f"not graded: {host}, on all {RETRIES + 1} tries: the grading machine's failure, not "
                     f"the submission's; grade again when the machine is calmer")
    elif done.disk_full:
        st.status = (f"not graded: wrote more than {run.limits.disk >> 20} MiB of files in all (the "
                     f"limit for one student's files); stopped there")
    elif code == -1:
        st.status = (f"not graded: still running after {run.notebook_timeout * 2 ** len(st.retried):.0f} s "
                     f"(a cell that survives interrupts?): grade by hand")
    elif done.out_of_memory:
        st.status = f"not graded: used more than {run.limits.memory >> 30} GiB of memory"
    elif code == 0 and cell_timeouts(out):  # graded; the interrupted cell lost its points
        st.notes.append(f"{measured(done)}: past its limit by itself, not for want of a CPU")
    if code != 0 and not st.status.startswith("not graded"):
        log = run.course.root / "logs" / f"autograde-{run.lab}-{st.id}.log"
        log.parent.mkdir(exist_ok=True)
        log.write_text(out)
        why = (f"{host}, on all {RETRIES + 1} tries: the grading machine's failure, not the "
               f"submission's; grade again" if host else why_failed(done, run.limits))
        st.status = f"not graded: {why} (log: {log})"
    return record(st, run, scratch if st.status == "graded" else None)


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


def why_failed(done: sandbox.Outcome, limits: sandbox.Limits) -> str:
    """One line on why nbgrader gave up on a notebook, from its log and what its threads did."""
    log, code = done.output, done.code
    if code in (-25, 153) or "File size limit exceeded" in log:
        return f"wrote a file over {limits.file_size >> 20} MiB (the limit for any one file)"
    if "CellTimeoutError" in log:
        preview = re.search(r"preview of the cell contents:\s*\n\s*-+\s*\n(.*?)\n", log)
        cell = f" ({preview.group(1).strip()!r} ...)" if preview else ""
        calm = f" ({measured(done)}: not for want of a CPU)" if cell_timeouts(log) else ""
        return (f"a cell{cell} kept running after its time limit and an interrupt{calm} (does it catch "
                f"KeyboardInterrupt or BaseException?); nbgrader cannot grade the rest: grade by hand")
    errors = [ln.split("|", 1)[-1].strip() for ln in log.splitlines() if "| ERROR]" in ln]
    return "autograde failed: " + (errors[0] if errors else (log.strip().splitlines() or ["?"])[-1])


def default_jobs(lab: str, students: int) -> int:
    """As many students at once as the machine has cores for the lab's ranks (at least 1)."""
    return max(1, min(students, (os.cpu_count() or 1) // manifest.lab_ranks(lab)))


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
    p.add_argument("--parameters", choices=["defaults", "ci"], default="defaults",
                   help="run the notebooks with their own parameters (what students run) or with "
                        "course.yml's ci values (smaller: a quick pass on a small machine)")
    p.add_argument("--disk-mb", type=int, default=sandbox.Limits.disk >> 20,
                   help="MiB of files one student's grading may write in all (stopped there)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="wall-clock seconds for one student's whole lab")
    p.add_argument("--seed", type=int, default=None,
                   help=f"seed of the hidden tests' cases (default: ${judge.SEED_VARIABLE}, else a new "
                        "one for this run); the same seed grades the same cases again")
    s = p.add_argument_group("grading spread over a SLURM cluster (src/dpc_instructor/spread.py)")
    s.add_argument("--slurm", action="store_true",
                   help="one SLURM array task per student; the same command again resumes the run")
    s.add_argument("--partition", default=None, help="sbatch --partition of the tasks")
    s.add_argument("--account", default=None, help="sbatch --account of the tasks")
    s.add_argument("--max-running", type=int, default=None, help="tasks of the array running at once")
    s.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="one more sbatch option for the tasks (repeat it), e.g. --sbatch=--mem=8G")
    a = p.parse_args(argv)
    sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # any name, any locale
    sandboxed = not sandbox.disabled()
    sandbox.require()
    names = lab_notebooks(a.lab)
    students = find_submissions(a.submissions.resolve(), a.lab, names)
    if not students:
        raise SystemExit(f"grade: {a.submissions} holds no submissions")
    course = gradebook.Course(a.course or gradebook.DEFAULT)
    spread_run = None
    if a.slurm:
        from dpc_instructor import spread  # it builds on this module

        spread_run = spread.run_folder(course, a.lab, students)
    try:
        seed = (spread.seed_of(spread_run, a.seed) if spread_run else None)
        if seed is None:
            seed = a.seed if a.seed is not None else (
                judge.seed() if os.environ.get(judge.SEED_VARIABLE) else secrets.randbelow(1 << 31))
    except ValueError as err:
        raise SystemExit(f"grade: {err}") from None
    if seed < 0:
        raise SystemExit(f"grade: --seed must be a non-negative integer (got {seed})")
    with spread.only_one(spread_run) if spread_run else contextlib.nullcontext():
        return _run(a, course, names, students, seed, sandboxed, spread_run)


def _run(a: argparse.Namespace, course: gradebook.Course, names: list[str], students: list[Student], seed: int,
         sandboxed: bool, spread_run: Path | None) -> int:
    """main's grading run: the reference, then the students here or over SLURM (spread_run)."""
    jobs = a.jobs or default_jobs(a.lab, len(students))
    where = f"over SLURM ({spread_run})" if spread_run else f"{jobs} at a time"
    print(f"grading {len(students)} submission(s) of {a.lab} into {course.root}, {where}"
          f"{'' if sandboxed else ' (NOT sandboxed)'}; hidden tests drawn with --seed {seed}")
    run = prepare(course, a.lab, names, a.cell_timeout, a.notebook_timeout, sandboxed, seed,
                  sandbox.Limits(disk=a.disk_mb << 20), a.parameters)
    start = time.monotonic()
    try:
        if spread_run:
            from dpc_instructor import spread

            options = spread.Options(a.partition, a.account, a.sbatch, a.max_running)
            students = spread.grade_over_slurm(students, run, spread_run, options)
        else:
            with ThreadPoolExecutor(jobs) as pool:
                for st in pool.map(lambda s: grade_one(s, run), students):
                    again = f", graded again {len(st.retried)}x" if st.retried else ""
                    print(f"  {st.name}: {st.score:g} / {st.max_score:g}  {st.status} ({st.seconds:.0f} s{again})",
                          flush=True)
    finally:
        shutil.rmtree(run.template, ignore_errors=True)
    took = time.monotonic() - start
    write_csv(students, a.lab, seed, a.out)
    retried = sum(bool(st.retried) for st in students)
    ungraded = sum(st.status.startswith("not graded") for st in students)
    print(f"graded {len(students)} in {took:.0f} s ({60 * len(students) / max(took, 1e-9):.2f} "
          f"students/min {'over SLURM' if spread_run else f'at {jobs} job(s)'}); {retried} graded again after a "
          f"failure of the grading machine, {ungraded} not graded; grades written to {a.out}")
    if spread_run and ungraded:
        lost = sum("SLURM task ended without a result" in st.status for st in students)
        if lost:
            print(f"grade: {lost} student(s) not graded because their task ended without a result: run the "
                  f"same command again to grade them (nobody is graded twice)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
