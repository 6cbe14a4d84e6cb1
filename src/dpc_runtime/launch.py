"""Run a worker script on N processes from a notebook with the real launcher; never leave orphans.

Launchers: 'torchrun' (torch.distributed.run, standalone rendezvous on a free port),
'horovodrun' (gloo on CPU), and 'tf' (plain processes with TF_CONFIG for TensorFlow
multi-worker training). Each rank's output is streamed with a `[rank N]` prefix. On a crash,
a hang (timeout) or an interrupt, the whole process tree is killed and one LaunchError names
the rank(s) that stopped taking part, with the last lines they printed.

Every process a launch started ends with it, however it left: while a launch runs, this process is
the "child subreaper" of its descendants (Linux prctl), so one that a rank double-forked, moved to a
session of its own and stripped of its environment is adopted here instead of by init, and stopped
when the launch ends (a stray DataLoader worker, a daemon, a forger of the launch's evidence).

Workers speak the course's protocol (helpers.worker): their results come back as
`LaunchResult.report(rank)`, and a rank that said it was done is never counted as a failure,
whatever its process does while shutting down.
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
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .quiet import harmless
from .worker import (
    DONE,
    DUMP_SIGNAL,
    PROTOCOL_DIR,
    RANK_DEVICE,
    RESULT,
    START,
    Frame,
    Placement,
    parse_line,
    placement,
    stuck_at,
)

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
    """A launch that crashed or hung; .ranks are the culprits and .tails their last lines;
    .result is what the launch left behind (every rank's output, reports, exit code and stack)."""

    def __init__(self, message: str, ranks: list[int], tails: dict[int, list[str]],
                 result: LaunchResult | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.tails = tails
        self.result = result


@dataclass
class LaunchResult:
    """What a launch printed and reported, per rank, and how long it took.

    exit_codes (rank -> status, negative: ended by that signal) and stacks (rank -> each thread's
    frames, innermost first, where the launcher stopped it) are filled in for a failed launch
    (LaunchError.result), from what the launcher and the ranks' stack dumps said.
    """

    nprocs: int
    seconds: float
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher_output: list[str] = field(default_factory=list)
    results: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)
    stacks: dict[int, list[list[Frame]]] = field(default_factory=dict)

    def lines(self, rank: int) -> list[str]:
        """All lines printed by one rank (the protocol's own lines left out)."""
        return self.outputs.get(rank, [])

    def reports(self, rank: int = 0) -> list[dict[str, Any]]:
        """Every report(...) of one rank, in order."""
        return self.results.get(rank, [])

    def report(self, rank: int = 0) -> dict[str, Any]:
        """What one rank reported with helpers.worker.report(...), merged into one dict."""
        got = self.reports(rank)
        if not got:
            raise LookupError(f"rank {rank} reported nothing: the worker script must call "
                              "helpers.worker.report(name=value, ...) on that rank")
        merged: dict[str, Any] = {}
        for item in got:
            merged.update(item)
        return merged


def free_port() -> int:
    """A TCP port on localhost that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def console_script(name: str) -> str:
    """Path of a console script of this Python's environment (falls back to PATH)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found and name.startswith("horovod"):  # `make lab` leaves Horovod's build for chapter 6
        raise FileNotFoundError(f"{name} not found next to {sys.executable}: Horovod is not built yet. Run "
                                "`make horovod` in a terminal of this course (once per machine; its first line says "
                                "how long), then run this cell again")
    if not found:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH: run `make setup`")
    return found


Command = tuple[int | None, list[str], dict[str, str]]  # (rank, or None for a launcher; argv; extra env)


def _commands(launcher: str, script: str, nprocs: int, args: Sequence[str], python: str) -> list[Command]:
    """The processes to start for one launch on this machine."""
    if launcher == "torchrun":
        argv = [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={nprocs}", "--tee=3", "--role=rank", script, *args]
        return [(None, argv, {})]
    if launcher == "horovodrun":
        argv = [console_script("horovodrun"), "-np", str(nprocs), "-H", f"localhost:{nprocs}", "--gloo",
                "--gloo-timeout-seconds", "60", python, script, *args]
        return [(None, argv, {})]
    ports = [free_port() for _ in range(nprocs)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    return [(rank, [python, script, *args],
             {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}}),
              "RANK": str(rank), "WORLD_SIZE": str(nprocs)})
            for rank in range(nprocs)]


