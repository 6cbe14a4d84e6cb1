"""Autograde a class's submissions of one lab: N students at once, each in a sandbox, into the
course's one gradebook.

    python -m dpc_instructor.grade SUBMISSIONS --lab 01-input-pipeline [--course DIR] [--jobs N] [--out CSV]

The command line of the grader: it reads the submissions (grading.intake), picks the run's seed of the
hidden tests, prepares the run (grading.template: the template and the reference) and grades every
student, here at --jobs at once (grading.job.grade_one) or over a SLURM cluster (--slurm:
src/dpc_instructor/spread.py), then writes the CSV (grading.record). What each stage does, in the
order data flows through them: the package src/dpc_instructor/grading/ (its __init__.py).
Run it as `python -m dpc_instructor.grade`; nothing imports it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dpc_instructor import gradebook, spread
from dpc_instructor.grading.intake import Student, find_submissions, lab_notebooks
from dpc_instructor.grading.job import grade_one
from dpc_instructor.grading.record import write_csv
from dpc_instructor.grading.run import Run, default_jobs
from dpc_instructor.grading.template import prepare
from dpc_runtime import judge, sandbox


def parser() -> argparse.ArgumentParser:
    """The command line's options: a local run, and those of a run spread over SLURM."""
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
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
    return p


def run_seed(asked: int | None, spread_run: Path | None) -> int:
    """The run's seed of the hidden tests: a resumed SLURM run's, else --seed, else $DPC_GRADE_SEED,
    else a new one."""
    try:
        seed = (spread.seed_of(spread_run, asked) if spread_run else None)
        if seed is None:
            seed = asked if asked is not None else (
                judge.seed() if os.environ.get(judge.SEED_VARIABLE) else secrets.randbelow(1 << 31))
    except ValueError as err:
        raise SystemExit(f"grade: {err}") from None
    if seed < 0:
        raise SystemExit(f"grade: --seed must be a non-negative integer (got {seed})")
    return seed


def main(argv: list[str] | None = None) -> int:
    """Grade the submissions of one lab as the command line says; the exit status (1: a SLURM run
    left students without a result)."""
    a = parser().parse_args(argv)
    sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]  # any name, any locale
    sandboxed = not sandbox.disabled()
    sandbox.require()
    names = lab_notebooks(a.lab)
    students = find_submissions(a.submissions.resolve(), a.lab, names)
    if not students:
        raise SystemExit(f"grade: {a.submissions} holds no submissions")
    course = gradebook.Course(a.course or gradebook.DEFAULT)
    spread_run = spread.run_folder(course, a.lab, students) if a.slurm else None
    seed = run_seed(a.seed, spread_run)
    with spread.only_one(spread_run) if spread_run else contextlib.nullcontext():
        return _run(a, course, names, students, seed, sandboxed, spread_run)


def grade_here(students: list[Student], run: Run, jobs: int) -> list[Student]:
    """Grade students on this machine, `jobs` at once, each one's line printed as it is graded."""
    graded = []
    with ThreadPoolExecutor(jobs) as pool:
        for st in pool.map(lambda s: grade_one(s, run), students):
            again = f", graded again {len(st.retried)}x" if st.retried else ""
            print(f"  {st.name}: {st.score:g} / {st.max_score:g}  {st.status} ({st.seconds:.0f} s{again})",
                  flush=True)
            graded.append(st)
    return graded


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
            options = spread.Options(a.partition, a.account, a.sbatch, a.max_running)
            students = spread.grade_over_slurm(students, run, spread_run, options)
        else:
            students = grade_here(students, run, jobs)
    finally:
        shutil.rmtree(run.template, ignore_errors=True)
    took = time.monotonic() - start
    write_csv(students, a.lab, seed, a.out)
    return _summary(students, took, a.out, jobs, spread_run)


def _summary(students: list[Student], took: float, out: Path, jobs: int, spread_run: Path | None) -> int:
    """The run's last line (how many were graded, how fast, graded again, not graded); the exit
    status: 1 when a SLURM task ended without a result (the same command grades them)."""
    retried = sum(bool(st.retried) for st in students)
    ungraded = sum(st.status.startswith("not graded") for st in students)
    print(f"graded {len(students)} in {took:.0f} s ({60 * len(students) / max(took, 1e-9):.2f} "
          f"students/min {'over SLURM' if spread_run else f'at {jobs} job(s)'}); {retried} graded again after a "
          f"failure of the grading machine, {ungraded} not graded; grades written to {out}")
    if spread_run and ungraded:
        lost = sum("SLURM task ended without a result" in st.status for st in students)
        if lost:
            print(f"grade: {lost} student(s) not graded because their task ended without a result: run the "
                  f"same command again to grade them (nobody is graded twice)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
