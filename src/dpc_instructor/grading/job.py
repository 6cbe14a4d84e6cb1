"""One student's job: their notebooks repaired (repair), autograded by nbgrader in a sandbox, tried
again while a try fails for the grading machine's reason (failures), and the outcome made their
status and recorded (record). Also the retry loop the reference and the hidden cases' job use.

Each student is graded in a private nbgrader course folder of their own (a copy of the lab's
template and an empty gradebook). `nbgrader autograde` runs in a sandbox (src/dpc_runtime/sandbox.py:
no network but its own loopback, only its own folder writable, memory/process/file-size/disk
limits, never root: as the sandbox's user) and starts the kernel in a second one that cannot read
nbgrader's database (it holds the hidden tests) and has no network at all (the kernel talks to
nbgrader over IPC sockets). Per-cell time limits come from the repository's nbgrader_config.py
(keyed on grade ids), plus a wall-clock limit per student.

A try that fails for the grading machine's reason (failures.host_failure, failures.busy_timeout) is
run again, up to RETRIES more times, in the same run, each try with twice the time limits of the one
before; "not graded" then names that cause, and the run's last line counts the students graded
again and those not graded. Nothing is copied out of a job (nor into one) but folders and regular
files (dpc_runtime.sandbox.copy_regular): a link the student's code left in its folder is never
followed, and the note column says what was left out.
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dpc_instructor import gradebook, nbgrader_hooks
from dpc_instructor.grading.failures import (
    busy_timeout,
    cell_timeouts,
    host_failure,
    kernel_died,
    measured,
    why_failed,
)
from dpc_instructor.grading.intake import Student
from dpc_instructor.grading.record import record
from dpc_instructor.grading.repair import repair
from dpc_instructor.grading.run import BIN, REFERENCE, Run
from dpc_runtime import judge, sandbox

RETRIES = 2  # more tries of a job that failed for the grading machine's reason (host_failure)
SOCKETS = Path("/tmp/kernel-sockets")  # in nbgrader's sandbox (its own /tmp): see _sandbox_kernel

T = TypeVar("T")


def with_retries(folder: Callable[[], Path], attempt: Callable[[Path, int], sandbox.Outcome],
                 cause: Callable[[sandbox.Outcome], str | None],
                 then: Callable[[Path, sandbox.Outcome, str | None], T], retried: list[str]) -> T:
    """attempt(a fresh job folder from folder(), try number) up to RETRIES more times while
    cause(outcome) names the grading machine's failure (each cause added to retried); then(job
    folder, outcome, that cause or None) of the last try, while its folder is still there (removed
    after)."""
    for number in range(RETRIES + 1):
        scratch = folder()
        try:
            done = attempt(scratch, number)
            host = cause(done)
            if host is None or number == RETRIES:
                return then(scratch, done, host)
            retried.append(host)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    raise AssertionError("unreachable")


def tries(run: Run, sid: str, notebooks: dict[str, dict], kept: dict[str, bytes],
          config: Callable[[Path], str], then: Callable[[Path, sandbox.Outcome, str | None], T],
          retried: list[str]) -> T:
    """autograde in a fresh job folder, again while a try fails for the grading machine's reason
    (host_failure, busy_timeout: with_retries), each try with twice the time limits of the one before;
    then(job folder, outcome, that reason or None) of the last try."""
    def attempt(scratch: Path, number: int) -> sandbox.Outcome:
        """Try `number` (from 0) in the job folder scratch, its time limits 2**number times the run's."""
        return autograde(run, scratch, sid, notebooks, kept, config(scratch), scale=2 ** number)

    return with_retries(lambda: run.course.jobs / f"{run.lab}-{sid}-{uuid.uuid4().hex[:8]}", attempt,
                        lambda done: host_failure(done) or busy_timeout(done), then, retried)


def job_env(scratch: Path, cell_timeout: int | None, seed: int | None, scale: float = 1) -> dict[str, str]:
    """The environment of one student's nbgrader and kernel: sandbox.clean_env, plus Jupyter's
    folders in the job folder (jupyter_client writes a kernel's connection file to TMPDIR, which the
    kernel's sandbox must see: it is the runtime folder) and the run's seed of the hidden tests;
    seed None (a lab whose hidden cases are made outside the kernel: cases.make_cases): no seed at all,
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


def _hand_in(run: Run, scratch: Path, sid: str, notebooks: dict[str, dict], kept: dict[str, bytes],
             config: str) -> None:
    """The job folder scratch made: a copy of the template, the job's nbgrader configuration
    (`config`), sid's notebooks and kept files submitted, the folders the job writes."""
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
    for d in (scratch / "home", scratch / "kernel-home", scratch / "runtime", scratch / "share",
              scratch / "autograded"):
        d.mkdir()


def _sandbox_kernel(scratch: Path, sid: str, lab: str) -> None:
    """Give the job's kernel a sandbox of its own (see autograde) and IPC sockets (it has no network)."""
    graded, khome = scratch / "autograded" / sid / lab, scratch / "kernel-home"
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


def autograde(run: Run, scratch: Path, sid: str, notebooks: dict[str, dict], kept: dict[str, bytes],
              config: str, scale: float = 1) -> sandbox.Outcome:
    """Run nbgrader's autograde of these notebooks for student sid in the job folder scratch (a
    copy of the template), sandboxed; `config`: the job's lines for nbgrader_hooks (the judge's);
    scale: of the cells' and the notebook's time limits."""
    _hand_in(run, scratch, sid, notebooks, kept, config)
    env = job_env(scratch, run.cell_timeout, None if run.cases else run.seed, scale)
    argv = [str(BIN / "nbgrader"), "autograde", run.lab, f"--student={sid}", "--force"]
    if run.sandboxed:
        _sandbox_kernel(scratch, sid, run.lab)
        # nbgrader (trusted) runs as the sandbox's user, never root, in a sandbox of its own that
        # can start the kernel's (host_proc).
        argv = sandbox.bwrap_argv(argv, writable=[scratch], env=env, cwd=scratch, host_proc=True)
        sandbox.hand_over(scratch)
    return sandbox.run_limited(argv, scratch, env, run.notebook_timeout * scale, run.limits, watch=scratch,
                               sample_cpu=True)  # failures.busy_timeout reads what the job ran and waited


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
        """st graded from the last try, with the time all its tries took."""
        st.seconds = time.monotonic() - start
        return _grade_in(st, run, scratch, done, host)

    return tries(run, st.id, notebooks, st.kept,
                 lambda scratch: nbgrader_hooks.job_config(reference=scratch / REFERENCE), judged, st.retried)


def graded_notebooks(scratch: Path, sid: str, run: Run) -> dict[str, bytes]:
    """sid's graded notebooks in the job folder scratch (name: bytes), read as regular files only."""
    found = {}
    for name in run.release:
        try:
            data = gradebook.read_graded(scratch, sid, run.lab, name)
        except (OSError, sandbox.Refused):
            continue
        if data is not None:
            found[name] = data
    return found


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
    if code == 0 and (died := kernel_died(out, graded_notebooks(scratch, st.id, run))):
        st.notes.append(died)  # graded: the cells before the death kept their points
    if code != 0 and not st.status.startswith("not graded"):
        log = run.course.root / "logs" / f"autograde-{run.lab}-{st.id}.log"
        log.parent.mkdir(exist_ok=True)
        log.write_text(out)
        why = (f"{host}, on all {RETRIES + 1} tries: the grading machine's failure, not the "
               f"submission's; grade again" if host else why_failed(done, run.limits))
        st.status = f"not graded: {why} (log: {log})"
    return record(st, run, scratch if st.status == "graded" else None)
