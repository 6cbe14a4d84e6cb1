"""Chapter 7: the small pieces every DDP training script needs: who am I (torchrun or SLURM), start the process
group, reduce a metric across ranks, the learning-rate schedule, rank-0-only actions. A script ends
with helpers.worker.finish() (every rank waits, then the process exits)."""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.distributed as dist

from dpc_runtime.worker import Worker, start

__all__ = ["cosine_warmup", "reduce_value", "setup"]


def setup(backend: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[Worker, torch.device]:
    """Start the process group if launched as one rank of many (helpers.worker.start); return (who, device) (chapter 7)."""
    me = start(backend, environ=environ)
    return me, torch.device(me.device)


def reduce_value(value: torch.Tensor, average: bool = True) -> torch.Tensor:
    """Sum (or average) a tensor over all ranks; returns it unchanged when not distributed (chapter 7)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return value
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size() if average else value


def cosine_warmup(step: int, total: int, warmup: int = 0, final: float = 0.01) -> float:
    """Learning-rate factor: linear warm-up from ~0 to 1 over `warmup` steps, then cosine down to `final` (chapter 7)."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return final + (1 - final) * (1 + math.cos(math.pi * min(t, 1.0))) / 2
