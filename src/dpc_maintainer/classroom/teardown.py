"""Tear-down (also on failure or Ctrl-C, unless --keep): stop the hub, proxy, servers and git daemon, remove the
users, homes, cgroups and exchange, and check that no process of those users is left and every port is closed.

A run killed outright (SIGKILL, a hard timeout) is cleaned by its guardian (dpc_runtime.reaper: everything the
run starts carries DPC_CLASSROOM_RUN=<tag>); every start (or `--clean` alone) removes what an earlier run left
if both were killed (accounts dpc-*-<tag>): leftovers, clean_leftovers.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dpc_maintainer.classroom.common import ACCOUNT, RUN_MARKER, cgroup_roots, port_open
from dpc_runtime.reaper import Plan, clean, guarded, kill_all, owned_by

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom

EXCHANGE = re.compile(r"^dpc-exchange-([0-9a-f]{4})-")  # a run's nbgrader exchange, in the temporary folder


def stop_hub(room: Classroom, problems: list[str]) -> None:
    """SIGTERM to the hub, which stops the users' servers and the proxy (SIGKILL after 90 s); a proxy left, SIGTERM."""
    hub = room.procs.get("hub")
    if hub is not None and hub.poll() is None:
        hub.send_signal(signal.SIGTERM)  # the hub stops the users' servers and the proxy
        try:
            hub.wait(timeout=90)
        except subprocess.TimeoutExpired:
            problems.append("the hub did not stop on SIGTERM: killed")
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait()
    pid_file = room.dir / "hub" / "jupyterhub-proxy.pid"
    if pid_file.exists():  # a proxy the hub did not stop
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def stop_cluster(room: Classroom, problems: list[str]) -> None:
    """--spawner slurm: the hub stopped, no student's job may be left; then the cluster down (jobs, daemons)."""
    if room.cluster is None:
        return
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        left = [line for line in room.cluster.run("squeue", "-h", "-o", "%i %u %j %T", timeout=20).splitlines()
                if " jupyterhub-" in line]  # the hub's jobs (the students' servers)
        if left:
            problems.append(f"SLURM jobs left after the hub stopped: {left} (cancelled)")
    room.stack.close()  # dpc_setup.cluster: scancel, daemons stopped, marked processes killed, folder removed
    if room.cluster.marked():
        problems.append(f"processes of the cluster left: {room.cluster.marked()}")


def stop_git_daemon(room: Classroom) -> None:
    """SIGTERM to the git daemon's process group, SIGKILL after 30 s."""
    git = room.procs.get("git daemon")
    if git is not None and git.poll() is None:
        os.killpg(git.pid, signal.SIGTERM)
        try:
            git.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(git.pid, signal.SIGKILL)
            git.wait()


def end_users_processes(room: Classroom, problems: list[str]) -> None:
    """SIGKILL to whatever the class's users still run once the hub stopped (the reaper's kill_all, 30 s)."""
    uids = {a.uid for a in room.made_users if a.uid}
    left = owned_by(uids)
    if left:
        problems.append(f"processes of the class still running after the hub stopped: {left} (killed)")
    kill_all(lambda: owned_by(uids), [], "the class's users", signals=((signal.SIGKILL, 30.0),))
    if owned_by(uids):
        problems.append(f"processes of the class survive SIGKILL: {owned_by(uids)}")


def remove_users(room: Classroom, problems: list[str]) -> None:
    """userdel --remove each account the run made; a home userdel left is removed (and said)."""
    for a in room.made_users:
        p = subprocess.run(["userdel", "--remove", a.name], capture_output=True, text=True)
        if p.returncode not in (0, 12):  # 12: mail spool missing, the rest is removed
            problems.append(f"userdel {a.name}: {p.stderr.strip()}")
        if Path(a.home).exists():
            shutil.rmtree(a.home, ignore_errors=True)
            problems.append(f"{a.home} was left by userdel (removed)")


def remove_cgroups(room: Classroom, problems: list[str]) -> None:
    """The hub's cgroup in every hierarchy; a user's cgroup the spawner left is removed (and said)."""
    for mount in cgroup_roots():
        d = mount / room.cgroup
        if d.exists():
            for child in sorted(d.iterdir()):
                if child.is_dir():
                    problems.append(f"cgroup {child} was left by the spawner")
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()
            if d.exists():
                problems.append(f"cannot remove cgroup {d}")


def still_there(room: Classroom) -> list[str]:
    """A port of the run still open, an account still there."""
    problems = [f"port {port} ({name}) still open" for name, port in room.ports.items() if port_open(port)]
    for a in room.made_users:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(a.name)
            problems.append(f"user {a.name} still exists")
    return problems


def tear_down(room: Classroom) -> list[str]:
    """Stop and remove all this run made; what could not be cleaned (empty when clean)."""
    problems: list[str] = []
    stop_hub(room, problems)
    stop_cluster(room, problems)
    stop_git_daemon(room)
    end_users_processes(room, problems)
    remove_users(room, problems)
    remove_cgroups(room, problems)
    shutil.rmtree(room.exchange, ignore_errors=True)
    problems += still_there(room)
    if not problems:
        room.guard.dismiss()  # else the guardian tries again when this process ends
    return problems


def leftovers() -> dict[str, list[str]]:
    """tag -> the accounts of an earlier run whose harness is gone (killed before its tear-down and its
    guardian's; a run whose accounts are gone but whose exchange folder is left has none): what
    `--clean`, and every start, removes."""
    runs: dict[str, list[str]] = {}
    for entry in pwd.getpwall():
        m = ACCOUNT.match(entry.pw_name)
        if m:
            runs.setdefault(m.group(2), []).append(entry.pw_name)
    for folder in Path(tempfile.gettempdir()).iterdir():
        m = EXCHANGE.match(folder.name)
        if m:
            runs.setdefault(m.group(1), [])
    return {tag: sorted(users) for tag, users in runs.items() if not _harness_alive(tag)}


def _harness_alive(tag: str) -> bool:
    """True while the harness of run <tag> runs (its hub and servers may outlive a killed harness): its guardian,
    which lives as long as the harness, is alive. (The harness's own marker is set once it runs: it is not in its
    /proc environ; a check by the marker's processes took a live run, between its browser phases, for a dead one,
    and a second run's start tore it down.)"""
    return guarded(RUN_MARKER, tag)


def clean_leftovers() -> list[str]:
    """Remove what earlier, killed runs left (processes, accounts, cgroups); the lines say what."""
    said = []
    for tag, users in sorted(leftovers().items()):
        plan = Plan(marker=(RUN_MARKER, tag), users=users,
                    cgroups=[str(m / f"dp-course-hub-{tag}") for m in cgroup_roots()],
                    folders=[str(f) for f in Path(tempfile.gettempdir()).glob(f"dpc-exchange-{tag}-*")])
        said += [f"run {tag}: {line}" for line in clean(plan)]
    return said
