"""The reference run: the lab's source (the solution, hidden tests included) graded once per lab and
seed like a student, its test cells' records kept as every student's reference (dpc_runtime.judge),
cached in the course. A reference that does not pass its own tests stops the run: nobody is graded
against it.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from dpc_instructor import gradebook, nbgrader_hooks
from dpc_instructor.grading.cases import MAX_CASES, assign_cases, make_cases
from dpc_instructor.grading.failures import why_failed
from dpc_instructor.grading.job import RETRIES, tries
from dpc_instructor.grading.run import REFERENCE, Run
from dpc_runtime import judge, sandbox

GRADER = sorted(Path(__file__).parent.glob("*.py"))  # the grader's code: a change of it makes a new reference


@dataclass
class Cached:
    """Where one reference run is kept in the course, and where its hidden cases go in the template."""

    records: Path  # what its test cells recorded (REFERENCE in the template)
    cases: Path  # the hidden cases' inputs it ran on (a lab with cases made outside the kernel)
    beside: Path  # those inputs beside the template's notebook (judge.CASES_FILE)


def cached_at(run: Run, sources: dict[str, bytes]) -> Cached:
    """Where the reference of run is cached (the course's references/, or the folder DPC_REFERENCES
    names): keyed by a hash of the notebooks, of the judge's and grader's code and of the run's seed."""
    key = hashlib.sha256(f"seed {run.seed}\0".encode())
    for name, data in sources.items():
        key.update(name.encode() + b"\0" + data)
    for path in (Path(judge.__file__ or ""), Path(nbgrader_hooks.__file__ or ""), *GRADER):
        key.update(path.read_bytes())
    folder = Path(os.environ.get("DPC_REFERENCES") or run.course.root / "references")
    records = folder / f"{run.lab}-{key.hexdigest()[:16]}.json"
    return Cached(records, records.with_name(f"{records.stem}.cases.json"),
                  run.template / "source" / run.lab / judge.CASES_FILE)


def reference(run: Run) -> None:
    """Run the lab's source (the solution, hidden tests included) through the grader once, and keep
    what its test cells recorded as every student's reference (dpc_runtime.judge), in the
    template; cached (cached_at). A lab with hidden cases made outside the kernel (run.cases): they
    are made first (cases.make_cases), go beside the notebook in the template (the reference and
    every student run on those inputs) and are cached with the records, which say which cell judges
    each case (cases.assign_cases)."""
    sources = {n: (run.template / "source" / run.lab / f"{n}.ipynb").read_bytes() for n in sorted(run.release)}
    cache = cached_at(run, sources)
    if not cache.records.exists() or (run.cases and not cache.cases.exists()):
        _run_reference(run, sources, cache)
    elif run.cases:
        gradebook.say_refused(sandbox.copy_regular(cache.cases, cache.beside), "grade: the hidden cases")
    gradebook.say_refused(sandbox.copy_regular(cache.records, run.template / REFERENCE),
                          "grade: the reference's records")


def _run_reference(run: Run, sources: dict[str, bytes], cache: Cached) -> None:
    """The reference graded (tried again as a student's job is), its hidden cases made first when the
    lab has them, what it recorded kept in the cache."""
    truth: list[dict] | None = None
    if run.cases:
        inputs, truth = make_cases(run, run.cases)
        cache.beside.write_bytes(inputs)

    def keep(scratch: Path, done: sandbox.Outcome, host: str | None) -> None:
        """The last try's records kept, when the reference passed all its own tests."""
        _check_passes(run, scratch, done, host)
        _keep(run, scratch, cache, truth)

    retried: list[str] = []
    tries(run, "reference", {n: json.loads(d) for n, d in sources.items()}, {},
          lambda scratch: nbgrader_hooks.job_config(record_to=scratch / "records.json"), keep, retried)
    for cause in retried:
        print(f"grade: the reference of {run.lab} was graded again: {cause}", file=sys.stderr)


def _lost_cells(lab: str, scratch: Path) -> str | None:
    """Which of the reference's test cells lost points in its job's gradebook (None: none did)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as gb:
        score, most, cells, _ = gradebook.Course.scores(gb, lab, "reference")
    lost = [c for c, points in cells.items() if not points]
    return f"its test cells {', '.join(lost)} failed" if score < most and lost else None


def _check_passes(run: Run, scratch: Path, done: sandbox.Outcome, host: str | None) -> None:
    """Stop the run unless the reference's last try (done, in the job folder scratch) passed all its
    own tests and left its records."""
    failed = (f"{host} on all {RETRIES + 1} tries" if host
              else None if done.code == 0 else why_failed(done, run.limits))
    if failed is None:
        failed = _lost_cells(run.lab, scratch)
    if failed or not (scratch / "records.json").exists():
        raise SystemExit(f"grade: the reference solution of {run.lab} (solutions/{run.lab}) does not pass "
                         f"its own tests: {failed or 'no records'}\n{done.output[-3000:]}")


def _keep(run: Run, scratch: Path, cache: Cached, truth: list[dict] | None) -> None:
    """The reference's records (and hidden cases) kept in the cache, each file whole: two runs
    computing it at once keep either's."""
    cache.records.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.records.with_name(f"{cache.records.name}.{uuid.uuid4().hex[:6]}")
    if truth is not None and run.cases:
        _keep_with_cases(run, run.cases, scratch, cache, truth, tmp)
    else:
        gradebook.say_refused(sandbox.copy_regular(scratch / "records.json", tmp), "grade: the reference's records")
    tmp.replace(cache.records)


def _keep_with_cases(run: Run, name: str, scratch: Path, cache: Cached, truth: list[dict], tmp: Path) -> None:
    """The records of notebook `name` judged as the hidden cases' truth says (assign_cases), written to
    tmp; the cases' inputs cached first (the records, renamed after, mark the pair complete)."""
    top = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        saved = json.loads(sandbox.read_regular(top, ["records.json"], MAX_CASES))
    finally:
        os.close(top)
    try:
        assign_cases(saved.get(name, {}), truth)
    except ValueError as err:
        raise SystemExit(f"grade: the reference solution of {run.lab} (solutions/{run.lab}) does not pass "
                         f"its own hidden cases: {err}") from None
    tmp.write_text(json.dumps(saved))
    cases_tmp = cache.cases.with_name(f"{cache.cases.name}.{uuid.uuid4().hex[:6]}")
    cases_tmp.write_bytes(cache.beside.read_bytes())
    cases_tmp.replace(cache.cases)  # before the records: they mark the pair complete
