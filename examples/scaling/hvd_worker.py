"""Horovod (PyTorch) worker of chapter 8 (course/08-scaling-up.ipynb) and of slurm/horovod.sbatch.

Prints where Horovod placed this rank (host, local rank, cross rank = which "node"), trains a
small MLP on the digits for a few steps with the six Horovod steps (numbered as in chapter 6,
course/06-horovod.ipynb), and checks that every rank
ends with the same weights. Run it with `horovodrun -np 4 -H hostA:2,hostB:2 --gloo python ...`.
"""
import hashlib
import os
import socket

import horovod.torch as hvd
import torch
from torch import nn

from helpers import digits
from helpers.worker import finish, report, start

start(backend=None)  # the course's worker protocol; Horovod makes its own process group
hvd.init()                                                   # 1. start Horovod
# GPUs only with a Horovod built with NCCL and one GPU per rank of the node (else the CPU, gloo).
use_cuda = bool(hvd.nccl_built()) and hvd.local_size() <= torch.cuda.device_count()
if use_cuda:
    torch.cuda.set_device(hvd.local_rank())                  # 2. one GPU per process
device = torch.device("cuda" if use_cuda else "cpu")
torch.set_num_threads(1)  # several ranks share the node's cores
print(f"rank {hvd.rank()} of {hvd.size()}: host entry {os.environ.get('HOROVOD_HOSTNAME', '?')} "
      f"(machine {socket.gethostname()}), local_rank {hvd.local_rank()} of {hvd.local_size()}, "
      f"cross_rank {hvd.cross_rank()} of {hvd.cross_size()}")

x_tr, y_tr, _, _ = digits()
x = torch.from_numpy(x_tr).flatten(1)[hvd.rank()::hvd.size()]  # this rank's shard
y = torch.from_numpy(y_tr)[hvd.rank()::hvd.size()]
torch.manual_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)  # 3. lr x size
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # 4. averaged grads
hvd.broadcast_parameters(model.state_dict(), root_rank=0)    # 5. same start everywhere
hvd.broadcast_optimizer_state(opt, root_rank=0)
g = torch.Generator().manual_seed(hvd.rank())
for step in range(20):
    idx = torch.randint(0, len(x), (32,), generator=g)
    loss = nn.functional.cross_entropy(model(x[idx].to(device)), y[idx].to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
mean_loss = hvd.allreduce(loss.detach(), name="loss").item()  # averaged over ranks
flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
gathered = hvd.allgather(flat.unsqueeze(0))
same = bool((gathered == gathered[0]).all())
if hvd.rank() == 0:                                          # 6. only rank 0 logs / saves
    print(f"after 20 steps: loss averaged over ranks {mean_loss:.3f}")
print(f"rank {hvd.rank()}: weights identical on all ranks: {same}")
checksum = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]  # equal iff the weights are
report(same_weights=same, loss=mean_loss, cross_rank=hvd.cross_rank(), checksum=checksum,
       world_size=hvd.size(), node_name=os.environ.get("SLURMD_NODENAME", socket.gethostname()))
finish()  # a Horovod barrier, then the process ends
