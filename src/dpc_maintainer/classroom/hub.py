"""The machine and the hub: whether a class can run here (root, apt or chromium, npm), src/dpc_setup/hub.sh
(chromium, the proxy, the hub's own environment), the class environment (`make class-env`), a JupyterHub with
PAM logins and per-user cgroups (src/dpc_instructor/hub/jupyterhub_config.py) on free loopback ports, and the
course's website built with this hub's link (dpc_maintainer.book).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from dpc_maintainer.classroom.common import CHROMIUM, COURSE_ID, FOLDER, ROOT, StepFailed, http_status, run, wait_for

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def unavailable() -> str:
    """Why a classroom cannot run on this machine ('' when it can): root, apt or chromium, npm, git."""
    if os.geteuid() != 0:
        return "not root (users, cgroups and PAM logins need root)"
    if not Path(CHROMIUM).exists() and not shutil.which("apt-get"):
        return "no chromium and no apt-get to install it"
    if not shutil.which("npm") and not (Path.home() / ".cache/dp-course/hub/npm/node_modules/.bin").is_dir():
        return "no npm (configurable-http-proxy is an npm package)"
    for tool in ("git", "useradd", "node"):
        if not shutil.which(tool):
            return f"no {tool}"
    return ""


def install(room: Classroom) -> None:
    """src/dpc_setup/hub.sh: chromium, the proxy, the hub's environment (only what is missing)."""
    out = run(["bash", str(ROOT / "src/dpc_setup/hub.sh")], "hub.sh", room.log)
    room.cache = Path(out.strip().splitlines()[-1].split(" in ", 1)[1])


def ensure_class_env(room: Classroom) -> None:
    """The class environment every user runs (`make class-env`; returns at once when built)."""
    prefix = room.class_env.parent
    run(["make", "-s", "class-env", f"PREFIX={prefix}"], "make class-env", room.log, cwd=ROOT, timeout=3600)
    if not (room.class_env / "bin" / "jupyterhub-singleuser").exists():
        raise StepFailed(f"{room.class_env} has no jupyterhub-singleuser (requirements-hub.txt)")


def hub_env(room: Classroom, state: Path) -> dict[str, str]:
    """The hub's environment: its own venv first, and what jupyterhub_config.py reads (ports, users, limits)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update({
        "PATH": f"{room.cache / 'venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "DPC_CLASS_ENV": str(room.class_env), "DPC_COURSE_FOLDER": FOLDER, "DPC_HUB_STATE": str(state),
        "DPC_COURSE_ID": COURSE_ID, "DPC_EXCHANGE": str(room.exchange),
        "DPC_HUB_PORT": str(room.ports["hub"]), "DPC_HUB_API_PORT": str(room.ports["hub-api"]),
        "DPC_PROXY_API_PORT": str(room.ports["proxy-api"]),
        "DPC_CHP": str(room.cache / "npm/node_modules/.bin/configurable-http-proxy"),
        "DPC_HUB_USERS": ",".join(a.name for a in [*room.students, room.instructor]),
        "DPC_HUB_ADMINS": room.instructor.name, "DPC_HUB_CGROUP": room.cgroup,
        "DPC_HUB_CPU": room.cpu, "DPC_HUB_MEM": room.mem, "DPC_HUB_PIDS": "2048",
        "PYTHONPATH": str(ROOT / "src"),  # the config names its spawner, dpc_instructor.hub.spawner
    })
    if room.cluster is not None:  # each server a SLURM job on the run's two-node cluster
        from dpc_maintainer.classroom.faults import CULL_S
        from dpc_setup.cluster import NODE_ADDR

        env.update({"DPC_HUB_SPAWNER": "slurm", "SLURM_CONF": str(room.cluster.conf), "DPC_HUB_TIME": "01:00:00",
                    "DPC_HUB_CULL_S": str(CULL_S),
                    "DPC_HUB_NODES": ",".join(f"{n}={a}" for n, a in NODE_ADDR.items())})
    return env


def start_cluster(room: Classroom) -> None:
    """The two-node SLURM cluster (dpc_setup.cluster) the servers run on, until the tear-down closes it."""
    from dpc_setup.cluster import cluster

    room.cluster = room.stack.enter_context(cluster())
    print(f"classroom:   cluster {room.cluster.conf}: {room.cluster.sinfo()}", flush=True)


def start_hub(room: Classroom) -> None:
    """JupyterHub (PAM, per-user cgroups, the class environment) and its proxy on loopback ports."""
    state = room.dir / "hub"
    state.mkdir()
    with (room.dir / "hub.log").open("wb") as log:
        room.procs["hub"] = subprocess.Popen(
            [str(room.cache / "venv/bin/jupyterhub"), "-f", str(ROOT / "src/dpc_instructor/hub/jupyterhub_config.py")],
            cwd=state, env=hub_env(room, state), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{room.ports['hub']}"
    try:
        wait_for("the hub", lambda: http_status(f"{base}/hub/api/") == 200, 120,
                 alive=lambda: room.procs["hub"].poll() is None)
    except StepFailed as e:
        tail = "\n".join((room.dir / "hub.log").read_text(errors="replace").splitlines()[-15:])
        raise StepFailed(f"{e}\n{tail}") from None
    room.base = base


def build_book(room: Classroom) -> None:
    """The course's website (dpc_maintainer.book, its own environment) whose hub links lead to this hub."""
    run(["make", "-s", "book-env"], "make book-env", room.log, cwd=ROOT)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = str(ROOT / "src")
    run([str(ROOT / "build/book-env/bin/python"), "-m", "dpc_maintainer.book", "--out", str(room.dir / "book"),
         "--src", str(room.dir / "book-src"), "--hub-url", room.base, "--repo", room.repo],
        "make book", room.log, cwd=ROOT, env=env)
    room.book = room.dir / "book"
