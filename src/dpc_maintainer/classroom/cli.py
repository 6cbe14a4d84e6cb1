"""The command line (`python -m dpc_maintainer.classroom`, `make classroom-test`, `make classroom-fairness`):
the arguments, the checks before a run (the machine, the labs, the leftovers of killed runs), the run with its
tear-down on failure, Ctrl-C or SIGTERM (or --keep), the timeline, the exit status; and the browser phase
(`--browser PHASE --plan FILE --result FILE`), which the harness starts in the hub's environment.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from dpc_maintainer.classroom.common import DEFAULT_LAB, FAIRNESS_LAB, ROOT, StepFailed
from dpc_maintainer.classroom.fairness import measure
from dpc_maintainer.classroom.faults import run_phase
from dpc_maintainer.classroom.hub import unavailable
from dpc_maintainer.classroom.room import Classroom
from dpc_maintainer.classroom.steps import up_and_run
from dpc_maintainer.classroom.students import run_browsers
from dpc_maintainer.classroom.teardown import clean_leftovers, leftovers, tear_down


def parser() -> argparse.ArgumentParser:
    """The command line's arguments (--browser, --plan and --result: the browser phase's, not shown)."""
    from dpc_maintainer import classroom  # the package (which does not import this module): its docstring

    ap = argparse.ArgumentParser(prog="python -m dpc_maintainer.classroom",
                                 description=(classroom.__doc__ or "").splitlines()[0])
    ap.add_argument("--lab", default=os.environ.get("CLASSROOM_LAB") or DEFAULT_LAB,
                    help="a lab of labs/, or 'all' (default: $CLASSROOM_LAB or 05-ring-allreduce)")
    ap.add_argument("--students", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave it all running, even after a failure (no tear-down: for a look)")
    ap.add_argument("--spawner", choices=["local", "slurm"], default=os.environ.get("CLASSROOM_SPAWNER") or "local",
                    help="local: each student's server in a cgroup on this machine; slurm: each a SLURM job "
                         "(batchspawner) on a two-node cluster brought up here (default: $CLASSROOM_SPAWNER or local)")
    ap.add_argument("--cpu", default="1.5", help="cores per user (cgroup CPU quota; a SLURM job asks for them whole)")
    ap.add_argument("--mem", default="4G", help="memory per user")
    ap.add_argument("--parameters", choices=["defaults", "ci"], default="defaults",
                    help="the grader's --parameters: the notebooks' own (default) or course.yml's ci values")
    ap.add_argument("--no-labs-check", action="store_true",
                    help="the release skips its check that labs/ is generated from solutions/ (nbgrader on "
                         "every lab, about 2 minutes; the suite has a test of its own for it)")
    ap.add_argument("--fairness", action="store_true",
                    help="instead of the class: one student runs the lab (default 06-horovod) while a classmate's "
                         "kernel round trip is timed, then that kernel goes past the memory limit")
    ap.add_argument("--queue", action="store_true",
                    help="with --spawner slurm, instead of the labs: every student logs in at once (--cpu cores each); "
                         "how many are served at once, how long the others wait in SLURM's queue")
    ap.add_argument("--clean", action="store_true",
                    help="only remove what earlier runs that were killed left behind (accounts, hubs, cgroups), and exit")
    ap.add_argument("--browser", choices=["work", "feedback", "fairness", "queue", "lost-node"], help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return ap


def browser_phase(phase: str, plan_file: Path, result: Path) -> int:
    """The browser part, in the hub's environment: the plan's students in Chromium, their results written."""
    plan = json.loads(plan_file.read_text())
    try:
        if phase == "fairness":
            res = asyncio.run(measure(plan))
        elif phase in ("queue", "lost-node"):
            res = asyncio.run(run_phase(phase, plan))
        else:
            res = asyncio.run(run_browsers(phase, plan))
    except KeyboardInterrupt:  # a Ctrl-C reaches the whole group: the run says it once, with its tear-down
        return 130
    result.write_text(json.dumps(res, indent=1))
    return 0


def chosen_labs(a: argparse.Namespace) -> list[str]:
    """The labs to run: --lab, or every lab of labs/ for 'all' (--fairness alone: its heavy lab)."""
    if a.fairness and a.lab == DEFAULT_LAB and not os.environ.get("CLASSROOM_LAB"):
        a.lab = FAIRNESS_LAB
    return sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir()) if a.lab == "all" else [a.lab]


def wrong_arguments(labs: list[str], students: int, fairness: bool = False, queue: bool = False,
                    spawner: str = "local") -> str:
    """Why the run's labs or number of students cannot be ('' when they can)."""
    if queue and spawner != "slurm":
        return "--queue needs --spawner slurm (it measures SLURM's queue)"
    for lab in labs:
        if not (ROOT / "labs" / lab).is_dir():
            return f"no lab labs/{lab}"
    if fairness and students < 2:
        return "--fairness needs --students 2 or more (one runs the lab, a classmate's kernel is timed)"
    if students < 1:
        return "--students must be at least 1 (with 2 or more, every second one hands in the lab unfilled)"
    return ""


