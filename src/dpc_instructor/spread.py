"""Grading spread over a SLURM cluster: `python -m dpc_instructor.grade SUBMISSIONS --lab L --slurm`
(`make grade SLURM=1`).

The run is the same as on one node (grade.py): the lab's template and its reference run (one per
lab and seed, cached in the course) are made where the command runs; then every student is one
task of a SLURM job array (`python -m dpc_instructor.spread task RUN`), graded in the same sandbox
by grading.job.grade_one. A task does not write the course gradebook: it leaves its job's graded
folders and status in RUN/results/<student>/ (Spool), and the command, which watches the array,
merges each result into the course with grading.record.record, the call a local run makes. Same seed, same reference,
same code: the same points, status and seed as a local run.

Progress (done / running / queued / failed, the time left) is printed as it changes and kept in
RUN/progress.txt (and .json) for the instructor to watch. RUN is the course's spread/<lab>-<key>,
key a hash of the submissions: the same command again resumes it (same seed): a student already
merged is never graded again, a result left unmerged is merged, and a student whose task ended
without a result (its node died, the job was cancelled) is submitted again. Tasks are submitted
with --no-requeue: a task that SLURM would requeue on its own could grade a student twice.

What a real cluster needs: the course folder (COURSE) and this repository with its environment
(.venv, or the class environment) at the same paths on every node (a shared file system);
bubblewrap on the nodes (the sandbox); sbatch/squeue/scancel on the machine running the command.
`--partition`, `--account` and `--sbatch` (any other sbatch option) go to every submission.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpc_instructor import gradebook
from dpc_instructor.grading.intake import Student
from dpc_instructor.grading.job import RETRIES, grade_one
from dpc_instructor.grading.record import record
from dpc_instructor.grading.run import Run
from dpc_runtime import manifest, sandbox

FOLDER = "spread"  # in the course folder: one RUN folder per lab and set of submissions
POLL_S = 3.0  # how often the command looks at the queue and the results
RESULT = "result.json"  # in RUN/results/<student>/: the task's status, notes and seconds


@dataclass
class Options:
    """How the tasks are submitted."""

    partition: str | None = None
    account: str | None = None
    sbatch: list[str] = field(default_factory=list)  # more sbatch options, as given
    max_running: int | None = None  # tasks of the array at once (sbatch --array=...%N)


def run_folder(course: gradebook.Course, lab: str, students: Sequence[Student]) -> Path:
    """RUN of these submissions of lab: the same submissions give the same folder (resume)."""
    key = hashlib.sha256(lab.encode())
    for st in sorted(students, key=lambda s: s.id):
        key.update(b"\0" + st.id.encode() + b"\0" + st.status.encode())
        for name in sorted(st.notebooks):
            key.update(name.encode() + hashlib.sha256(st.notebooks[name]).digest())
    return course.root / FOLDER / f"{lab}-{key.hexdigest()[:12]}"


def seed_of(folder: Path, asked: int | None) -> int | None:
    """The seed a resumed RUN was started with (None: a new run); a different --seed is refused."""
    state = folder / "run.json"
    if not state.exists():
        return None
    seed = int(json.loads(state.read_text())["seed"])
    if asked is not None and asked != seed:
        raise SystemExit(f"grade: {folder} was started with --seed {seed}; run again with that seed to "
                         f"finish it, or remove the folder to grade these submissions anew with {asked}")
    return seed


@contextlib.contextmanager
def only_one(folder: Path) -> Iterator[None]:
    """Hold RUN's lock: a second command on the same RUN stops with one line instead of racing."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"grade: another grading command is running on {folder}") from None
        yield


# --- the task's side ------------------------------------------------------------------------


