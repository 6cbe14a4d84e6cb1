"""The course's worker protocol: how every distributed script starts, reports and ends.

A worker script (started by torchrun, horovodrun, srun, the `tf` launcher or plain python)::

    from helpers.worker import finish, report, start

    me = start()                # who am I; torch process group up (gloo or nccl), device pinned
    ...                         # the work
    report(loss=0.12, same=True)  # one line the notebook reads back: LaunchResult.report(rank)
    finish()                    # every rank waits for the others, then the process ends, code 0

Three kinds of line carry the protocol, each a tag and one JSON object: `DPC-START` (this rank is
up, with its pid), `DPC-RESULT` (what `report` was given) and `DPC-DONE` (the rank finished;
`synced` when every rank had reached the final barrier first). Under `helpers.launch` they go to a
file of the launch's own (`DPC_PROTOCOL_DIR`, one file per process) that the launcher reads: not
through torchrun's `--tee`, which copies a long line in 64 KiB pieces and glues other ranks' lines
into it. Elsewhere (a SLURM job, plain python) they are lines on stdout.

Why `finish` ends the process with `os._exit`: at a normal interpreter exit, C++ destructors run
while gloo's (and Horovod's) background threads may still hold work objects; on a loaded machine
this sometimes aborts a rank that has already finished (`terminate called without an active
exception`, SIGABRT). `os._exit` ends the process after the results are flushed, without running
that teardown: nothing is left to go wrong once a rank has said it is done.
"""
from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import io
import json
import linecache
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, NoReturn

START, RESULT, DONE = "DPC-START", "DPC-RESULT", "DPC-DONE"
TAGS = (START, RESULT, DONE)
PROTOCOL_DIR = "DPC_PROTOCOL_DIR"  # set by helpers.launch: its folder for protocol records and stack dumps
# helpers.launch asks a rank for its stacks with this signal before it stops the rank (SIGTERM): a
# dump that a second SIGTERM interrupts is cut, or empty (faulthandler chains to the default action)
DUMP_SIGNAL = signal.SIGUSR1
# Set by helpers.launch: 'cpu' (GPUs hidden), 'cuda' (one GPU per rank), 'shared' (gloo ranks share GPUs).
RANK_DEVICE = "DPC_RANK_DEVICE"
DEVICES = ("auto", "cpu", "gpu")  # where a launch's ranks may run (placement())
# The oldest torch the course runs on: FSDP2's public `torch.distributed.fsdp.fully_shard` (chapter 9).
TORCH_MIN = (2, 6)
# torch 2.13's names for the two tensor collectives of ZeRO and FSDP, and the names every torch since
# 1.13 has (2.13 deprecates those): start() gives an older torch the new names (chapter 9).
NEW_NAMES = {"reduce_scatter_single": "reduce_scatter_tensor", "all_gather_single": "all_gather_into_tensor"}

__all__ = ["DEVICES", "DONE", "NEW_NAMES", "PROTOCOL_DIR", "RANK_DEVICE", "RESULT", "START", "TAGS",
           "TORCH_MIN", "Frame", "Placement", "Worker", "backend_for", "check_torch", "collective_names",
           "finish", "parse_line", "place", "placement", "report", "slurm_first_host", "slurm_place",
           "slurm_tasks_per_node", "start", "stuck_at", "where_now"]

Frame = tuple[str, int, str]  # (file, line, function) of a Python stack frame

# A rank whose innermost frame is in one of these, or on a line that calls one of these, is
# waiting for its peers (a victim if they never come); anywhere else it is busy with its own work.
_COMM_FILES = re.compile(r"[/\\](torch[/\\]distributed|horovod|gloo|nccl)[/\\]")
_COMM_CALL = re.compile(r"\b(wait|recv|irecv|send|isend|barrier|monitored_barrier|all_reduce|allreduce|"
                        r"allreduce_|broadcast|all_gather|allgather|all_gather_object|reduce_scatter|"
                        r"reduce|gather|scatter|all_to_all|alltoall|broadcast_parameters|"
                        r"broadcast_object)\s*\(")
# Frames of threads that are only idling (a watcher thread, a queue): not where the work is.
_IDLE_FILES = re.compile(r"[/\\](threading|queue|selectors|subprocess|socketserver)\.py$")


