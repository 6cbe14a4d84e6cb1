"""Test worker for helpers.link.LinkHook: DDP with its buckets averaged over a dialled 1 Gb/s link.

Trains the same model two steps with plain DDP and with the hook; rank 0 reports the largest
difference of their weights and the hook's ledger of the second step.
"""
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.link import PRESETS, LinkHook
from helpers.worker import finish, report, start

me = start("gloo", timeout=120)
torch.set_num_threads(1)


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.Tanh())], nn.Linear(512, 10))


def train(hook=None):
    net = model()
    ddp = DDP(net, bucket_cap_mb=1)
    if hook is not None:
        hook.watch(net)
        ddp.register_comm_hook(None, hook.hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + me.rank)
    ends = []
    for _ in range(2):
        x, y = torch.randn(256, 512, generator=g), torch.randint(0, 10, (256,), generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        ends.append(time.monotonic())
        opt.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()]), ends


plain, _ = train()
hook = LinkHook(PRESETS["1GbE"])
dialled, ends = train(hook)
hook.close()
second = [e for e in hook.ledger if ends[0] < e["t"] <= ends[1]]  # the first step runs with one bucket (DDP rebuilds them after it)
if me.rank == 0:
    report(max_diff=(plain - dialled).abs().max().item(), ledger=second, backward_end=ends[1])
finish()
