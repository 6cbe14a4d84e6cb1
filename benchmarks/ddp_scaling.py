"""DDP scaling on CPU: 1 rank vs 2 single-threaded ranks (gloo), side by side.

Each rank trains a small CNN on synthetic 32x32 images with one CPU thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)) and the same per-rank batch, so 2 ranks process twice the samples per
step; the model is chosen so that computing dominates the gradient all-reduce (~70k parameters,
~50 MFLOP per sample). Runs of 1 and 2 ranks alternate, REPEAT times each, each launched with
torchrun; the script prints median samples/s and the ratio. Goal on a 2-core CPU box: >= 1.7x.
Absolute numbers are only reported; start-up time is excluded (each rank times its own steps).
A third variant, 2 ranks that train independently (no DDP, no all-reduce), measures what the
machine can give two processes at all: on a box shared with other work it is the real ceiling,
and DDP's ratio should be read against it.

    python benchmarks/ddp_scaling.py [--repeat 5] [--steps 12] [--batch 64] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(steps: int, batch: int, warmup: int, local: bool = False) -> None:
    """One rank: time `steps` DDP training steps after `warmup`; rank 0 reports samples/s."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from helpers.worker import finish, report, start

    torch.set_num_threads(1)
    me = start("gloo")
    rank, world = me.rank, me.world_size
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16, 10))
    ddp = model if local else nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = torch.tensor([time.perf_counter() - began], device="cpu")  # a CPU benchmark
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    if rank == 0:
        report(samples_per_s=world * batch * steps / seconds.item())
    finish()


def run(nprocs: int, steps: int, batch: int, warmup: int, local: bool = False) -> float:
    """Launch nprocs ranks with torchrun; return the samples/s rank 0 measured."""
    from helpers import launch

    res = launch(__file__, nprocs, args=["--worker", "--steps", str(steps), "--batch", str(batch),
                                         "--warmup", str(warmup), *(["--independent"] if local else [])],
                 timeout=600, echo=False, env={"OMP_NUM_THREADS": "1"})
    return float(res.report(0)["samples_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=64, help="per-rank batch")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="3 repeats of 6 steps (a smoke run)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--independent", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.steps, a.batch, a.warmup, a.independent)
        return
    if a.quick:
        a.repeat, a.steps = 3, 6
    from helpers.timing import format_table

    variants = {"1 rank": (1, False), "2 ranks DDP": (2, False), "2 independent (ceiling)": (2, True)}
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(a.repeat):  # interleaved, so that background load hits all alike
        for name, (n, local) in variants.items():
            samples[name].append(run(n, a.steps, a.batch, a.warmup, local))
            print(f"repeat {i + 1}/{a.repeat}: {name:24s} {samples[name][-1]:.1f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["1 rank"]
    ratio, ceiling = med["2 ranks DDP"] / base, med["2 independent (ceiling)"] / base
    print()
    print(format_table(["variant", "median samples/s", "min", "max", "vs 1 rank"],
                       [[k, med[k], min(v), max(v), med[k] / base] for k, v in samples.items()]))
    print(f"\nDDP 2 ranks vs 1 rank (1 thread each, gloo, per-rank batch {a.batch}): "
          f"{ratio:.2f}x (goal >= 1.7x on 2 idle cores); two independent processes reach "
          f"{ceiling:.2f}x here, so DDP gets {ratio / ceiling:.0%} of what this machine allows")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "benchmark": "ddp_scaling", "per_rank_batch": a.batch, "steps": a.steps, "repeat": a.repeat,
            "samples_per_s": samples, "median_samples_per_s": med,
            "speedup_2_vs_1": ratio, "ceiling_2_independent": ceiling, "goal": 1.7,
            "cores": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
