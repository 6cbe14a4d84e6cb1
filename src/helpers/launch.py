"""Run a worker script on N processes from a notebook with the real launcher; never leave orphans.

Launchers: 'torchrun' (torch.distributed.run, standalone rendezvous on a free port),
'horovodrun' (gloo on CPU), and 'tf' (plain processes with TF_CONFIG for TensorFlow
multi-worker training). Each rank's output is streamed with a `[rank N]` prefix. On a crash,
a hang (timeout) or an interrupt, the whole process tree is killed and one LaunchError names
the failing rank(s) with the last lines they printed.
"""
from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

LAUNCHERS = ("torchrun", "horovodrun", "tf")
MARKER = "DPC_LAUNCH_ID"  # put in every launched process's environment, to find them all again
TAIL = 15  # lines kept per rank for error messages

# Where a launcher tells us which rank printed a line.
_PREFIX = {
    "torchrun": re.compile(r"^\[(?:rank|default)(\d+)\]:(.*)$"),
    "horovodrun": re.compile(r"^\[(\d+)\]<std(?:out|err)>:(.*)$"),
}

_RANK_TAG = re.compile(r"^\[rank\d+\]:\s?")  # torch tags a worker's traceback lines itself


class LaunchError(RuntimeError):
    """A launch that crashed or hung; .ranks are the culprits and .tails their last lines."""

    def __init__(self, message: str, ranks: list[int], tails: dict[int, list[str]]) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.tails = tails


@dataclass
class LaunchResult:
    """What a successful launch printed, per rank, and how long it took."""

    nprocs: int
    seconds: float
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher_output: list[str] = field(default_factory=list)

    def lines(self, rank: int) -> list[str]:
        """All lines printed by one rank."""
        return self.outputs.get(rank, [])


def free_port() -> int:
    """A TCP port on localhost that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """Path of a console script of this Python's environment (falls back to PATH)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH: run `make setup`")
    return found


def _commands(launcher: str, script: str, nprocs: int, args: Sequence[str],
              python: str) -> list[tuple[int | None, list[str], dict[str, str]]]:
    """The processes to start: (rank or None for a launcher, argv, extra environment)."""
    if launcher == "torchrun":
        argv = [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={nprocs}", "--tee=3", "--role=rank", script, *args]
        return [(None, argv, {})]
    if launcher == "horovodrun":
        argv = [_bin("horovodrun"), "-np", str(nprocs), "-H", f"localhost:{nprocs}", "--gloo",
                "--gloo-timeout-seconds", "60", python, script, *args]
        return [(None, argv, {})]
    ports = [free_port() for _ in range(nprocs)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    return [(rank, [python, script, *args],
             {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}),
              "RANK": str(rank), "WORLD_SIZE": str(nprocs)})
            for rank in range(nprocs)]