def worker_script(script: str | os.PathLike[str]) -> str:
    """The absolute path of a worker script; FileNotFoundError if there is none."""
    path = Path(script).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"worker script {path} does not exist")
    return str(path)


def launch(script: str | os.PathLike[str], nprocs: int = 2, *, launcher: str = "torchrun",
           args: Sequence[str] = (), timeout: float = 120.0, idle_timeout: float | None = None,
           env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
           echo: bool = True, devices: str = "auto") -> LaunchResult:
    """Run script on nprocs processes with launcher; stream `[rank N]` output; raise LaunchError.

    timeout: seconds the whole launch may take; idle_timeout: seconds without a line from any rank,
    counted once every rank has called helpers.worker.start(), after which the launch is hung
    (chapter 10: a hang is told apart from a slow start-up on a loaded machine); devices: 'auto'
    (one GPU per rank, else the CPU with the GPUs hidden), 'cpu', or 'gpu' (ranks share the GPUs
    over gloo), see dpc_runtime.worker.placement.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: use one of {LAUNCHERS}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: ask for at least 1 process")
    commands = _commands(launcher, worker_script(script), nprocs, args, sys.executable)
    return run_processes(commands, launcher, nprocs, timeout=timeout, idle_timeout=idle_timeout,
                         env=env, cwd=cwd, echo=echo, devices=devices)


def quiet_env(nprocs: int) -> dict[str, str]:
    """Defaults every launched process gets unless set: its share of the cores (so torchrun has
    no OMP_NUM_THREADS notice to print) and TensorFlow's C++ log at warnings and above."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": str(max(1, cores // max(1, nprocs))), "TF_CPP_MIN_LOG_LEVEL": "2"}


def visible_gpus(environ: Mapping[str, str] | None = None) -> int:
    """How many NVIDIA GPUs this machine's processes can see (nvidia-smi and CUDA_VISIBLE_DEVICES;
    no framework imported): 0 without a driver."""
    environ = os.environ if environ is None else environ
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    mask = environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        count = min(count, len([d for d in mask.split(",") if d.strip() and not d.strip().startswith("-")]))
    return count


_said: set[str] = set()  # the placement lines this process has printed (each once)


def placement_env(nprocs: int, gpus: int, devices: str = "auto") -> tuple[Placement, dict[str, str]]:
    """The placement of nprocs ranks on this machine and the environment that enforces it: ranks
    planned for the CPU see no GPU (CUDA_VISIBLE_DEVICES='', which hides them from torch and
    TensorFlow alike), ranks sharing GPUs are told so (DPC_RANK_DEVICE, read by worker.start)."""
    plan = placement(nprocs, gpus, devices)
    if plan.device_type == "cpu":
        return plan, {"CUDA_VISIBLE_DEVICES": "", RANK_DEVICE: "cpu"}
    return plan, {RANK_DEVICE: "cuda" if plan.backend == "nccl" else "shared"}


Procs = list[tuple[int | None, subprocess.Popen[bytes]]]  # (rank, or None for a launcher; its process)


