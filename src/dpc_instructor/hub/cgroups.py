"""Cgroups of the class hub's users: one cgroup per user with a CPU quota, memory and process limits
(cgroup v2 where it has the controllers, else v1's cpu, memory and pids hierarchies), joined by a
process and removed with whatever is left in it. Used by the hub's CgroupSpawner (spawner.py) and by
`python -m dpc_maintainer.needs`, which times the notebooks at a student's share of the hub.
Standard library only: it runs in the hub's environment and in the course's.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

CPU_PERIOD_US = 100_000


def cgroup_mount_table() -> list[tuple[Path, str, list[str]]]:
    """The cgroup hierarchies (v2 and v1) mounted here, from /proc/self/mounts: (mount point, 'cgroup2' or
    'cgroup', mount options). The one reader of the mount table: this module's and the classroom's."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            found.append((Path(fields[1]), fields[2], fields[3].split(",") if len(fields) > 3 else []))
    return found


def cgroup_mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount that has the cpu, memory and pids controllers (or None), and the v1 mounts
    of those controllers by name."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for where, kind, options in cgroup_mount_table():
        if kind == "cgroup2":
            try:
                have = set((where / "cgroup.controllers").read_text().split())
            except OSError:
                continue
            if {"cpu", "memory", "pids"} <= have:
                v2 = where
        else:
            for name in ("cpu", "memory", "pids"):
                if name in options:
                    v1[name] = where
    return v2, v1


class UserCgroup:
    """One user's cgroup: made with limits, joined by a process, emptied and removed."""

    def __init__(self, parent: str, name: str) -> None:
        """Find the hierarchy to use (v2 with controllers, else v1); raise RuntimeError if none."""
        v2, v1 = cgroup_mounts()
        self.version = 2 if v2 is not None else 1
        if v2 is not None:
            self.parents = [v2 / parent]
        elif {"cpu", "memory", "pids"} <= v1.keys():
            self.parents = [v1[c] / parent for c in ("cpu", "memory", "pids")]
        else:
            raise RuntimeError("no cgroup hierarchy with the cpu, memory and pids controllers "
                               "(neither cgroup v2 with them nor v1 mounts): cannot limit users")
        self.dirs = [p / name for p in self.parents]

    def create(self, cpu: float, memory: int, pids: int) -> None:
        """Make the cgroup (and its parent) and write its limits; 0 means no limit."""
        if self.version == 2:
            root, parent = self.parents[0].parent, self.parents[0]
            parent.mkdir(exist_ok=True)
            for level in (root, parent):  # the controllers, enabled for the children of each level
                (level / "cgroup.subtree_control").write_text("+cpu +memory +pids")
            d = self.dirs[0]
            d.mkdir(exist_ok=True)
            quota = f"{int(cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}" if cpu > 0 else f"max {CPU_PERIOD_US}"
            (d / "cpu.max").write_text(quota)
            (d / "memory.max").write_text(str(memory) if memory > 0 else "max")
            if memory > 0 and (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")  # no swapping past the limit
            (d / "pids.max").write_text(str(pids) if pids > 0 else "max")
            return
        cpu_dir, mem_dir, pids_dir = self.dirs
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        (cpu_dir / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (cpu_dir / "cpu.cfs_quota_us").write_text(str(int(cpu * CPU_PERIOD_US)) if cpu > 0 else "-1")
        (mem_dir / "memory.limit_in_bytes").write_text(str(memory) if memory > 0 else "-1")
        if memory > 0 and (mem_dir / "memory.memsw.limit_in_bytes").exists():
            (mem_dir / "memory.memsw.limit_in_bytes").write_text(str(memory))  # no swapping past it
        (pids_dir / "pids.max").write_text(str(pids) if pids > 0 else "max")

    def join_files(self) -> list[str]:
        """The files a process writes its pid to, to join the cgroup (in every hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        """The processes in the cgroup now (none when it does not exist)."""
        found: set[int] = set()
        for d in self.dirs:
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    async def remove(self, timeout: float = 30.0) -> None:
        """Kill what is left in the cgroup, wait until it is empty, remove it; RuntimeError if it stays."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.pids()
            if not left:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cgroup {self.dirs[0]} still holds processes {sorted(left)}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await asyncio.sleep(0.05)  # polling the kernel's list until it is empty (a deadline above)
        for d in self.dirs:
            while d.exists():
                try:
                    d.rmdir()
                except OSError as e:  # EBUSY while the last task is reaped
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cannot remove cgroup {d}: {e}") from e
                    await asyncio.sleep(0.05)


def join_cgroup_then(files: list[str], then: Callable[[], None]) -> Callable[[], None]:
    """A preexec_fn: move this (child) process into the cgroup while still root, then call `then`
    (LocalProcessSpawner's, which drops to the user)."""

    def preexec() -> None:
        """Write this process's pid to each of files (it joins the cgroup), then call `then`."""
        pid = str(os.getpid())
        for f in files:
            with open(f, "w") as fh:
                fh.write(pid)
        then()

    return preexec
