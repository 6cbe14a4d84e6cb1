"""The small pieces every DDP training script needs: who am I (torchrun or SLURM), start and stop the
process group, reduce a metric across ranks, the learning-rate schedule, rank-0-only actions."""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistEnv", "cleanup", "cosine_warmup", "dist_env", "is_main", "reduce_value", "setup",
           "slurm_first_host"]


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: rank, world size, rank on its machine, and who said so."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    source: str = "none"  # 'torchrun', 'slurm' or 'none' (a plain `python train.py`)
    master_addr: str | None = None
    master_port: str | None = None

    @property
    def distributed(self) -> bool:
        """True when a process group must be started (there are other ranks to talk to)."""
        return self.source != "none"


def slurm_first_host(nodelist: str) -> str:
    """First host of a SLURM node list: 'gpu[03-05,9],cpu1' -> 'gpu03' (what scontrol would give)."""
    first = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not first:
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    prefix, ranges = first.group(1), first.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or SLURM_PROCID/NTASKS/LOCALID; else not distributed."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                       "torchrun", env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    if "SLURM_PROCID" in env:
        nodes = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
        return DistEnv(int(env["SLURM_PROCID"]), int(env.get("SLURM_NTASKS", 1)),
                       int(env.get("SLURM_LOCALID", 0)), "slurm",
                       env.get("MASTER_ADDR") or (slurm_first_host(nodes) if nodes else None),
                       env.get("MASTER_PORT", "29500"))
    return DistEnv()


def setup(backend: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[DistEnv, torch.device]:
    """Start the process group if launched as one rank of many; pin one GPU per rank (NCCL) or use CPU (gloo)."""
    env = os.environ if environ is None else environ
    info = dist_env(env)
    # Every rank must choose the same backend: NCCL only if this machine has a GPU per local rank.
    here = int(env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
               or (info.world_size if info.distributed else 1))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= here
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", info.local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before init: NCCL and every .cuda() use this GPU
    if info.distributed and not dist.is_initialized():
        if info.source == "slurm":  # torchrun sets these itself; under srun nobody does
            os.environ.setdefault("MASTER_ADDR", info.master_addr or "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", info.master_port or "29500")
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)
    return info, device


def is_main() -> bool:
    """True on rank 0, or when not distributed: the one process that prints, logs and saves."""
    return not dist.is_initialized() or dist.get_rank() == 0


def reduce_value(value: torch.Tensor, average: bool = True) -> torch.Tensor:
    """Sum (or average) a tensor over all ranks; returns it unchanged when not distributed."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size() if average else value


def cosine_warmup(step: int, total: int, warmup: int = 0, final: float = 0.01) -> float:
    """Learning-rate factor: linear warm-up from ~0 to 1 over `warmup` steps, then cosine down to `final`."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return final + (1 - final) * (1 + math.cos(math.pi * min(t, 1.0))) / 2


def cleanup() -> None:
    """Wait for every rank, then tear the process group down (safe to call when not distributed)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
