"""One class run's state (Classroom): what it brings up (names, ports, folders, the processes it started, all
that the tear-down removes), its timeline and its guardian. The stages read and fill it; steps.py runs them.

Only the standard library and the stdlib-only reaper at the top: the browser phase imports this package in the
hub's environment (Playwright, no psutil or torch); the harness takes the launcher's names where it uses them.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dpc_maintainer.classroom.common import BUILD, RUN_MARKER, Account, Timeline, cgroup_roots
from dpc_runtime.reaper import Guard


class Classroom:
    """One run: what it brought up (to tear down) and the steps."""

    def __init__(self, labs: list[str], students: int, keep: bool, cpu: str, mem: str,
                 fairness_only: bool = False, parameters: str = "defaults", labs_check: bool = True,
                 spawner: str = "local", queue_only: bool = False) -> None:
        """Names, ports and folders of this run (nothing is started yet)."""
        self.labs = labs
        self.parameters = parameters  # the grader's --parameters
        self.labs_check = labs_check  # the release checks that labs/ is generated from solutions/
        self.fairness_only = fairness_only
        self.spawner = spawner  # local: one cgroup per student on this machine; slurm: a SLURM job each
        self.queue_only = queue_only  # --queue: instead of the labs, the students' logins on a full cluster
        self.tag = secrets.token_hex(2)
        self.keep = keep
        self.cpu, self.mem = cpu, mem
        self.dir = BUILD / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{self.tag}"
        self.dir.mkdir(parents=True)
        (self.dir / "screens").mkdir()
        self.log = self.dir / "commands.log"
        self.timeline = Timeline()
        self.students = [Account(f"dpc-student{i}-{self.tag}", secrets.token_urlsafe(12),
                                 f"/home/dpc-student{i}-{self.tag}", filled=i % 2 == 1)
                         for i in range(1, students + 1)]
        self.instructor = Account(f"dpc-instructor-{self.tag}", secrets.token_urlsafe(12),
                                  f"/home/dpc-instructor-{self.tag}")
        from dpc_runtime.launch import free_port  # the course's environment only (psutil): see the imports

        self.ports = {"hub": free_port(), "hub-api": free_port(), "proxy-api": free_port(), "git": free_port()}
        self.cgroup = f"dp-course-hub-{self.tag}"
        self.exchange = Path(tempfile.mkdtemp(prefix=f"dpc-exchange-{self.tag}-"))
        self.course = self.dir / "course"  # the grader's course folder (gradebook, feedback)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.made_users: list[Account] = []
        self.cache = Path()  # the hub's cache (hub.sh): its environment, the proxy
        self.class_env = Path(os.environ.get("DPC_CLASS_PREFIX", "/opt/dp-course")) / "env"
        self.repo = ""  # the release's git URL, once served
        self.base = ""  # the hub's address, once up
        self.book: Path | None = None  # the course's website, once built
        self.stack = contextlib.ExitStack()  # spawner slurm: the two-node cluster, closed by the tear-down
        self.cluster: Any = None  # spawner slurm: dpc_setup.cluster.Cluster, once up
        # Everything this run starts carries its tag (the hub passes it on to the proxy); a guardian
        # removes what the run made if the run dies before its tear-down (SIGKILL, a hard timeout).
        os.environ[RUN_MARKER] = self.tag
        self.guard = Guard(marker=(RUN_MARKER, self.tag), folders=[str(self.exchange)],
                           cgroups=[str(m / self.cgroup) for m in cgroup_roots()])
