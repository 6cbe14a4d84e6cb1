"""Hidden cases made outside every kernel: for a lab whose hidden case *is* the answer (lab 10: a
drawn job and its culprit), the cases are made by the grader, never in a student's kernel.

Hidden tests draw their cases from one seed per run (dpc_runtime.judge.rng; --seed, else a new
one, printed): the reference and every student of a run see the same cases, and no answer can hold
the values of the next run's. A lab whose cases are made outside every kernel (make_cases) has a
locked cell of its source that defines `hidden_cases(draw)`; the grader runs the source's cells up
to that one in a sandbox of its own with the run's seed and hands the reference and every student
only the cases' inputs (dpc_runtime.judge.CASES_FILE beside the notebook); their kernels get no seed
(job.job_env), and which test cell judges which case, and the answer the reference must give it,
stay with the grader (assign_cases).
"""
from __future__ import annotations

import ast
import json
import os
import uuid
from pathlib import Path

from dpc_instructor import gradebook
from dpc_instructor.grading.failures import host_failure
from dpc_instructor.grading.job import with_retries
from dpc_instructor.grading.run import Run
from dpc_runtime import judge, notebook, sandbox

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
    cell and expected answer (what stays with the grader: assign_cases). Made again while the job
    fails for the grading machine's reason (host_failure: job.with_retries)."""
    nb = json.loads((run.template / "source" / run.lab / f"{name}.ipynb").read_text())
    upto = cases_cell(nb)
    assert upto is not None, name
    cells = [notebook.source(c) for c in nb["cells"][:upto + 1] if c.get("cell_type") == "code"]
    tests = {gid for gid, c in notebook.by_grade_id(nb).items() if notebook.nbgrader(c).get("grade")}

    def made(scratch: Path, done: sandbox.Outcome, _host: str | None) -> tuple[bytes, list[dict]]:
        """The cases the last try wrote, or the run stopped with why it could not make them."""
        if done.code != 0:
            raise SystemExit(f"grade: the hidden cases of {run.lab} could not be made (solutions/{run.lab}/"
                             f"{name}.ipynb up to its {CASES_FUNCTION}, exit {done.code}):\n{done.output[-3000:]}")
        return _read_cases(run, name, scratch, tests)

    return with_retries(lambda: run.course.jobs / f"cases-{run.lab}-{uuid.uuid4().hex[:8]}",
                        lambda scratch, _number: _cases_job(run, scratch, cells),
                        lambda done: None if done.code == 0 else host_failure(done), made, [])


def _cases_job(run: Run, scratch: Path, cells: list[str]) -> sandbox.Outcome:
    """One try of the cases job in the folder scratch: the lab's files but its notebooks, the cells
    to run (cells.json), make_cases_here with the run's seed, sandboxed."""
    source = run.template / "source" / run.lab
    gradebook.say_refused(sandbox.copy_regular(source, scratch, ignore=("*.ipynb", judge.CASES_FILE)),
                          f"grade: the cases job's copy of solutions/{run.lab}")
    (scratch / "cells.json").write_text(json.dumps(cells))
    for d in (scratch / "home", scratch / "tmp"):
        d.mkdir()
    env = sandbox.clean_env(scratch / "home", scratch / "tmp")
    env[judge.SEED_VARIABLE] = str(run.seed)
    argv = [sandbox.PYTHON, "-c", "import sys; from dpc_instructor.grading.cases import make_cases_here; "
            "make_cases_here(sys.argv[1])", "cells.json"]
    if run.sandboxed:
        argv = sandbox.bwrap_argv(argv, writable=[scratch], env=env, cwd=scratch)
        sandbox.hand_over(scratch)
    return sandbox.run_limited(argv, scratch, env, run.notebook_timeout, run.limits, watch=scratch)


def _read_cases(run: Run, name: str, scratch: Path, tests: set[str]) -> tuple[bytes, list[dict]]:
    """The inputs and truth a cases job wrote in scratch (regular files only), each case's cell one of
    the notebook's test cells `tests`."""
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