@dataclass(frozen=True)
class Worker:
    """Where this process sits (rank, world, rank on its machine), who said so, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    source: str = "none"  # 'torchrun', 'horovod', 'tf', 'slurm' or 'none' (plain `python x.py`)
    backend: str | None = None  # the torch process group's backend: 'gloo', 'nccl' or None
    device: str = "cpu"  # 'cpu' or 'cuda:<local_rank>'
    master_addr: str | None = None  # where rank 0 listens (torchrun's MASTER_ADDR; SLURM: first host)
    master_port: str | None = None

    @property
    def distributed(self) -> bool:
        """True when launched as one rank of a job (even a job of one rank)."""
        return self.source != "none"

    @property
    def is_main(self) -> bool:
        """True on rank 0: the one process that prints, logs and saves."""
        return self.rank == 0


def slurm_first_host(nodelist: str) -> str:
    """First host of a SLURM node list: 'gpu[03-05,9],cpu1' -> 'gpu03' (what scontrol would give)."""
    import re

    first = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not first:
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    prefix, ranges = first.group(1), first.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    value = env.get(key, "")
    value = value.split("(")[0]  # SLURM writes repeated counts as '4(x2)'
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={env[key]!r} is not a whole number") from None


def place(environ: Mapping[str, str] | None = None) -> Worker:
    """Rank, world size and local rank from torchrun, horovodrun, TF_CONFIG or srun (in that order)."""
    env = os.environ if environ is None else environ
    if "TF_CONFIG" in env and "TORCHELASTIC_RUN_ID" not in env:
        cfg = json.loads(env["TF_CONFIG"])
        world = sum(len(v) for v in cfg.get("cluster", {}).values())
        rank = int(cfg.get("task", {}).get("index", 0))
        return Worker(rank, world, _int(env, "LOCAL_RANK", rank), _int(env, "LOCAL_WORLD_SIZE", world), "tf")
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE", 1)
        return Worker(_int(env, "RANK", 0), world, _int(env, "LOCAL_RANK", 0),
                      _int(env, "LOCAL_WORLD_SIZE", world), "torchrun",
                      master_addr=env.get("MASTER_ADDR"), master_port=env.get("MASTER_PORT"))
    if "HOROVOD_RANK" in env:
        world = _int(env, "HOROVOD_SIZE", 1)
        return Worker(_int(env, "HOROVOD_RANK", 0), world, _int(env, "HOROVOD_LOCAL_RANK", 0),
                      _int(env, "HOROVOD_LOCAL_SIZE", world), "horovod")
    if "SLURM_PROCID" in env:
        return slurm_place(env)
    return Worker()


def slurm_tasks_per_node(counts: str) -> list[int]:
    """SLURM's compressed task counts, one per node: '2(x3),1' -> [2, 2, 2, 1]."""
    out: list[int] = []
    for item in counts.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ValueError(f"cannot read SLURM task counts {counts!r} (expected e.g. '2(x3),1')")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_place(environ: Mapping[str, str]) -> Worker:
    """The one SLURM -> rank mapping (srun's task variables), used by place() and torch_env_from_slurm.

    SLURM_PROCID -> rank, SLURM_NTASKS -> world size, SLURM_LOCALID -> local rank, and the local
    world size is this node's entry (SLURM_NODEID) of the step's task counts: srun -N2 -n4 puts
    3 tasks on node1 and 1 on node2 and sets SLURM_STEP_TASKS_PER_NODE=3,1 (no
    SLURM_NTASKS_PER_NODE, which only --ntasks-per-node sets).
    """
    world = _int(environ, "SLURM_NTASKS", 1)
    rank = _int(environ, "SLURM_PROCID", 0)
    if not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank} is not in 0..{world - 1}")
    node = _int(environ, "SLURM_NODEID", 0)
    counts = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    per_node = slurm_tasks_per_node(counts) if counts else []
    if node < len(per_node):
        local_world = per_node[node]
    else:  # no layout given (a hand-made environment): --ntasks-per-node, else tasks spread evenly
        local_world = _int(environ, "SLURM_NTASKS_PER_NODE", -(-world // _int(environ, "SLURM_NNODES", 1)))
    nodes = environ.get("SLURM_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    return Worker(rank, world, _int(environ, "SLURM_LOCALID", 0), local_world, "slurm",
                  master_addr=environ.get("MASTER_ADDR") or (slurm_first_host(nodes) if nodes else None),
                  master_port=environ.get("MASTER_PORT", "29500"))


def backend_for(local_world_size: int, gpus: int) -> str:
    """'nccl' when this machine has a GPU for each of its ranks, else 'gloo' (ranks on the CPU)."""
    return "nccl" if gpus >= max(1, local_world_size) else "gloo"


@dataclass(frozen=True)
class Placement:
    """Where a launch's ranks run: backend, device type ('cpu' or 'cuda') and why, in words (chapter 0)."""

    backend: str
    device_type: str
    why: str


def placement(nprocs: int, gpus: int, devices: str = "auto") -> Placement:
    """The course's one rule for nprocs ranks on a machine with gpus GPUs (chapter 0's tiers).

    One GPU per rank: NCCL. No GPU: gloo on the CPU. Fewer GPUs than ranks: gloo on the CPU with the
    GPUs hidden from the ranks (devices='auto': library code that uses CUDA whenever it is
    available cannot reach it), or gloo on the shared GPU(s) (devices='gpu': NCCL refuses two ranks
    on one GPU; gloo moves CUDA tensors for collectives, not for point-to-point send/recv).
    """
    if devices not in DEVICES:
        raise ValueError(f"devices={devices!r}: use one of {DEVICES}")
    if devices == "cpu":
        return Placement("gloo", "cpu", "devices='cpu': the GPUs are hidden from the ranks" if gpus
                         else "no GPU")
    if gpus >= max(1, nprocs):
        return Placement("nccl", "cuda", "one GPU per rank")
    if devices == "gpu":
        if not gpus:
            raise ValueError(f"devices='gpu' but this machine has no GPU: use devices='auto' to run "
                             f"the {nprocs} ranks on the CPU")
        return Placement("gloo", "cuda", f"{nprocs} ranks share {gpus} GPU(s) over gloo: NCCL refuses "
                         "two ranks on one GPU; point-to-point send/recv stays on CPU tensors")
    if not gpus:
        return Placement("gloo", "cpu", "no GPU")
    return Placement("gloo", "cpu", f"{gpus} GPU(s) for {nprocs} ranks: NCCL needs one GPU per rank, so "
                     "the GPU is hidden from the ranks (devices='gpu' shares it over gloo)")


def check_torch(version: str) -> None:
    """Raise one clear line if this torch is older than the course's TORCH_MIN (chapter 9)."""
    found = tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:2])
    if found < TORCH_MIN:
        need = ".".join(map(str, TORCH_MIN))
        raise RuntimeError(f"torch {version} is older than the course needs ({need}: FSDP2's "
                           f"fully_shard, chapter 9): pip install 'torch>={need}'")


