"""With --spawner slurm: each student's server must be a SLURM job of theirs (squeue: one each, spread over both
nodes when there are two students or more), their kernel must run inside that job (its environment names the
job, a slurmstepd is among its ancestors), and the launches their lab makes (torchrun) must run inside it too:
watch_launches samples the students' processes while they work and keeps what each torchrun's environment says.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dpc_maintainer.classroom.common import StepFailed

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom

LAUNCHERS = (b"torch.distributed.run", b"torchrun")  # what helpers.launch starts: the launcher of the ranks


def environ(pid: int) -> dict[str, str]:
    """A process's environment ({} when it is gone)."""
    import psutil  # the harness's side (the course's environment)

    try:
        return dict(psutil.Process(pid).environ())
    except psutil.NoSuchProcess:
        return {}


def ancestors(pid: int) -> list[str]:
    """The command names of a process's ancestors, nearest first."""
    import psutil

    try:
        return [p.name() for p in psutil.Process(pid).parents()]
    except psutil.NoSuchProcess:
        return []


def processes_of(uid: int, needles: tuple[bytes, ...]) -> list[int]:
    """Pids of uid's processes whose command line holds one of needles."""
    from dpc_runtime.reaper import owned_by  # the harness's side (the course's environment)

    found = []
    for pid in owned_by({uid}):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            if any(n in argv for n in needles):
                found.append(pid)
    return found


@contextlib.contextmanager
def watch_launches(room: Classroom, needles: tuple[bytes, ...] = LAUNCHERS) -> Iterator[dict[str, set[tuple[str, str]]]]:
    """While the block runs: per student, the (SLURM job, node) of every torchrun (needles) they started (sampled)."""
    seen: dict[str, set[tuple[str, str]]] = {s.name: set() for s in room.students}
    stop = threading.Event()

    def sample() -> None:
        """Look at the students' launchers until the block ends."""
        while not stop.is_set():
            for s in room.students:
                for pid in processes_of(s.uid, needles):
                    env = environ(pid)
                    seen[s.name].add((env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")))
            stop.wait(0.1)  # a sample every 0.1 s until the work ends (the event)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()


def student_jobs(room: Classroom) -> dict[str, list[tuple[str, str, str]]]:
    """user -> [(job id, state, node)] of the hub's jobs (jupyterhub-<user>) squeue lists."""
    out = room.cluster.run("squeue", "-h", "-o", "%i|%u|%j|%T|%N")
    jobs: dict[str, list[tuple[str, str, str]]] = {}
    for line in out.splitlines():
        job, user, name, state, node = line.strip().split("|")
        if name == f"jupyterhub-{user}":
            jobs.setdefault(user, []).append((job, state, node))
    return jobs


def check_jobs(room: Classroom, launches: dict[str, set[tuple[str, str]]]) -> None:
    """One running job per student, over both nodes; each kernel, and each filled student's launch, inside it."""
    jobs = student_jobs(room)
    print(f"classroom:   squeue: {room.cluster.squeue().strip()}", flush=True)
    wrong = []
    for s in room.students:
        mine = jobs.get(s.name, [])
        if len(mine) != 1 or mine[0][1] != "RUNNING":
            wrong.append(f"{s.name}: jobs {mine or 'none'}, expected one RUNNING")
            continue
        job, _, node = mine[0]
        kernels = processes_of(s.uid, (b"ipykernel_launcher",))
        outside = [pid for pid in kernels if environ(pid).get("SLURM_JOB_ID") != job
                   or "slurmstepd" not in ancestors(pid)]
        if not kernels or outside:
            wrong.append(f"{s.name}: kernels {kernels}, not inside job {job}: {outside}")
        ran = launches.get(s.name, set())
        if s.filled and (not ran or ran != {(job, node)}):
            wrong.append(f"{s.name}: launches seen in (job, node) {sorted(ran) or 'none'}, expected only {(job, node)}")
        print(f"classroom:   {s.name}: job {job} on {node}; kernels {kernels}; launches in {sorted(ran)}", flush=True)
    nodes = {j[0][2] for j in jobs.values() if j}
    if len(room.students) >= 2 and len(nodes) < 2:
        wrong.append(f"the servers all landed on {sorted(nodes)}: expected both nodes")
    if wrong:
        raise StepFailed("; ".join(wrong))
