"""horovodrun test job (PyTorch): the six Horovod steps on a tiny model; ranks must agree."""
import horovod.torch as hvd
import torch

from helpers.worker import finish, report, start

start(backend=None)
hvd.init()
torch.manual_seed(hvd.rank())  # different on purpose: the broadcast must make them equal
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(100 + hvd.rank())
for _ in range(3):
    x = torch.randn(8, 4, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0))
same = bool(torch.allclose(gathered[0], gathered[-1]))
print(f"rank {hvd.rank()} of {hvd.size()}: weights identical on all ranks: {same}")
report(same_weights=same)
finish(0 if same else 1)
