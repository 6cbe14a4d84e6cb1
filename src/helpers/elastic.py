"""torchrun with restarts (`--max-restarts`) for chapter 10, its whole output kept in a log file.

`helpers.launch` starts torchrun without restarts and summarises a failure in one LaunchError.
Chapter 10 also reads what torchrun itself says (which worker failed with which exit code, its
framed error summary), so `launch_elastic` passes `--max-restarts=N` and copies torchrun's output
to a log file as well (`torchrun ... 2>&1 | tee LOG`, the way a batch job keeps it), through the
same launcher machinery: a timeout, output streamed per rank, every process ended afterwards.

Restarts and gloo: torchrun (torch 2.13) keeps one rendezvous TCP store for all attempts, so a
restarted rank can read the address its dead predecessor published and fail with `Gloo
connectFullMesh failed ... Connection refused`. `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives
every attempt a fresh store; `launch_elastic` sets it unless the caller's env says otherwise.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dpc_runtime.launch import Command, LaunchResult, run_processes, worker_script

__all__ = ["FRESH_STORE", "failures", "launch_elastic", "logged", "torchrun_argv", "torchrun_summary"]

FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # one rendezvous store per attempt


def torchrun_argv(script: str | os.PathLike[str], nprocs: int, *, max_restarts: int = 0,
                  args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """The torchrun command line of one single-node launch with restarts (a free port: --standalone) (chapter 10)."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts}: use 0 or more")
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nprocs}", f"--max-restarts={max_restarts}", "--tee=3", "--role=rank",
            str(script), *map(str, args)]


def logged(argv: Sequence[str], log: str | os.PathLike[str]) -> list[str]:
    """argv run by bash with its output also copied to log; the exit status stays argv's (chapter 6)."""
    return ["bash", "-o", "pipefail", "-c", f"{shlex.join(argv)} 2>&1 | tee {shlex.quote(str(log))}"]


def launch_elastic(script: str | os.PathLike[str], nprocs: int = 2, *, max_restarts: int = 0,
                   args: Sequence[str] = (), timeout: float = 120.0, log: str | os.PathLike[str] | None = None,
                   env: Mapping[str, str] | None = None, echo: bool = True) -> LaunchResult:
    """torchrun --max-restarts=N script on nprocs ranks; torchrun's output also in log; raise LaunchError (chapter 10)."""
    argv = torchrun_argv(worker_script(script), nprocs, max_restarts=max_restarts, args=args)
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        argv = logged(argv, Path(log).resolve())
    command: Command = (None, argv, {})
    return run_processes([command], "torchrun", nprocs, timeout=timeout,
                         env={**FRESH_STORE, **(env or {})}, echo=echo)


def failures(text: str) -> list[tuple[int, int]]:
    """(local rank, exit code) of every worker torchrun saw fail, in order, from its output (chapter 10)."""
    return [(int(rank), int(code)) for code, rank in
            re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)", text)]


def torchrun_summary(text: str) -> str:
    """torchrun's framed failure report (`... FAILED`, `Failures:`, `Root Cause ...`), or '' if none (chapter 10)."""
    lines = text.splitlines()
    frames = [i for i, ln in enumerate(lines) if re.fullmatch(r"=+", ln.strip())]
    if len(frames) < 2:
        return ""
    return "\n".join(lines[frames[-2]:frames[-1] + 1])