def _ranks_env(nprocs: int, env: Mapping[str, str] | None, devices: str,
               echo: bool) -> tuple[str, str, dict[str, str]]:
    """(launch id, protocol folder, the ranks' environment); where there are GPUs, says once where ranks run."""
    plan, placed = placement_env(nprocs, visible_gpus({**os.environ, **(env or {})}), devices)
    launch_id = uuid.uuid4().hex
    protocol = tempfile.mkdtemp(prefix="dpc-launch-")  # the workers' protocol lines (helpers.worker)
    # torchrun's copies of the ranks' output (--tee) go there too, removed with it, not to a
    # torchelastic_* folder of its own in /tmp that nothing removes (PET_LOG_DIR is its --log-dir)
    base_env = {**quiet_env(nprocs), "PET_LOG_DIR": str(Path(protocol) / "torchrun"), **os.environ, **placed,
                **(env or {}), MARKER: launch_id, "PYTHONUNBUFFERED": "1", PROTOCOL_DIR: protocol}
    where = f"{nprocs} rank(s): {plan.backend} on {plan.device_type} ({plan.why})"
    if echo and plan.why != "no GPU" and where not in _said:
        _said.add(where)
        print(f"[launch] {where}", flush=True)
    return launch_id, protocol, base_env


def _start_commands(commands: Sequence[Command], base_env: dict[str, str], cwd: str | os.PathLike[str] | None,
                    adopting: _Adopter, procs: Procs) -> None:
    """Start each command in a session of its own, registered as this launch's; append it to procs."""
    for rank, argv, extra in commands:
        with _adopt_lock:  # started and registered before another launch looks for its strays
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env={**base_env, **extra}, cwd=cwd,
                                 start_new_session=True)
            adopting.roots.add(p.pid)
            _roots_in_flight.add(p.pid)
        procs.append((rank, p))


def _after_failure(stream: _Stream, procs: Procs, launch_id: str, result: LaunchResult, *, hang: bool,
                   start: float, timeout: float, idle_timeout: float | None, echo: bool) -> LaunchResult:
    """Stop a launch that failed or hung: result when every rank had said done, else raise its LaunchError."""
    hung = _live_ranks(launch_id) if hang else []
    # Where each live rank is, before anything stops it (stream.ask_for_stacks); then stop what
    # still runs: the pipes close when every process has ended (the bound is for one that
    # ignores SIGTERM: torchrun passes its workers' output on only while it shuts down, slowly on
    # a loaded machine). A rank stopped before it was asked (by torchrun, a peer having failed)
    # dumped its stacks as it stopped.
    stream.ask_for_stacks(launch_id)
    _signal_launch(launch_id, signal.SIGTERM)
    stream.pump(procs, time.monotonic() + 20.0, stop_on_failure=False)
    stream.read_stacks()
    if stream.complete():
        result.notes.append(stream.teardown_note(procs))
        if echo:
            print(f"[launch] note: {result.notes[-1]}", flush=True)
        return result
    result.seconds = time.monotonic() - start
    result.exit_codes, result.stacks = stream.exit_codes(procs), stream.stacks
    error = (stream.hang_error(timeout, hung, idle=idle_timeout if stream.idle else None)
             if hang else stream.failure_error(procs))
    error.result = result
    raise error


def run_processes(commands: Sequence[Command], kind: str, nprocs: int, *, timeout: float,
                  idle_timeout: float | None = None, env: Mapping[str, str] | None = None,
                  cwd: str | os.PathLike[str] | None = None, echo: bool = True,
                  stop_on_failure: bool | None = None, devices: str = "auto") -> LaunchResult:
    """Start the launch's processes, stream their output, judge the outcome; never leave one behind.

    kind ('torchrun', 'horovodrun' or 'tf') says how ranks are named in the output;
    idle_timeout: as in launch(); stop_on_failure: give up as soon as one process fails (default:
    for plain processes only, since torchrun and horovodrun stop their own workers); devices: as in
    launch() (where there are GPUs, the one line that says where the ranks run is printed once).
    """
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(f"idle_timeout={idle_timeout!r}: give a number of seconds above 0, or None")
    launch_id, protocol, base_env = _ranks_env(nprocs, env, devices, echo)
    procs: Procs = []
    stream = _Stream(kind, nprocs, echo, Path(protocol))
    start = time.monotonic()
    adopting = _Adopter()
    try:
        _start_commands(commands, base_env, cwd, adopting, procs)
        if stop_on_failure is None:
            stop_on_failure = kind == "tf"
        failed = stream.pump(procs, start + timeout, stop_on_failure, idle=idle_timeout)
        seconds = time.monotonic() - start
        result = LaunchResult(nprocs, seconds, stream.outputs, stream.launcher_lines, stream.results,
                              commands=[argv for _, argv, _ in commands])
        if failed is False:
            return result
        return _after_failure(stream, procs, launch_id, result, hang=failed is None, start=start,
                              timeout=timeout, idle_timeout=idle_timeout, echo=echo)
    finally:
        kill_launch(launch_id, [p for _, p in procs])
        adopting.stop_strays()
        shutil.rmtree(protocol, ignore_errors=True)


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_adopting = 0  # launches of this process now running, under _adopt_lock
_adopt_lock = threading.Lock()
_roots_in_flight: set[int] = set()  # the processes those launches started themselves


