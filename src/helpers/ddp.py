"""The small pieces every DDP training script needs: who am I (torchrun or SLURM), start the process
group, reduce a metric across ranks, the learning-rate schedule, rank-0-only actions. A script ends
with helpers.worker.finish() (every rank waits, then the process exits)."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .worker import place, slurm_first_host, start

__all__ = ["DistEnv", "cosine_warmup", "dist_env", "is_main", "reduce_value", "setup",
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


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or SLURM_PROCID/NTASKS/LOCALID; else not distributed."""
    env = os.environ if environ is None else environ
    me = place(env)
    if me.source == "slurm":
        nodes = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
        return DistEnv(me.rank, me.world_size, me.local_rank, "slurm",
                       env.get("MASTER_ADDR") or (slurm_first_host(nodes) if nodes else None),
                       env.get("MASTER_PORT", "29500"))
    if me.source == "none":
        return DistEnv()
    return DistEnv(me.rank, me.world_size, me.local_rank, me.source, env.get("MASTER_ADDR"),
                   env.get("MASTER_PORT"))


def setup(backend: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[DistEnv, torch.device]:
    """Start the process group if launched as one rank of many (helpers.worker.start); return (where, device)."""
    me = start(backend, environ=environ)
    return dist_env(environ), torch.device(me.device)


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
