"""What every stage of a class run uses: the paths, names and deadlines, a failed step (StepFailed), the
timeline, an account, running a command, waiting for an event, and the cgroup hierarchies.

Standard library only (and the stdlib-only cgroups module): the browser phase imports this package in the
hub's environment (Playwright, no psutil or torch).
"""
from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpc_instructor.hub.cgroups import cgroup_mount_table

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build" / "classroom"
COURSE_ID = "dp-course"
FOLDER = "dp-course-student"  # the release's folder name: what nbgitpuller clones into each home
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DEFAULT_LAB = "05-ring-allreduce"
CHAPTER = "course/05-ring-allreduce.ipynb"  # the chapter students open from the course's website, by its hub link
FAIRNESS_LAB = "06-horovod"  # a heavy lab: Horovod ranks (horovodrun itself imports TensorFlow)
# Deadlines (seconds) of the waits: generous, for a loaded 2-core machine; every wait ends on an event.
SPAWN_S = 300
RUN_ALL_S = 900
COMMAND_S = 900
SAVE_S = 120  # File > Save Notebook until the saved notebook shows the run
PRESS_S = 15  # a menu press that starts no save within this is pressed again

RUN_MARKER = "DPC_CLASSROOM_RUN"  # in the environment of the harness and all it starts: <tag> of the run
ACCOUNT = re.compile(r"^dpc-(student\d+|instructor)-([0-9a-f]{4})$")  # the accounts a run makes


class StepFailed(RuntimeError):
    """A step of the run failed; the message says which and why."""


@dataclass
class Timeline:
    """Steps with their seconds, printed as they end."""

    steps: list[tuple[str, float, str]] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time one step; a failure is recorded, printed and raised as StepFailed."""
        t0 = time.monotonic()
        print(f"classroom: {name} ...", flush=True)
        try:
            yield
        except BaseException as e:
            dt = time.monotonic() - t0
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"FAILED: {e}"
            self.steps.append((name, dt, why))
            print(f"classroom: [{dt:7.1f} s] {name}: {why}", flush=True)
            if isinstance(e, (StepFailed, KeyboardInterrupt)):
                raise
            raise StepFailed(f"{name}: {e}") from e
        dt = time.monotonic() - t0
        self.steps.append((name, dt, "ok"))
        print(f"classroom: [{dt:7.1f} s] {name}: ok", flush=True)

    def report(self) -> str:
        """The timeline as a table with the total."""
        lines = ["", "classroom timeline:"]
        lines += [f"  {dt:7.1f} s  {name}{'' if how == 'ok' else '  (' + how + ')'}" for name, dt, how in self.steps]
        lines.append(f"  {time.monotonic() - self.start:7.1f} s  total")
        return "\n".join(lines)


@dataclass
class Account:
    """A Linux account of the class."""

    name: str
    password: str
    home: str
    uid: int = 0
    gid: int = 0
    filled: bool = True  # a student who fills the answers (the other hands in the lab unfilled)


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(what: str, ready: Any, timeout: float, alive: Any = None) -> None:
    """Poll ready() until it is true; StepFailed after timeout or when alive() says the server died."""
    deadline = time.monotonic() + timeout
    while not ready():
        if alive is not None and not alive():
            raise StepFailed(f"{what}: the process ended")
        if time.monotonic() > deadline:
            raise StepFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)  # polling an event (a port, a URL) with a deadline, not a fixed wait


def http_status(url: str) -> int:
    """The HTTP status of GET url (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def run(cmd: list[str], what: str, log: Path, timeout: float = COMMAND_S, **kw: Any) -> str:
    """Run a command, its output appended to log; StepFailed with the output's tail when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise StepFailed(f"{what}: no result within {timeout:.0f} s") from e
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise StepFailed(f"{what}: exit {p.returncode}\n{tail}")
    return p.stdout


def cgroup_roots() -> list[Path]:
    """The mount points of the cgroup hierarchies (v2 and v1) this machine has (the hub's cgroups module reads
    the mount table)."""
    return [where for where, _, _ in cgroup_mount_table()]