def _set_subreaper(on: bool) -> None:
    """Make this process adopt its descendants' orphans (on) or leave them to init (off); Linux only."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


class _Adopter:
    """For one launch: this process adopts the orphans of its descendants while the launch runs; at
    its end, every child that appeared during the launch and is not a launch's own process is a stray
    of this launch, stopped with its descendants and reaped (it left no marker to find it by)."""

    def __init__(self) -> None:
        global _adopting
        self.roots: set[int] = set()
        self.before = {c.pid for c in psutil.Process().children()}
        with _adopt_lock:
            _adopting += 1
            if _adopting == 1:
                _set_subreaper(True)

    def stop_strays(self) -> None:
        """Stop and reap the strays of this launch; stop adopting when no other launch runs."""
        global _adopting
        with _adopt_lock:
            _adopting -= 1
            if _adopting == 0:
                _set_subreaper(False)
            _roots_in_flight.difference_update(self.roots)
            keep = self.before | self.roots | _roots_in_flight
            strays = []
            for child in psutil.Process().children():
                if child.pid not in keep:
                    try:
                        strays += [child, *child.children(recursive=True)]
                    except psutil.Error:
                        continue
        for proc in strays:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(strays, timeout=3.0)  # reaps the adopted ones: they are our children now


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# Lines a worker prints when a peer it talks to has gone away or never came: it is a victim.
_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|ECONNRESET|timed out|timeout|"
    r"waiting for its peers|Gloo connectFullMesh failed|Read error|Connection refused|"
    r"NCCL.*(Watchdog|timeout)|failed to connect|peer .*(closed|lost)", re.I)
# faulthandler's dump of a stopped worker (helpers.worker.start registers it for SIGTERM).
_DUMP_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$|^Stack \(most recent call first\):$")
_DUMP_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def parse_dump(lines: Sequence[str]) -> list[list[Frame]]:
    """Each thread's frames, innermost first, from the lines of a faulthandler dump."""
    threads: list[list[Frame]] = []
    for line in lines:
        if _DUMP_THREAD.match(line):
            threads.append([])
        elif threads and (frame := _DUMP_FRAME.match(line)):
            threads[-1].append((frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


class _Stream:
    """Reads every pipe in the main thread, prefixes lines by rank, keeps per-rank tails, and
    collects what the worker protocol says: results, who started, who finished, where a stopped
    rank was."""

    def __init__(self, launcher: str, nprocs: int, echo: bool, protocol: Path | None = None) -> None:
        self.launcher, self.nprocs, self.echo = launcher, nprocs, echo
        self.protocol = protocol  # the folder the workers' protocol files are in (None: stdout only)
        self._read: dict[str, int] = {}  # protocol file -> bytes consumed
        self.outputs: dict[int, list[str]] = {r: [] for r in range(nprocs)}
        self.launcher_lines: list[str] = []
        self.tails: dict[int, deque[str]] = {r: deque(maxlen=TAIL) for r in range(nprocs)}
        self.results: dict[int, list[dict[str, Any]]] = {r: [] for r in range(nprocs)}
        self.started: dict[int, dict[str, Any]] = {}
        self.done: dict[int, dict[str, Any]] = {}
        self.stacks: dict[int, list[list[Frame]]] = {}
        self._dumped: set[int] = set()  # ranks whose stacks came from their dump file
        self._in_dump: set[int] = set()
        self.quiet = False
        self.last_heard = time.monotonic()  # when a rank last printed a line (protocol lines too)
        self.idle = False  # pump() gave up because every rank had started and then fell silent

    def line(self, rank: int | None, text: str) -> None:
        if rank is None:
            m = _PREFIX[self.launcher].match(text)
            if m and int(m.group(1)) in self.outputs:
                rank, text = int(m.group(1)), _RANK_TAG.sub("", m.group(2))
        if rank is None:
            self.launcher_lines.append(text)
            return self._launcher_line(text)
        self.last_heard = time.monotonic()
        if self._protocol(rank, text):
            return
        self.outputs[rank].append(text)
        self.tails[rank].append(text)
        if self.echo and not harmless(text):
            print(f"[rank {rank}] {text}", flush=True)

    def _launcher_line(self, text: str) -> None:
        # The launcher's own failure report is summarised by LaunchError: do not echo it.
        self.quiet = self.quiet or text.startswith("Traceback") or " failed (exitcode" in text
        if self.echo and not self.quiet and text.strip(" *") and not harmless(text):
            print(f"[{self.launcher}] {text}", flush=True)

    def _record(self, rank: int, tag: str, payload: dict[str, Any]) -> None:
        if tag == RESULT:
            self.results.setdefault(rank, []).append({k: v for k, v in payload.items() if k != "rank"})
        elif tag == START:
            self.started[rank] = payload
        elif tag == DONE:
            self.done[rank] = payload

    def read_protocol(self) -> None:
        """Take in the complete protocol lines the workers have appended to their files since."""
        if self.protocol is None:
            return
        for path in sorted(self.protocol.glob("*.dpc")):  # not the *.stack files beside them
            name = path.name
            try:
                with open(path, "rb") as f:
                    f.seek(self._read.get(name, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
            if not end:
                continue
            self._read[name] = self._read.get(name, 0) + end
            self.last_heard = time.monotonic()
            for raw in data[:end].splitlines():
                parsed = parse_line(raw.decode(errors="replace"))
                if parsed and isinstance(parsed[1].get("rank"), int):
                    self._record(parsed[1]["rank"], *parsed)

    def ask_for_stacks(self, launch_id: str, bound: float = 10.0) -> None:
        """Have every live rank of the launch that dumps on request (its stack file is there: helpers.
        worker.start) write its stacks (DUMP_SIGNAL, which does not stop it); wait until each dump is
        written (its file has stopped growing; at most `bound` s), then read them (read_stacks)."""
        if self.protocol is None:
            return
        def size(path: Path) -> int:
            return path.stat().st_size if path.exists() else 0

        asked: dict[Path, int] = {}  # the file -> its size before the ask
        for path in self.protocol.glob("*.stack"):
            try:
                proc = psutil.Process(int(path.stem.partition("-")[2]))
                if proc.environ().get(MARKER) == launch_id and proc.status() != psutil.STATUS_ZOMBIE:
                    asked[path] = size(path)
                    proc.send_signal(DUMP_SIGNAL)
            except (ValueError, psutil.Error, OSError):
                continue
        deadline, sizes = time.monotonic() + bound, dict[Path, int]()
        while asked and time.monotonic() < deadline:
            now = {path: size(path) for path in asked}
            if now == sizes and all(now[path] > before for path, before in asked.items()):
                break
            sizes = now
            time.sleep(0.1)
        self.read_stacks()

    def read_stacks(self) -> None:
        """Take each rank's stack dump from the file its faulthandler wrote (helpers.worker.start),
        in place of what came through the launcher's output, where a line can arrive cut. After
        ask_for_stacks, only for the ranks it found no dump of (the others' files then hold a second
        dump, written as they were stopped)."""
        if self.protocol is None:
            return
        newest: dict[int, tuple[float, Path]] = {}
        for path in self.protocol.glob("*.stack"):
            rank_text, _, _ = path.stem.partition("-")
            try:
                rank, stat = int(rank_text), path.stat()
            except (ValueError, OSError):
                continue
            mtime = stat.st_mtime
            if stat.st_size and (rank not in newest or mtime > newest[rank][0]):
                newest[rank] = (mtime, path)  # a restarted rank: its latest process
        for rank, (_, path) in newest.items():
            if rank in self._dumped:
                continue
            threads = parse_dump(path.read_text(errors="replace").splitlines())
            if threads:
                self.stacks[rank] = threads
                self._dumped.add(rank)

    def _protocol(self, rank: int, text: str) -> bool:
        """Record a protocol line or a line of a stack dump; True if the line was one."""
        parsed = parse_line(text)
        if parsed:
            self._record(rank, *parsed)
            return True
        if _DUMP_THREAD.match(text):
            self.stacks.setdefault(rank, []).append([])
            self._in_dump.add(rank)
            return True
        frame = _DUMP_FRAME.match(text) if rank in self._in_dump else None
        if frame:
            self.stacks[rank][-1].append((frame.group(1), int(frame.group(2)), frame.group(3)))
            return True
        if rank in self._in_dump and (not text.strip() or text[:1].isspace()):
            return True  # the dump's other lines ('  Garbage-collecting', '  <no Python frame>')
        self._in_dump.discard(rank)
        return False

    def pump(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]],
             deadline: float, stop_on_failure: bool, idle: float | None = None) -> bool | None:
        """Stream until every process ended (True if one failed) or the deadline (None).

        stop_on_failure: return True as soon as one process fails; idle: return None (and set
        self.idle) once every rank has started and none has printed a line for that many seconds.
        """
        try:
            return self._pump(procs, deadline, stop_on_failure, idle)
        finally:
            self.read_protocol()

    def _pump(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]],
              deadline: float, stop_on_failure: bool, idle: float | None) -> bool | None:
        sel = selectors.DefaultSelector()
        buffers: dict[int, bytes] = {}
        for rank, p in procs:
            if p.stdout is None or p.stdout.closed:
                continue
            os.set_blocking(p.stdout.fileno(), False)
            sel.register(p.stdout, selectors.EVENT_READ, (rank, p))
        open_pipes = len(sel.get_map())
        while open_pipes:
            self.read_protocol()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if idle is not None and len(self.started) == self.nprocs and not self.complete():
                silent = time.monotonic() - self.last_heard
                if silent >= idle:
                    self.idle = True
                    return None
                left = min(left, idle - silent)
            for key, _ in sel.select(timeout=min(left, 0.2)):
                rank, p = key.data
                chunk = os.read(key.fd, 65536)
                buffers[key.fd] = self.feed(rank, buffers.get(key.fd, b"") + chunk, final=not chunk)
                if not chunk:  # EOF
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
            # With plain processes, one crashed worker leaves its peers waiting forever: stop now.
            if stop_on_failure and any(p.poll() not in (None, 0) for _, p in procs):
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

    # --- judging the outcome ----------------------------------------------------------------------

    def complete(self) -> bool:
        """Every rank finished: each said so, or one said so after a barrier all ranks passed."""
        return len(self.done) == self.nprocs or any(d.get("synced") for d in self.done.values())

    def exit_codes(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]]) -> dict[int, int]:
        """Each rank's exit status where known (negative: killed by that signal)."""
        codes = {r: p.returncode for r, p in procs if r is not None and p.returncode is not None}
        text = "\n".join(self.launcher_lines)
        if self.launcher == "torchrun":
            codes.update(_torchrun_codes(text))
        elif self.launcher == "horovodrun":
            for r, code in re.findall(r"Process (\d+) exit with status code (-?\d+)", text):
                codes[int(r)] = int(code)
        return codes

    def teardown_note(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]]) -> str:
        """What went wrong after every rank had finished its work (never the script's fault)."""
        codes = self.exit_codes(procs)
        bad = {r: c for r, c in codes.items() if c}
        how = ", ".join(f"rank {r} {_status(c)}" for r, c in sorted(bad.items())) or \
            "a process did not end by itself"
        return (f"every rank finished its work and reported its results; afterwards, while "
                f"shutting down, {how}. The results are complete: this is not a failure of the script.")

    def _where(self, rank: int) -> tuple[bool, str] | None:
        threads = self.stacks.get(rank)
        return stuck_at(threads) if threads else None

    def _never_started(self, rank: int) -> bool:
        """The rank never said it started, and left no stack: stopped in its own start-up code."""
        return rank not in self.started and rank not in self.stacks

    def _victim(self, rank: int) -> bool:
        where = self._where(rank)
        if where is not None and where[0]:
            return True
        return bool(_PEER_LOST.search("\n".join(self.tails[rank])))

    def hang_error(self, timeout: float, hung: list[int], idle: float | None = None) -> LaunchError:
        """The launch ran out of time: name the ranks busy elsewhere, not the ones waiting for them.

        idle: the launch was stopped because every rank had started and then none printed a line
        for that many seconds (else: the whole launch took timeout seconds).
        """
        hung = [r for r in (hung or range(self.nprocs)) if r not in self.done] or \
            [r for r in range(self.nprocs) if r not in self.done]
        when = (f"hung: no rank printed a line for {idle:.0f} s after all {self.nprocs} had started"
                if idle is not None else f"timed out after {timeout:.0f} s")
        # A rank that never said it started is a start-up problem, whatever the others were doing:
        # those still inside start() (importing torch, busy only on a loaded machine, or waiting for
        # the rest at the rendezvous) are not the culprits of a rank that never reached start().
        # (Seen under load: rank 0, still importing torch inside start() when the timeout came,
        # dumped a 'busy' stack and was blamed for rank 1, which had never called start().)
        unstarted = [r for r in hung if r not in self.started]
        if unstarted:
            absent = [r for r in unstarted if r not in self.stacks]  # never reached start()
            culprits = absent or unstarted
            victims = [r for r in hung if r not in culprits]
            why = (f"{_ranks_text(culprits)} had not started yet (still starting Python and importing, "
                   "or meeting the others at start-up: a loaded machine, or a timeout too short)")
            return self.error(f"{when}; still running: {_ranks_text(hung)}; {why}", culprits, victims)
        busy = [r for r in hung if (w := self._where(r)) is not None and not w[0]]
        if not busy:
            return self.error(f"{when}; still running: {_ranks_text(hung)} (a hang: a collective "
                              "waiting for a peer?)", hung)
        waiting = [r for r in hung if r not in busy]
        what = (f"{when}: {_ranks_text(busy)} never reached the "
                "communication " + (f"{_ranks_text(waiting)} waited for" if waiting else "of the job"))
        return self.error(what, busy, waiting)

    def failure_error(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]]) -> LaunchError:
        """A process failed: name the rank(s) that stopped taking part, not their victims."""
        codes = self.exit_codes(procs)
        # Failed by itself: an error exit or a traceback (SIGTERM is the launcher stopping it).
        failing = {r for r, c in codes.items() if c not in (0, -signal.SIGTERM, 143)}
        failing |= self._tracebacks()
        failing -= set(self.done)
        if not failing:
            failing = set(self.failed_ranks(procs))
        real = sorted(r for r in failing if not self._victim(r))
        if real:
            return self.error(f"{_ranks_text(real)} failed", real)
        # Every failure was a rank waiting for a peer: the peer that left or never came is to blame.
        early = [r for r in range(self.nprocs) if r in self.started and r not in self.done
                 and r not in failing and codes.get(r, 0 if self.launcher == "torchrun" else None) == 0
                 and r not in self.stacks]
        busy = [r for r in range(self.nprocs) if r not in failing and r not in self.done
                and (w := self._where(r)) is not None and not w[0]]
        # A rank stopped before it ever said it started (no stack: its handler was not set up yet)
        # while the others failed waiting, e.g. at start-up: the one that never came.
        unstarted = [r for r in range(self.nprocs)
                     if r not in failing and r not in self.done and self._never_started(r)]
        culprits = sorted(set(early) | set(busy) | set(unstarted))
        if not culprits:
            ranks = self.failed_ranks(procs)
            return self.error(f"{_ranks_text(ranks)} failed", ranks)
        why = [f"rank {r} ended early without finishing (exit code 0, no error)" for r in early]
        why += [f"rank {r} was {self._where(r)[1]}" for r in busy]  # type: ignore[index]
        why += [f"rank {r} never started (it was stopped before helpers.worker.start(): still in its "
                "own start-up code)" for r in unstarted]
        victims = sorted(failing)
        return self.error(f"{_ranks_text(culprits)} stopped taking part: {'; '.join(why)}. "
                          f"{_ranks_text(victims).capitalize()} then failed waiting for it",
                          culprits, victims)

    def failed_ranks(self, procs: list[tuple[int | None, subprocess.Popen[bytes]]]) -> list[int]:
        """Ranks that failed: from exit codes (torchrun: its root cause), or a printed traceback."""
        if self.launcher == "torchrun":  # the first to fail, not the peers it stopped afterwards
            ranks = _torchrun_culprits("\n".join(self.launcher_lines))
        else:
            ranks = {r for r, c in self.exit_codes(procs).items() if c != 0}
        return sorted(ranks or self._tracebacks()) or list(range(self.nprocs))

    def _tracebacks(self) -> set[int]:
        """Ranks that printed a Python traceback."""
        return {r for r, lines in self.outputs.items() if any(ln.startswith("Traceback") for ln in lines)}

    def error(self, what: str, ranks: list[int], victims: Sequence[int] = ()) -> LaunchError:
        tails = {r: list(self.tails[r]) for r in ranks}
        parts = [f"{self.launcher} with {self.nprocs} process(es): {what}."]
        for r in ranks:
            where = self._where(r)
            parts.append(f"--- last lines of rank {r} ---"
                         + (f" (stopped while {where[1]})" if where else ""))
            parts += [f"    {ln}" for ln in tails[r]] or ["    (printed nothing)"]
        for r in victims:
            if self.tails[r]:
                parts.append(f"--- rank {r}, waiting for it, ended with ---")
                parts += [f"    {ln}" for ln in list(self.tails[r])[-3:]]
        if not any(tails.values()) and self.launcher_lines:
            parts.append(f"--- last lines of {self.launcher} ---")
            parts += [f"    {ln}" for ln in self.launcher_lines[-TAIL:]]
        return LaunchError("\n".join(parts), ranks, tails)


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"exited with code {code}"


def _torchrun_codes(report: str) -> dict[int, int]:
    """rank -> exit code of every failure listed in torchrun's report."""
    return {int(r): int(code) for r, code in re.findall(
        r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", report)}


def _torchrun_culprits(report: str) -> set[int]:
    """Ranks that failed by themselves in torchrun's report (not those it stopped afterwards)."""
    failures = list(_torchrun_codes(report).items())
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


def _signal_launch(launch_id: str, sig: signal.Signals) -> None:
    """Send sig to every live process of a launch, without waiting."""
    for proc in _marked(launch_id):
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def kill_launch(launch_id: str, roots: Sequence[subprocess.Popen[Any]] = (),
                grace: float = 3.0) -> None:
    """Terminate, then kill, every process of a launch: its roots, their descendants, marked ones.

    A root that has been reaped (its returncode known) is skipped: its PID is free, and on a busy
    machine soon another process's (PIDs wrap at pid_max), whose tree must not be killed; its
    descendants carry the launch's marker (a sandbox that clears the environment ends its own with
    its PID namespace and cgroup). A root not yet reaped keeps its PID, even dead."""
    procs: dict[int, psutil.Process] = {p.pid: p for p in _marked(launch_id)}
    for root in roots:
        if root.returncode is not None:
            continue
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
