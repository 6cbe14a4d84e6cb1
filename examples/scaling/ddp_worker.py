"""PyTorch DDP worker of chapter 8 (course/08-scaling-up.ipynb) and of slurm/torchrun.sbatch, slurm/ddp_srun.sbatch.

Started by torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) or directly by
srun (which sets only SLURM_*); helpers.worker.start() reads either and picks the backend.

  train  (default) a few epochs of an MLP on the digits, sharded by DistributedSampler; checks
         that every rank ends with the same weights.
  bench  times training steps of a wider MLP: computation alone (no_sync), DDP with default
         gradient buckets, DDP with tiny buckets, and all-reduce after backward (no overlap);
         rank 0 reports the medians (LaunchResult.report(0) in the notebook).
"""
import argparse
import hashlib
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.worker import finish, report, start

parser = argparse.ArgumentParser()
parser.add_argument("mode", nargs="?", default="train", choices=["train", "bench"])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch", type=int, default=64, help="examples per rank and step")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for ONE rank (scaled by world size)")
parser.add_argument("--steps", type=int, default=10, help="bench: timed steps per configuration and repeat")
parser.add_argument("--repeats", type=int, default=3, help="bench: interleaved repeats")
parser.add_argument("--width", type=int, default=512, help="bench: hidden width")
parser.add_argument("--depth", type=int, default=8, help="bench: hidden layers")
args = parser.parse_args()

# NCCL when the node has one GPU per rank; with fewer GPUs the ranks run on the CPU over gloo.
me = start()
rank, world, local_rank = me.rank, me.world_size, me.local_rank
device = torch.device(me.device)
use_cuda = device.type == "cuda"
node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0"))  # torchrun / srun
print(f"rank {rank} of {world}: local_rank {local_rank}, node {node}, host {socket.gethostname()}, "
      f"pid {os.getpid()}, master {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}")


def sync() -> None:
    if use_cuda:
        torch.cuda.synchronize(device)


def train() -> None:
    from helpers import digits

    x_tr, y_tr, x_te, y_te = digits()
    inputs = torch.from_numpy(x_tr).flatten(1)
    data = torch.utils.data.TensorDataset(inputs, torch.from_numpy(y_tr))
    sampler: torch.utils.data.DistributedSampler[tuple[torch.Tensor, ...]] = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)
    torch.manual_seed(0)  # DDP also broadcasts rank 0's weights when it wraps the model
    model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)  # linear scaling
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)  # loss sum, batches
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb.to(device)), yb.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean loss over all ranks {total[0].item() / total[1].item():.3f}")
    with torch.no_grad():
        pred = model.module(torch.from_numpy(x_te).flatten(1).to(device)).argmax(1).cpu()
    acc = (pred == torch.from_numpy(y_te)).float().mean().item()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = torch.stack([flat, -flat])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)  # max and -min of every weight over ranks
    same = bool((spread[0] + spread[1]).abs().max().item() == 0.0)
    print(f"rank {rank}: test accuracy {acc:.3f}, weights identical on all ranks: {same}")
    # A checksum of the final weights (equal on every rank iff the weights are bit-identical), the
    # world size and the node: what a batch job's output is checked for (src/dpc_setup/cluster.py).
    checksum = hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()[:16]
    report(accuracy=acc, same_weights=same, checksum=checksum, world_size=world, node=node,
           node_name=os.environ.get("SLURMD_NODENAME", socket.gethostname()))


def make_model() -> nn.Module:
    """The bench's MLP (--width wide, --depth hidden layers) on this rank's device; every call the same weights."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, args.width), nn.ReLU()]
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)


def batches() -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A function returning the next batch (inputs, labels) on the device, from 16 batches held in memory."""
    g = torch.Generator().manual_seed(rank)
    pool = torch.randn(16 * args.batch, 64, generator=g)  # the "dataset", already in memory
    labels = torch.randint(0, 10, (16 * args.batch,), generator=g)
    step_i = [0]

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        i = step_i[0] % 16
        step_i[0] += 1
        return pool[i * args.batch:(i + 1) * args.batch].to(device), labels[i * args.batch:(i + 1) * args.batch].to(device)

    return batch


def all_reduce_after(model: nn.Module) -> None:
    """Average the gradients with ONE fused all-reduce, after the whole backward (no overlap)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]  # every parameter has one after backward
    flat = torch.cat([t.flatten() for t in grads]) / world
    dist.all_reduce(flat)
    offset = 0
    for t in grads:  # copy the averaged gradients back into .grad
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def bench_step(name: str, model: DDP, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor) -> None:
    """One training step of the variant `name` (see the module's docstring), finished on the device."""
    opt.zero_grad()
    if name in ("no overlap", "computation only"):
        with model.no_sync():  # backward without DDP's all-reduces
            nn.functional.cross_entropy(model(xb), yb).backward()
        if name == "no overlap":  # then ONE fused all-reduce, after the whole backward
            all_reduce_after(model)
    else:
        nn.functional.cross_entropy(model(xb), yb).backward()  # all-reduce overlaps backward
    opt.step()
    sync()


def time_variants(models: Mapping[str, DDP], opts: Mapping[str, torch.optim.Optimizer],
                  batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> dict[str, list[float]]:
    """Seconds of every step of every variant, and of fetching its input ("input"), after a warm-up."""
    times: dict[str, list[float]] = {k: [] for k in [*models, "input"]}
    for name in models:  # warm-up
        bench_step(name, models[name], opts[name], *batch())
    for _ in range(args.repeats):  # interleaved: every configuration sees the same machine load
        for name in models:
            dist.barrier()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                xb, yb = batch()
                t1 = time.perf_counter()
                bench_step(name, models[name], opts[name], xb, yb)
                times["input"].append(t1 - t0)
                times[name].append(time.perf_counter() - t0)
    return times


def bench() -> None:
    """Time the four variants of a DDP training step; rank 0 reports the slowest rank's medians."""
    # One thread per rank whatever the rank count (torchrun sets OMP_NUM_THREADS=1 only for 2+
    # ranks per node): otherwise 1 rank would use every core and the comparison would be unfair.
    torch.set_num_threads(1)
    batch = batches()
    grad_mb = sum(p.numel() for p in make_model().parameters()) * 4 / 2**20
    models = {"default buckets (25 MB)": DDP(make_model(), bucket_cap_mb=25),
              "tiny buckets (0.01 MB)": DDP(make_model(), bucket_cap_mb=0.01),
              "no overlap": DDP(make_model()), "computation only": DDP(make_model())}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.001) for k, m in models.items()}
    times = time_variants(models, opts, batch)
    med = torch.tensor([statistics.median(times[k]) for k in times], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    if rank == 0:
        result = dict(zip(times, med.tolist()))
        result.update(world=world, batch_per_rank=args.batch, gradient_mb=round(grad_mb, 2))
        report(**result)


train() if args.mode == "train" else bench()
finish()  # every rank waits for the others, then the process ends