def collective_names(dist: Any) -> None:
    """Give an older torch.distributed torch 2.13's names of reduce-scatter and all-gather (chapter 9)."""
    for new, old in NEW_NAMES.items():
        if not hasattr(dist, new):
            setattr(dist, new, getattr(dist, old))


_me: Worker | None = None
_stack_file: IO[str] | None = None  # where faulthandler writes this rank's stacks (kept open)


def _prepare_for_the_launcher(rank: int, env: Mapping[str, str]) -> None:
    """Make this rank's output whole lines, and have it dump its stacks when the launcher stops it."""
    # Whole lines only: unbuffered (PYTHONUNBUFFERED), print() writes a line's text and its
    # newline separately, and torchrun's --tee, reading in between, splits the line (chapter 7
    # once showed "lr 0.0152[rank0]:").
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)
    # If the launcher stops this rank (a peer failed, a timeout), print where it was: the
    # launcher tells a rank busy elsewhere (the culprit) from one waiting for a peer (a victim).
    # Under helpers.launch the dump goes to a file of the launch's own: faulthandler writes a
    # line in many small writes, and torchrun's --tee, reading in between, cut and glued them.
    global _stack_file
    folder = env.get(PROTOCOL_DIR)
    if folder and os.path.isdir(folder) and _stack_file is None:
        _stack_file = open(os.path.join(folder, f"{rank}-{os.getpid()}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGTERM, file=_stack_file or sys.stderr, all_threads=True, chain=True)
    if _stack_file is not None:  # the file's name tells the launcher that this process dumps on request
        faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)


def start(backend: str | None = "auto", *, timeout: float = 300.0,
          environ: Mapping[str, str] | None = None) -> Worker:
    """Find this rank, start torch's process group (backend None: none) and pin the rank's device."""
    global _me
    env = os.environ if environ is None else environ
    me = place(env)
    if backend is not None and me.source in ("horovod", "tf"):
        raise ValueError(f"launched by {'horovodrun' if me.source == 'horovod' else 'TF_CONFIG'}: that "
                         "framework makes its own communication; call start(backend=None)")
    launched = me.distributed or "DPC_LAUNCH_ID" in env
    if launched:  # whole lines on stdout, and where it was when stopped (helpers.launch reads both)
        _prepare_for_the_launcher(me.rank, env)
    if backend is not None:
        import torch
        import torch.distributed as dist

        check_torch(torch.__version__)
        collective_names(dist)
        if launched and backend == "gloo" and env.get(RANK_DEVICE) != "shared" and not torch.cuda.is_initialized():
            # A CPU rank asked for by name (its tensors live on the CPU): library code that uses CUDA
            # whenever it is available (torch's PowerSGD hook) must not reach a GPU (issue 34).
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        chosen = backend_for(me.local_world_size, gpus) if backend == "auto" else backend
        if chosen not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r}: use 'auto', 'gloo', 'nccl' or None")
        device = "cpu"
        if chosen == "nccl":
            device = f"cuda:{me.local_rank}"
        elif gpus and env.get(RANK_DEVICE) == "shared":  # helpers.launch(devices='gpu'): ranks share GPUs
            device = f"cuda:{me.local_rank % gpus}"
        if device != "cpu":
            torch.cuda.set_device(device)  # before init: NCCL and .cuda() use this GPU
        if me.distributed and not dist.is_initialized():
            if me.source == "slurm":  # torchrun sets these itself; under srun the batch script does
                os.environ.setdefault("MASTER_ADDR", me.master_addr or "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", me.master_port or "29500")
            dist.init_process_group(chosen, rank=me.rank, world_size=me.world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
        me = dataclasses.replace(me, backend=chosen if me.distributed else None, device=device)
    _me = me
    if launched:
        _emit(START, {"rank": me.rank, "pid": os.getpid(), "world_size": me.world_size})
    return me


def _rank() -> int:
    return (_me or place()).rank


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        return value.tolist()
    raise TypeError(f"report() got a {type(value).__name__}: pass numbers, strings, bools, "
                    "lists or dicts (tensors and arrays are converted with .tolist())")


def _emit(tag: str, payload: Mapping[str, Any]) -> None:
    data = f"{tag} {json.dumps(payload, default=_jsonable, separators=(',', ':'))}\n".encode()
    sys.stdout.flush()
    sys.stderr.flush()
    folder = os.environ.get(PROTOCOL_DIR)
    if folder and os.path.isdir(folder):
        fd = os.open(os.path.join(folder, f"{os.getpid()}.dpc"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:  # a regular file takes it all at once; loop for the rare short write
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    else:
        os.write(1, data)  # one write: never interleaved with other output


def report(**values: Any) -> None:
    """Send key=value results to the notebook (read with LaunchResult.report(rank))."""
    _emit(RESULT, {"rank": _rank(), **values})


def parse_line(text: str) -> tuple[str, dict[str, Any]] | None:
    """(tag, payload) of a protocol line, or None for any other line."""
    tag, _, rest = text.partition(" ")
    if tag not in TAGS:
        return None
    try:
        payload = json.loads(rest)
    except ValueError:
        return None
    return (tag, payload) if isinstance(payload, dict) else None


def _horovod_barrier() -> bool:
    """A barrier over Horovod's ranks if a Horovod framework is initialised here; False if none is."""
    if "horovod.torch" in sys.modules:
        hvd = sys.modules["horovod.torch"]
        if hvd.is_initialized():
            import torch
            hvd.allreduce(torch.zeros(1), name="dpc.finish")
            return True
    for name in ("horovod.tensorflow.keras", "horovod.tensorflow"):
        if name in sys.modules:
            hvd = sys.modules[name]
            if hvd.is_initialized():
                import tensorflow as tf
                hvd.allreduce(tf.zeros(1), name="dpc.finish")
                return True
    return False


def stuck_at(threads: list[list[Frame]]) -> tuple[bool, str]:
    """(waiting for peers?, where) from each thread's frames, innermost first: busy if any thread is."""
    waiting: list[str] = []
    for frames in threads:
        if not frames or _IDLE_FILES.search(frames[0][0]):
            continue
        file, line, func = frames[0]
        code = linecache.getline(file, line).strip()
        if _COMM_FILES.search(file) or _COMM_CALL.search(code):
            waiting.append(f"waiting for its peers in {func}() ({os.path.basename(file)}:{line})")
            continue
        at = f"busy in {os.path.basename(file)}:{line} ({func})"
        return False, f"{at}: {code}" if code else at
    return True, waiting[0] if waiting else "idle"


def where_now() -> tuple[bool, str]:
    """stuck_at() for this process's threads, from inside it (e.g. a watchdog thread)."""
    import threading
    import traceback

    me = threading.get_ident()
    threads = [[(f.filename, f.lineno or 0, f.name) for f in reversed(traceback.extract_stack(frame))]
               for ident, frame in sys._current_frames().items() if ident != me]
    return stuck_at(threads)


def finish(code: int = 0, *, barrier: Callable[[], object] | bool = True) -> NoReturn:
    """Wait for every rank (barrier), flush, and end this process with code (never in a notebook)."""
    synced = False
    if barrier:
        if callable(barrier):
            barrier()
            synced = True
        else:
            dist = sys.modules.get("torch.distributed")
            if dist is not None and dist.is_initialized():
                dist.barrier()  # no destroy_process_group: os._exit below ends the group too
                synced = True
            else:
                synced = _horovod_barrier()
    me = _me or place()
    _emit(DONE, {"rank": me.rank, "synced": synced and me.world_size > 1, "code": code})
    os._exit(code)
