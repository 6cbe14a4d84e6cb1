"""A real class on a real JupyterHub on this machine, used in a browser, graded, torn down (`make classroom-test`).

    python -m dpc_maintainer.classroom [--lab 05-ring-allreduce|all] [--students N] [--keep] [--parameters ci]
                                       [--spawner local|slurm] [--no-labs-check] [--fairness] [--clean]

As root, with apt (chromium) and npm. It prints a timeline (seconds per step) and exits 1 on the first failed
step (2 when the machine cannot run it: not root, no apt or npm). Logs and screenshots: build/classroom/<run>/.

The files, in the order a class run goes through them:

    cli.py       the command line: the arguments, the checks before a run, the run, its tear-down (also on a
                 failure, Ctrl-C or SIGTERM, unless --keep), the timeline, the exit status; and the browser phase
    room.py      one run's state (Classroom): its names, ports, folders, the processes it started, its guardian
    steps.py     its steps in order (up_and_run; run_lab per lab), each timed on the timeline
    common.py    what every stage uses: paths, deadlines, StepFailed, the timeline, running a command, waiting
    hub.py       whether the machine can; src/dpc_setup/hub.sh (chromium, the proxy, the hub's environment), the
                 class environment (`make class-env`), with --spawner slurm the two-node SLURM cluster
                 (dpc_setup.cluster), the JupyterHub (PAM logins, per-user cgroups or SLURM jobs) on free
                 loopback ports, and the course's website built with this hub's link (dpc_maintainer.book)
    accounts.py  N student accounts and an instructor with random passwords; running a command as one of them
    release.py   the student release served by `git daemon` on loopback, its nbgitpuller link, nbgrader's
                 exchange: the instructor releases the lab, the students submit, the instructor collects
    students.py  every student in Chromium: chapter 5's "Open on your class hub" on the website (the first lab),
                 the lab's nbgitpuller link, the answers filled in (odd students; even ones hand in the lab
                 unfilled), Run All at the same time, save; later their own feedback page, a classmate's refused
    browser.py   the browser's tools for students.py and fairness.py: each student's Chromium (Playwright driving
                 /usr/bin/chromium), logging in, the Jupyter server's REST API, menus, kernels, saving
    grading.py   the course's grader (sandboxed; --parameters ci: course.yml's ci values, as the suite's grading
                 tests) must give full marks to the filled notebook and 0 to the unfilled one; feedback through
                 nbgrader (release_feedback, fetch_feedback)
    fairness.py  instead of the labs (--fairness): a classmate's kernel round trip while one student runs a
                 heavy lab, then a kernel past its memory limit, which must die alone
    jobs.py      --spawner slurm: each student's server a SLURM job of theirs (squeue), over both nodes, their kernel
                 and every torchrun their lab started inside it
    faults.py    --spawner slurm, after the lab: idle servers culled (their jobs end), a full cluster where one
                 student waits in the queue until a classmate's server is culled, a node lost under a student who
                 then gets a new job on the other node with their saved notebook
    teardown.py  stop the hub, proxy, servers and git daemon; remove the users, homes, cgroups and exchange; check
                 that no process of those users is left and every port is closed; what killed runs left

A run killed outright (SIGKILL, a hard timeout) is cleaned by its guardian (dpc_runtime.reaper: everything the
run starts carries DPC_CLASSROOM_RUN=<tag>), and every start (or `--clean` alone) removes what an earlier run
left if both were killed. The browser part runs in the hub's environment (Playwright is not in the course's):
this package is started there again as `... classroom --browser work|feedback|fairness --plan FILE`, so every
module imports with the standard library alone (the course's packages are imported where they are used).
The command line's main is dpc_maintainer.classroom.cli.main (it reads this docstring's first line).
"""
from __future__ import annotations

from dpc_maintainer.classroom.common import (
    ACCOUNT,
    CHROMIUM,
    CHROMIUM_FLAGS,
    DEFAULT_LAB,
    ROOT,
    RUN_MARKER,
    StepFailed,
    cgroup_roots,
    port_open,
)
from dpc_maintainer.classroom.fairness import fairness_lines, past_limit_code
from dpc_maintainer.classroom.hub import unavailable
from dpc_maintainer.classroom.release import pull_link
from dpc_maintainer.classroom.room import Classroom
from dpc_maintainer.classroom.teardown import clean_leftovers, leftovers

__all__ = ["ACCOUNT", "CHROMIUM", "CHROMIUM_FLAGS", "DEFAULT_LAB", "ROOT", "RUN_MARKER", "Classroom", "StepFailed",
           "cgroup_roots", "clean_leftovers", "fairness_lines", "leftovers", "past_limit_code", "port_open",
           "pull_link", "unavailable"]