class Spool(gradebook.Course):
    """The course as a SLURM task sees it: jobs and logs in the course folder, but what grading
    records goes to RUN/results/<student>/ (the job's gradebook and graded folders, copied as
    folders and regular files only) for the command to merge."""

    def __init__(self, root: Path, results: Path) -> None:
        super().__init__(root)
        self.results = results

    def record(self, lab: str, student: str, scratch: Path | None, status: str, notes: list[str],
               seconds: float, name: str | None = None, seed: int | None = None
               ) -> tuple[float, float, dict[str, float], list[str]] | None:
        """Keep one student's grading in results/<student>/ whole or not at all (a rename)."""
        tmp = self.results / f".{student}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        if scratch is not None:
            gradebook.say_refused(sandbox.copy_regular(scratch / "gradebook.db", tmp / "gradebook.db"),
                                  "spread: the job's gradebook")
            notes = [*notes, *gradebook.keep_graded(scratch, tmp, student, lab)]  # as Course.record does
        (tmp / RESULT).write_text(json.dumps({"status": status, "notes": notes, "seconds": seconds,
                                              "graded": scratch is not None,
                                              "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename}))
        tmp.replace(self.results / student)
        return None


def task(folder: Path, index: int) -> int:
    """Grade the student of unit `index` of RUN (one array task)."""
    state = json.loads((folder / "run.json").read_text())
    unit = json.loads((folder / "units" / f"{index}.json").read_text())
    st = Student(unit["name"], unit["id"], {k: base64.b64decode(v) for k, v in unit["notebooks"].items()},
                 {k: base64.b64decode(v) for k, v in unit["kept"].items()}, notes=list(unit["notes"]))
    if (folder / "results" / st.id).exists():
        print(f"spread: {st.name} already has a result; nothing to do")
        return 0
    if state["sandboxed"]:
        sandbox.require()  # this node's bubblewrap: one clear line in the task's log, no result
    release = {n: json.loads((folder / "release" / f"{n}.json").read_text()) for n in state["release"]}
    run = Run(Spool(Path(state["course"]), folder / "results"), state["lab"], Path(state["template"]),
              release, state["cell_timeout"], state["notebook_timeout"], sandbox.Limits(**state["limits"]),
              state["sandboxed"], state["seed"], state["cases"])
    done = grade_one(st, run)
    print(f"spread: {done.name} graded on {os.uname().nodename}: {done.status} ({done.seconds:.0f} s)")
    return 0


# --- the command's side ---------------------------------------------------------------------


@dataclass
class Progress:
    """Where a spread run stands (what progress.txt shows)."""

    total: int
    done: int = 0
    running: int = 0
    queued: int = 0
    failed: int = 0
    left_s: float | None = None
    at: str = ""

    def line(self) -> str:
        """One line: counts and the time left."""
        left = "" if self.left_s is None else f", about {self.left_s / 60:.1f} min left"
        return (f"{self.done}/{self.total} done, {self.running} running, {self.queued} queued, "
                f"{self.failed} failed{left}")


def squeue(jobs: Sequence[str], tries: int = 5) -> dict[int, str]:
    """Array task index -> state (PD, R, CG, ...) of the tasks of `jobs` SLURM still holds. A job
    SLURM has forgotten is simply absent (this user's queue is listed, not the jobs by id); squeue
    failing (slurmctld busy) is asked again, then one clear error: never read as 'no task left'."""
    if not jobs:
        return {}
    user = pwd.getpwuid(os.getuid()).pw_name
    for attempt in range(tries):
        # %F: the array's job id (%A is each running task's own); %K: the task's index in the array
        out = subprocess.run(["squeue", "-h", "-r", "-u", user, "-o", "%F %K %t"], capture_output=True,
                             text=True, timeout=60)
        if out.returncode == 0:
            tasks = {}
            for line in out.stdout.splitlines():
                job, index, state = (line.split() + ["", "", ""])[:3]
                if job in jobs and index.isdigit():
                    tasks[int(index)] = state
            return tasks
        time.sleep(2 ** attempt)
    raise SystemExit(f"grade: squeue failed {tries} times: {out.stderr.strip()}; this command's tasks are "
                     f"cancelled (what is merged stays): run the same command again to resume")


def submit(folder: Path, indices: Sequence[int], lab: str, notebook_timeout: float, options: Options) -> str:
    """One array job grading units `indices`; its job id."""
    minutes = int((RETRIES + 1) * notebook_timeout / 60) + 10  # every try of one student, and set-up
    array = ",".join(map(str, indices)) + (f"%{options.max_running}" if options.max_running else "")
    argv = ["sbatch", "--parsable", f"--array={array}", f"--job-name=dpc-grade-{lab}",
            f"--output={folder / 'logs' / '%A_%a.out'}", f"--chdir={folder}", "--no-requeue",
            f"--cpus-per-task={manifest.lab_ranks(lab)}", f"--time={minutes}", "--nodes=1", "--ntasks=1"]
    argv += [f"--partition={options.partition}"] * bool(options.partition)
    argv += [f"--account={options.account}"] * bool(options.account)
    argv += [*options.sbatch, f"--wrap={sys.executable} -m dpc_instructor.spread task {folder}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"grade: sbatch refused the grading job: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def write_units(folder: Path, students: list[Student], run: Run) -> tuple[dict, dict[int, Student]]:
    """RUN's state (run.json: what a task needs of run, and the jobs submitted so far), the release's
    notebooks, and one unit per student (units/<i>.json: what a task grades; none for a student
    refused at intake); the state and the students by unit."""
    for sub in ("units", "results", "logs", "release", "merged"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    state_file = folder / "run.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"jobs": []}
    state.update(course=str(run.course.root), lab=run.lab, template=str(run.template), release=sorted(run.release),
                 cell_timeout=run.cell_timeout, notebook_timeout=run.notebook_timeout, limits=asdict(run.limits),
                 sandboxed=run.sandboxed, seed=run.seed, cases=run.cases)
    for name, nb in run.release.items():
        (folder / "release" / f"{name}.json").write_text(json.dumps(nb))
    units = {}
    for i, st in enumerate(sorted(students, key=lambda s: s.id)):
        units[i] = st
        if st.status == "graded":  # refused at intake: nothing to run, the command records it
            (folder / "units" / f"{i}.json").write_text(json.dumps({
                "name": st.name, "id": st.id, "notes": st.notes,
                "notebooks": {k: base64.b64encode(v).decode() for k, v in st.notebooks.items()},
                "kept": {k: base64.b64encode(v).decode() for k, v in st.kept.items()}}))
    state_file.write_text(json.dumps(state, indent=1))
    return state, units


def grade_over_slurm(students: list[Student], run: Run, folder: Path, options: Options) -> list[Student]:
    """Grade students over SLURM into run.course (see the module's docstring); returns them all,
    each with its grade, or with status 'not graded: ...' when its task ended without a result."""
    state, units = write_units(folder, students, run)

    def merged(st: Student) -> bool:
        """Whether st's result is in the course already (RUN/merged/<id>)."""
        return (folder / "merged" / st.id).exists()

    def mark(st: Student) -> None:
        """Note st as merged, with what the CSV of any later command shows for st."""
        (folder / "merged" / st.id).write_text(json.dumps({k: getattr(st, k) for k in KEEP}))

    for st in units.values():
        if merged(st):
            for k, v in json.loads((folder / "merged" / st.id).read_text()).items():
                setattr(st, k, v)
        elif st.status != "graded":
            mark(record(st, run, None))
    live = squeue(state["jobs"])  # an earlier command's tasks still queued or running: wait for them
    todo = [i for i, st in units.items() if st.status == "graded" and not merged(st)
            and not (folder / "results" / st.id).exists() and i not in live]
    if todo:
        state["jobs"].append(submit(folder, todo, run.lab, run.notebook_timeout, options))
        (folder / "run.json").write_text(json.dumps(state, indent=1))
    print(f"grade: {len(units)} student(s) in {folder}: {sum(map(merged, units.values()))} already graded, "
          f"{len(todo)} submitted as job {state['jobs'][-1] if todo else '-'}; progress in {folder / 'progress.txt'}",
          flush=True)
    return _watched(folder, units, state["jobs"], run, mark)


def _watched(folder: Path, units: dict[int, Student], jobs: list[str], run: Run,
             mark: Callable[[Student], None]) -> list[Student]:
    """units once every one is merged or its task has ended without a result (watch; that status);
    interrupted, the jobs are cancelled."""
    try:
        failed = watch(folder, units, jobs, run, mark)
    except BaseException:  # interrupted (or squeue failed): nothing of it is left queued or running,
        cancel(jobs)  # as its template goes (grade.main); the next command resumes
        raise
    for i in sorted(failed):
        st = units[i]
        st.status = (f"not graded: its SLURM task ended without a result (node failure, cancelled, over "
                     f"its time?): run the same command again to grade it (log: {folder / 'logs'})")
    return [units[i] for i in sorted(units)]


KEEP = ("status", "notes", "seconds", "score", "max_score", "cells")  # of a merged Student (RUN/merged/<id>)


def cancel(jobs: Sequence[str]) -> None:
    """scancel these jobs (what is left of them)."""
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=60)


def watch(folder: Path, units: dict[int, Student], jobs: Sequence[str], run: Run,
          mark: Callable[[Student], None]) -> set[int]:
    """Merge each result as it comes, show the progress, until every unit is merged or its task has
    ended without a result; returns those units (failed)."""
    start, took, shown = time.monotonic(), [], ""
    while True:
        live = squeue(jobs)
        merged = {i for i, st in units.items() if (folder / "merged" / st.id).exists()}
        for i, st in units.items():
            result = folder / "results" / st.id
            if i in merged or not result.is_dir():
                continue
            got = json.loads((result / RESULT).read_text())
            st.status, st.notes, st.seconds = got["status"], got["notes"], got["seconds"]
            mark(record(st, run, result if got["graded"] else None))
            took.append(st.seconds)
            print(f"  {st.name}: {st.score:g} / {st.max_score:g}  {st.status} ({st.seconds:.0f} s, "
                  f"on {got['node']})", flush=True)
            merged.add(i)
        open_ = [i for i in units if i not in merged]
        failed = {i for i in open_ if i not in live and not (folder / "results" / units[i].id).exists()}
        p = Progress(len(units), len(units) - len(open_), sum(s in {"R", "CG"} for s in live.values()),
                     sum(s == "PD" for s in live.values()), len(failed), at=time.strftime("%Y-%m-%d %H:%M:%S"))
        if took and open_:
            at_once = max(1, p.running)
            p.left_s = statistics.median(took) * (len(open_) - len(failed)) / at_once
        if p.line() != shown:
            shown = p.line()
            print(f"grade: [{time.monotonic() - start:6.0f} s] {shown}", flush=True)
        (folder / "progress.json").write_text(json.dumps(asdict(p)))
        (folder / "progress.txt").write_text(f"{p.at}  {shown}\n")
        if len(failed) == len(open_):
            return failed
        time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    """The command a SLURM array task runs: `task RUN [--index I]` grades one student of RUN."""
    p = argparse.ArgumentParser(prog="python -m dpc_instructor.spread", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("task", help="grade one student of RUN (what each array task runs)")
    t.add_argument("run", type=Path)
    t.add_argument("--index", type=int, default=None, help="the unit (default: $SLURM_ARRAY_TASK_ID)")
    a = p.parse_args(argv)
    index = a.index if a.index is not None else int(os.environ["SLURM_ARRAY_TASK_ID"])
    return task(a.run.resolve(), index)


if __name__ == "__main__":
    sys.exit(main())