def launch(script: str | os.PathLike[str], nprocs: int = 2, *, launcher: str = "torchrun",
           args: Sequence[str] = (), timeout: float = 120.0, env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike[str] | None = None, echo: bool = True) -> LaunchResult:
    """Run script on nprocs processes with launcher; stream `[rank N]` output; raise LaunchError."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: use one of {LAUNCHERS}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: ask for at least 1 process")
    script = str(Path(script).resolve())
    if not Path(script).is_file():
        raise FileNotFoundError(f"worker script {script} does not exist")
    launch_id = uuid.uuid4().hex
    base_env = {**os.environ, **(env or {}), MARKER: launch_id, "PYTHONUNBUFFERED": "1"}
    procs: list[tuple[int | None, subprocess.Popen[bytes]]] = []
    stream = _Stream(launcher, nprocs, echo)
    start = time.monotonic()
    try:
        for rank, argv, extra in _commands(launcher, script, nprocs, args, sys.executable):
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env={**base_env, **extra}, cwd=cwd,
                                 start_new_session=True)
            procs.append((rank, p))
        failed = stream.pump(procs, start + timeout)
        seconds = time.monotonic() - start
        if failed is None:  # timed out
            hung = _live_ranks(launch_id) or list(range(nprocs))
            raise stream.error(f"timed out after {timeout:.0f} s; still running: "
                               f"{_ranks_text(hung)} (a hang: a collective waiting for a peer?)", hung)
        if failed:
            ranks = stream.failed_ranks(procs)
            raise stream.error(f"{_ranks_text(ranks)} failed", ranks)
        return LaunchResult(nprocs, seconds, stream.outputs, stream.launcher_lines)
    finally:
        kill_launch(launch_id, [p for _, p in procs])


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class _Stream:
    """Reads every pipe in the main thread, prefixes lines by rank, keeps per-rank tails."""

    def __init__(self, launcher: str, nprocs: int, echo: bool) -> None:
        self.launcher, self.nprocs, self.echo = launcher, nprocs, echo
        self.outputs: dict[int, list[str]] = {r: [] for r in range(nprocs)}
        self.launcher_lines: list[str] = []
        self.tails: dict[int, deque[str]] = {r: deque(maxlen=TAIL) for r in range(nprocs)}
        self.quiet = False

    def line(self, rank: int | None, text: str) -> None:
        if rank is None:
            m = _PREFIX[self.launcher].match(text)
            if m and int(m.group(1)) in self.outputs:
                rank, text = int(m.group(1)), _RANK_TAG.sub("", m.group(2))
        if rank is None:
            self.launcher_lines.append(text)
            # The launcher's own failure report is summarised by LaunchError: do not echo it.
            self.quiet = self.quiet or text.startswith("Traceback") or " failed (exitcode" in text
            if self.echo and not self.quiet and text.strip(" *"):
                print(f"[{self.launcher}] {text}", flush=True)
            return
        self.outputs[rank].append(text)
        self.tails[rank].append(text)
        if self.echo:
            print(f"[rank {rank}] {text}", flush=True)

    def pump(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]],
             deadline: float, stop_on_failure: bool | None = None) -> bool | None:
        """Stream until every process ended (True if one failed) or the deadline (None).

        stop_on_failure: return True as soon as one process fails (default: for plain processes
        only, since torchrun and horovodrun stop their own workers).
        """
        if stop_on_failure is None:
            stop_on_failure = self.launcher == "tf"
        sel = selectors.DefaultSelector()
        buffers: dict[int, bytes] = {}
        for rank, p in procs:
            assert p.stdout is not None
            os.set_blocking(p.stdout.fileno(), False)
            sel.register(p.stdout, selectors.EVENT_READ, (rank, p))
        open_pipes = len(procs)
        while open_pipes:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key, _ in sel.select(timeout=min(left, 0.2)):
                rank, p = key.data
                chunk = os.read(key.fd, 65536)
                buffers[key.fd] = self.feed(rank, buffers.get(key.fd, b"") + chunk, final=not chunk)
                if not chunk:  # EOF
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
            # With plain processes, one crashed worker leaves its peers waiting forever: stop now.
            if any(p.poll() not in (None, 0) for _, p in procs):
                if stop_on_failure:
                    self._drain(sel, buffers)  # keep the crashed worker's last words
                    return True
        for _, p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return None
        return any(p.returncode != 0 for _, p in procs)

    def _drain(self, sel: selectors.BaseSelector, buffers: dict[int, bytes]) -> None:
        """Read, without waiting, what the open pipes still hold (e.g. an exited worker's traceback)."""
        for key in list(sel.get_map().values()):
            rank, _ = key.data
            data = buffers.pop(key.fd, b"")
            for _ in range(16):  # bounded: a live peer may keep writing
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:  # EOF
                    break
                data += chunk
            self.feed(rank, data, final=True)

    def feed(self, rank: int | None, data: bytes, final: bool) -> bytes:
        """Emit the complete lines of data (and, if final, the partial last one); return the rest."""
        *full, rest = data.split(b"\n")
        for raw in full:
            self.line(rank, raw.decode(errors="replace").rstrip("\r"))
        if final and rest:
            self.line(rank, rest.decode(errors="replace"))
            return b""
        return rest

    def failed_ranks(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]]) -> list[int]:
        """Ranks that failed: from exit codes, the launcher's summary, or a printed traceback."""
        ranks = {r for r, p in procs if r is not None and p.returncode not in (None, 0)}
        text = "\n".join(self.launcher_lines)
        if self.launcher == "torchrun":
            ranks |= _torchrun_culprits(text)
        elif self.launcher == "horovodrun":
            ranks |= {int(r) for r, code in
                      re.findall(r"Process (\d+) exit with status code (-?\d+)", text) if code != "0"}
        if not ranks:
            ranks = {r for r, lines in self.outputs.items()
                     if any(ln.startswith("Traceback") for ln in lines)}
        return sorted(ranks) or list(range(self.nprocs))

    def error(self, what: str, ranks: list[int]) -> LaunchError:
        tails = {r: list(self.tails[r]) for r in ranks}
        parts = [f"{self.launcher} with {self.nprocs} process(es): {what}."]
        for r in ranks:
            parts.append(f"--- last lines of rank {r} ---")
            parts += [f"    {ln}" for ln in tails[r]] or ["    (printed nothing)"]
        if not any(tails.values()) and self.launcher_lines:
            parts.append(f"--- last lines of {self.launcher} ---")
            parts += [f"    {ln}" for ln in self.launcher_lines[-TAIL:]]
        return LaunchError("\n".join(parts), ranks, tails)


def _torchrun_culprits(report: str) -> set[int]:
    """Ranks that failed by themselves in torchrun's report (not those it stopped afterwards)."""
    failures = [(int(r), int(code)) for r, code in re.findall(
        r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", report)]
    root = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", report, re.S)
    if root:  # the first rank to fail; its peers often fail next, only because it vanished
        return {int(root.group(1))}
    return {r for r, code in failures if code > 0} or {r for r, _ in failures}


def _marked(launch_id: str) -> list[psutil.Process]:
    """Every live process of this user whose environment carries this launch's marker."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == launch_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _live_ranks(launch_id: str) -> list[int]:
    ranks = set()
    for proc in _marked(launch_id):
        try:
            envr = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):
            continue
        for key in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
            if key in envr:
                ranks.add(int(envr[key]))
                break
    return sorted(ranks)


def kill_launch(launch_id: str, roots: Sequence[subprocess.Popen[bytes]] = (),
                grace: float = 3.0) -> None:
    """Terminate, then kill, every process of a launch: its roots, their descendants, marked ones."""
    procs: dict[int, psutil.Process] = {p.pid: p for p in _marked(launch_id)}
    for root in roots:
        try:
            proc = psutil.Process(root.pid)
            procs[proc.pid] = proc
            procs.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            pass
    procs.pop(os.getpid(), None)
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    for root in roots:  # reap our direct children so none is left a zombie
        try:
            root.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        if root.stdout:
            root.stdout.close()
