"""Why a try of a job failed: the grading machine's reason (tried again: host_failure, busy_timeout)
or the submission's (why_failed, measured).

A job that fails for the grading machine's reason, not the submission's (its sandbox or its kernel
did not start, or something outside killed it: host_failure; or a cell ran past its time limit while
the machine was busy: busy_timeout, from what the job's threads ran and waited for a CPU while that
cell ran, dpc_runtime.cpuwait), is run again (job.with_retries). A cell past its limit is the
submission's only when its processes were not kept waiting (a sleeping or a busy loop, a slow answer
on a calm machine): the note or the status then says what was measured.
"""
from __future__ import annotations

import json
import re
import signal

from dpc_instructor import nbgrader_hooks
from dpc_runtime import notebook, sandbox

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


def kernel_died(output: str, graded: dict[str, bytes]) -> str | None:
    """What a job's kernel death means for its grade (None: no kernel died), from its log
    (nbgrader_hooks.KERNEL_DIED_LINE) and its graded notebooks (name: bytes): the cell, how it died,
    the points the test cells before it earned and those that could not run."""
    if not re.search(nbgrader_hooks.KERNEL_DIED_LINE, output):
        return None
    lines = []
    for name, data in sorted(graded.items()):
        nb = json.loads(data.decode("utf-8"))
        tests = [c for c in nb["cells"] if c.get("cell_type") == "code" and notebook.nbgrader(c).get("grade")]
        unrun = [c for c in tests if any(o.get("ename") == "KernelDied" for o in c.get("outputs", []))]
        if not unrun:
            continue
        why = next(o["evalue"] for o in unrun[0]["outputs"] if o.get("ename") == "KernelDied")
        ran = [c for c in tests if c not in unrun]
        points = lambda cells: sum(float(notebook.nbgrader(c).get("points", 0)) for c in cells)  # noqa: E731
        passed = [c for c in ran if not any(o.get("output_type") == "error" for o in c.get("outputs", []))]
        lines.append(f"{name}.ipynb: {why.removeprefix('could not run: ')}; the {len(ran)} test cell(s) before "
                     f"it passed {points(passed):g} of their {points(ran):g} points; the other {len(unrun)} "
                     f"({points(unrun):g} points) could not run")
    return "; ".join(lines) or "the kernel died (see the log)"


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