def end_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent (make, a test) dies (Linux's prctl)."""
    import ctypes

    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def run_class(room: Classroom) -> str:
    """Every step of the class, SIGTERM taken as Ctrl-C; what failed ('' when all passed)."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    end_with_parent()  # `kill -TERM` of `make classroom-test` reaches this run as a SIGTERM
    try:
        up_and_run(room)
    except StepFailed as e:
        return str(e)
    except KeyboardInterrupt:
        return "interrupted"
    return ""


def keep_or_tear_down(room: Classroom, failed: str) -> str:
    """--keep: the accounts written down, the guardian dismissed; else the tear-down, a step of the timeline."""
    if room.keep:
        (room.dir / "accounts.json").write_text(json.dumps([asdict(x) for x in room.made_users], indent=1))
        room.guard.dismiss()
        print(f"classroom: kept (--keep): hub {room.base or '?'}, accounts in {room.dir}/accounts.json; "
              "remove it all with `make classroom-test CLASSROOM_ARGS=--clean` once its process has ended")
        return failed
    try:
        with room.timeline.step("tear-down (hub, proxy, servers, git daemon, users, cgroups, exchange)"):
            problems = tear_down(room)
            if problems:
                raise StepFailed("not clean: " + "; ".join(problems))
    except StepFailed as e:
        failed = f"{failed}; {e}" if failed else str(e)
    return failed


def main(argv: list[str] | None = None) -> int:
    """Bring up the class, run it, tear it down; print the timeline; 0 when every step passed."""
    a = parser().parse_args(argv)
    if a.browser:  # the browser part, in the hub's environment
        return browser_phase(a.browser, a.plan, a.result)
    why = unavailable()
    if why:
        print(f"classroom: cannot run here: {why}", file=sys.stderr)
        return 2
    for line in clean_leftovers():  # an earlier run killed with its guardian (a reboot, kill -9 of both)
        print(f"classroom: left by an earlier run, removed: {line}", flush=True)
    if a.clean:
        left = leftovers()
        print(f"classroom: clean: {len(left)} run(s) left")
        return 0 if not left else 1
    labs = chosen_labs(a)
    wrong = wrong_arguments(labs, a.students, a.fairness, a.queue, a.spawner)
    if wrong:
        print(f"classroom: {wrong}", file=sys.stderr)
        return 2
    if a.spawner == "slurm":
        from dpc_setup.cluster import unavailable as no_cluster  # the course's environment (the harness's side)

        why = no_cluster() or ""
        if why:
            print(f"classroom: cannot run --spawner slurm here: {why}", file=sys.stderr)
            return 2
    room = Classroom(labs, a.students, a.keep, a.cpu, a.mem, fairness_only=a.fairness, parameters=a.parameters,
                     labs_check=not a.no_labs_check, spawner=a.spawner, queue_only=a.queue)
    print(f"classroom: run {room.dir.name}: labs {', '.join(labs)}, {a.students} students, spawner {a.spawner}, "
          f"ports {room.ports}; logs and screenshots in {room.dir}", flush=True)
    failed = keep_or_tear_down(room, run_class(room))
    print(room.timeline.report())
    if failed:
        print(f"classroom: FAILED: {failed}", file=sys.stderr)
        return 1
    print("classroom: passed")
    return 0
