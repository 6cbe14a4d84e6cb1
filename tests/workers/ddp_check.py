"""Worker for tests/test_ddp.py: helpers.ddp setup/reduce, Worker.is_main, and DDP wrapping helpers.syncbn on CPU."""
import torch
from torch import nn

from helpers.ddp import reduce_value, setup
from helpers.syncbn import convert_sync_batchnorm
from helpers.worker import finish

info, device = setup()
r = info.rank
mean = reduce_value(torch.tensor([float(r)]))
total = reduce_value(torch.tensor([float(r)]), average=False)
print(f"rank {r} of {info.world_size} via {info.source}: mean {mean.item():g} sum {total.item():g} "
      f"main {info.is_main}")
torch.manual_seed(r)  # different on purpose: DDP must broadcast rank 0's weights
model = convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 1)))
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
x = torch.randn(5 + r, 4)
ddp(x).pow(2).mean().backward()
opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
spread = reduce_value(flat, average=True) - flat
print(f"rank {r} weights equal after a step: {bool(spread.abs().max() < 1e-6)}")
finish()
