"""A LocalProcessSpawner that runs each user's server in a cgroup of its own: CPU quota, memory and
process limits, without systemd (cgroup v2 where it has the controllers, else v1's cpu, memory and
pids hierarchies). The cgroup is removed when the server stops, with anything still in it.

    c.JupyterHub.spawner_class = "dpc_instructor.hub.spawner.CgroupSpawner"
    c.Spawner.cpu_limit = 1.5        # cores (CPU quota)
    c.Spawner.mem_limit = "4G"       # memory (the kernel that goes past it is killed, alone)
    c.CgroupSpawner.pids_limit = 512 # processes and threads
    c.CgroupSpawner.cgroup_parent = "dp-course-hub"  # the folder of the users' cgroups in each hierarchy

The hub must run as root (it starts servers as the users and writes the cgroups).
"""
from __future__ import annotations

import re
from collections.abc import Callable

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Integer, Unicode

from dpc_instructor.hub.cgroups import UserCgroup, join_cgroup_then


class CgroupSpawner(LocalProcessSpawner):
    """Each user's server (and so every kernel and worker it starts) in its own cgroup with
    Spawner.cpu_limit cores, Spawner.mem_limit bytes and pids_limit tasks; removed on stop."""

    pids_limit = Integer(1024, config=True, help="Most processes and threads per user (0: no limit).")
    cgroup_parent = Unicode("dp-course-hub", config=True,
                     help="Folder of the users' cgroups in each hierarchy (one per hub).")
    require_limits = Bool(True, config=True,
                          help="Refuse to start a server when no cgroup can be made (else start it unlimited).")

    def _cgroup(self) -> UserCgroup:
        """This user's cgroup (a name the kernel accepts, made from the user's name)."""
        return UserCgroup(self.cgroup_parent, re.sub(r"[^A-Za-z0-9_.-]", "_", self.user.name))

    async def start(self) -> object:
        """Make the user's cgroup with its limits, then start the server inside it."""
        self._dpc_cgroup: UserCgroup | None = None
        try:
            cg = self._cgroup()
            cg.create(float(self.cpu_limit or 0), int(self.mem_limit or 0), int(self.pids_limit))
            self._dpc_cgroup = cg
            self.log.info("cgroup v%d for %s: cpu %s, memory %s, pids %s: %s", cg.version, self.user.name,
                          self.cpu_limit, self.mem_limit, self.pids_limit, ", ".join(map(str, cg.dirs)))
        except (OSError, RuntimeError) as e:
            if self.require_limits:
                raise RuntimeError(f"cannot give {self.user.name} a cgroup: {e}") from e
            self.log.warning("starting %s without limits: %s", self.user.name, e)
        try:
            return await super().start()
        except BaseException:
            if self._dpc_cgroup is not None:  # no server: no cgroup either
                await self._dpc_cgroup.remove()
                self._dpc_cgroup = None
            raise

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        """LocalProcessSpawner's (become the user), after joining the user's cgroup."""
        drop = super().make_preexec_fn(name)
        cg = getattr(self, "_dpc_cgroup", None)
        return drop if cg is None else join_cgroup_then(cg.join_files(), drop)

    async def stop(self, now: bool = False) -> None:
        """Stop the server, then end whatever it left in its cgroup and remove the cgroup."""
        await super().stop(now=now)
        try:
            cg = getattr(self, "_dpc_cgroup", None) or self._cgroup()
        except RuntimeError:
            return
        await cg.remove()
        self._dpc_cgroup = None
