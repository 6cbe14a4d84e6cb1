"""A guardian that removes what a run made once the run's process is gone, however it went (issue 39).

A run that brings up daemons or makes accounts (the SLURM test cluster of `dpc_setup.cluster`,
chapter 10's SLURM section, the classroom harness) cleans up in a `finally:` block; that block
never runs when the process is killed (SIGKILL, an out-of-memory kill, a notebook kernel killed
after a cell timeout, a test runner's hard timeout). So each such run starts a guardian first:

    guard = Guard(marker=("DPC_CLUSTER_ID", cluster_id), folders=[folder])
    ...                       # start daemons with the marker in their environment
    guard.dismiss()           # the run cleaned up itself: the guardian leaves

The guardian is a small process in its own session (a signal to the run's process group does not
reach it) that blocks reading a pipe whose only writer is the run. When the run ends, the pipe
closes; unless the run dismissed it first, the guardian then kills every process carrying the
marker or owned by the run's accounts, deletes the accounts, removes the cgroups and the folders,
and exits. Everything it did is appended to its log.

    python -m dpc_runtime.reaper --plan plan.json   # what Guard starts (reads the pipe on stdin)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

DISMISS = b"dismiss\n"


@dataclass
class Plan:
    """What one run made: the guardian removes all of it if the run dies without dismissing it."""

    marker: tuple[str, str] | None = None  # (variable, value) in the environment of every process of the run
    users: list[str] = field(default_factory=list)  # accounts to delete (their processes are killed first)
    cgroups: list[str] = field(default_factory=list)  # cgroup folders (absolute paths) to remove, children first
    folders: list[str] = field(default_factory=list)  # folders to remove
    pids: list[int] = field(default_factory=list)  # process groups to kill (daemons started in their own session)
    log: str = ""  # where the guardian writes what it did ('' : a file beside the plan)


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def marked(variable: str, value: str) -> list[int]:
    """Pids of live processes (any user) whose environment holds variable=value."""
    want = f"{variable}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if want in (proc / "environ").read_bytes().split(b"\0") and _live(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def guarded(variable: str, value: str) -> bool:
    """True while a guardian (Guard) of the run marked variable=value is alive: it lives exactly as long as the
    run that started it (a run's own marker, set once it runs, is not in its /proc environ; its guardian is)."""
    for plan in Path(tempfile.gettempdir()).glob("dpc-guard-*/plan.json"):
        try:
            if json.loads(plan.read_text()).get("marker") != [variable, value]:
                continue
        except (OSError, ValueError):
            continue  # being rewritten, or gone
        want = str(plan).encode()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and want in (proc / "cmdline").read_bytes().split(b"\0") \
                        and _live(int(proc.name)):
                    return True
            except OSError:
                continue
    return False


def owned_by(uids: set[int]) -> list[int]:
    """Pids of live processes whose real user is one of uids."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) in uids and _live(int(proc.name)):
                found.append(int(proc.name))
                break
    return found


TERM_THEN_KILL = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0))  # (signal, seconds to wait for the end)


def kill_all(find: Callable[[], list[int]], say: list[str], what: str,
             signals: Sequence[tuple[signal.Signals, float]] = TERM_THEN_KILL) -> None:
    """Each signal in turn (default SIGTERM, then SIGKILL) to whatever find() returns, until it returns nothing
    (each bounded by its grace seconds); the lines say what was sent and what survived (also the classroom's)."""
    for sig, grace in signals:
        pids = find()
        if not pids:
            return
        say.append(f"{signal.Signals(sig).name} to {len(pids)} process(es) of {what}: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while find() and time.monotonic() < end:
            time.sleep(0.1)  # the kernel ending them (bounded by grace)
    if find():
        say.append(f"still alive after {signal.Signals(signals[-1][0]).name} ({what}): {find()}")


def clean(plan: Plan) -> list[str]:
    """Remove everything the plan names; the lines say what was done (used by the guardian and by a start
    that finds an earlier run's leftovers)."""
    say: list[str] = []
    for pid in plan.pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            say.append(f"SIGKILL to process group {pid}")
    if plan.marker:
        variable, value = plan.marker
        kill_all(lambda: marked(variable, value), say, f"{variable}={value}")
    uids = set()
    for user in plan.users:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    if uids:
        kill_all(lambda: owned_by(uids), say, f"the accounts {sorted(plan.users)}")
    for user in plan.users:
        try:
            home = pwd.getpwnam(user).pw_dir
        except KeyError:
            continue
        done = subprocess.run(["userdel", "--remove", user], capture_output=True, text=True)
        say.append(f"userdel --remove {user}: exit {done.returncode}")
        if home.startswith("/home/") and Path(home).exists():
            shutil.rmtree(home, ignore_errors=True)
    for cgroup in plan.cgroups:
        root = Path(cgroup)
        if not root.exists():
            continue
        for child in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
        say.append(f"cgroup {cgroup}: {'left (busy)' if root.exists() else 'removed'}")
    for folder in plan.folders:
        if Path(folder).exists():
            shutil.rmtree(folder, ignore_errors=True)
            say.append(f"removed {folder}")
    return say


class Guard:
    """Start a guardian for a run (see the module's docstring); dismiss() when the run cleaned up itself."""

    def __init__(self, plan: Plan | None = None, **fields: object) -> None:
        self.plan = plan or Plan(**fields)  # type: ignore[arg-type]
        self.folder = Path(tempfile.mkdtemp(prefix="dpc-guard-"))
        self.plan_file = self.folder / "plan.json"
        if not self.plan.log:
            self.plan.log = str(self.folder / "guard.log")
        self._write()
        env = {k: v for k, v in os.environ.items() if not (self.plan.marker and k == self.plan.marker[0])}
        src = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dpc_runtime.reaper", "--plan", str(self.plan_file)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, close_fds=True)
        assert self.proc.stdin is not None
        os.set_inheritable(self.proc.stdin.fileno(), False)  # only this process holds the pipe open

    def _write(self) -> None:
        tmp = self.plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.plan)))
        tmp.replace(self.plan_file)  # the guardian rereads it when it wakes

    def add(self, *, users: Sequence[str] = (), cgroups: Sequence[str] = (), folders: Sequence[str] = (),
            pids: Sequence[int] = ()) -> None:
        """Tell the guardian of more things the run made (before making them)."""
        self.plan.users += list(users)
        self.plan.cgroups += list(cgroups)
        self.plan.folders += list(folders)
        self.plan.pids += list(pids)
        self._write()

    def dismiss(self) -> None:
        """The run cleaned up itself: the guardian leaves without touching anything."""
        if self.proc.stdin and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(DISMISS)
                self.proc.stdin.flush()
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def guardian(plan_file: Path) -> int:
    """Wait for the run to end (the pipe on stdin closes); clean up unless it said 'dismiss' first."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C or a hang-up of the run's terminal is not ours
    got = b""
    while True:
        chunk = os.read(0, 64)
        if not chunk:
            break
        got += chunk
    if got.startswith(DISMISS):
        return 0
    plan = Plan(**json.loads(plan_file.read_text()))
    plan.marker = tuple(plan.marker) if plan.marker else None  # type: ignore[assignment]
    lines = clean(plan)
    with open(plan.log or plan_file.with_name("guard.log"), "a") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} the run ended without cleaning up; done:\n")
        log.writelines(f"  {line}\n" for line in lines)
    return 0  # the guard's folder stays: its log says what the run left and what was removed


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dpc_runtime.reaper", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, required=True, help="the run's plan (JSON, rewritten as the run goes)")
    return guardian(ap.parse_args(argv).plan)


if __name__ == "__main__":
    sys.exit(main())
