"""Synchronised batch norm that also runs on CPU (gloo; chapter 7): one global mean and variance for all ranks.

torch.nn.SyncBatchNorm only accepts CUDA tensors ("SyncBatchNorm expected input tensor to be on
GPU"), so on a laptop the course uses this one. Forward: each rank sums x, x**2 and counts per
channel, one all-reduce adds them up, every rank normalises with the global mean and (biased)
variance. Backward: one all-reduce of sum(dy) and sum(dy * x_hat) per channel; the weight and bias
gradients stay local (DDP averages them like every other parameter gradient).
"""
from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["SyncBatchNorm", "batch_stats", "combine_stats", "convert_sync_batchnorm",
           "sync_batch_norm"]


def _world(group: dist.ProcessGroup | None) -> int:
    """World size of group, or 1 when torch.distributed is not initialised."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel sum, sum of squares and count of x (N, C, ...) — what ranks add up (chapter 7)."""
    dims = [0, *range(2, x.dim())]
    count = torch.full((x.shape[1],), x.numel() / x.shape[1], dtype=x.dtype, device=x.device)
    return x.sum(dims), (x * x).sum(dims), count


def combine_stats(sums: torch.Tensor, sumsqs: torch.Tensor,
                  counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global (mean, biased variance, unbiased variance) per channel from summed sums/sumsqs/counts (chapter 7)."""
    mean = sums / counts
    var = (sumsqs / counts - mean * mean).clamp_min(0.0)
    return mean, var, var * counts / (counts - 1).clamp_min(1)


class SyncBNFunction(torch.autograd.Function):
    """y = (x - mean) / sqrt(var + eps) * weight + bias with mean/var over every rank's batch (chapter 7)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, group):
        s, ss, n = batch_stats(x)
        packed = torch.cat([s, ss, n])
        if _world(group) > 1:
            dist.all_reduce(packed, group=group)  # one collective for all three
        s, ss, n = packed.chunk(3)
        mean, var, unbiased = combine_stats(s, ss, n)
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var + eps)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, invstd, weight, n)
        ctx.group = group
        y = xhat * weight.view(shape) + bias.view(shape) if weight is not None else xhat
        ctx.mark_non_differentiable(mean, unbiased)
        return y, mean, unbiased

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        xhat, invstd, weight, n = ctx.saved_tensors
        dims = [0, *range(2, dy.dim())]
        shape = [1, -1] + [1] * (dy.dim() - 2)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_w = sum_dy_xhat if weight is not None else None  # local: DDP averages it
        grad_b = sum_dy if weight is not None else None
        packed = torch.cat([sum_dy, sum_dy_xhat])
        if _world(ctx.group) > 1:
            dist.all_reduce(packed, group=ctx.group)
        g_dy, g_dy_xhat = packed.chunk(2)
        scale = invstd * (weight if weight is not None else 1.0)
        dx = (dy - (g_dy / n).view(shape) - xhat * (g_dy_xhat / n).view(shape)) * scale.view(shape)
        return dx, grad_w, grad_b, None, None


def sync_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float = 1e-5, group: dist.ProcessGroup | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch-norm x over all ranks of group; returns (y, global mean, global unbiased variance) (chapter 7)."""
    return SyncBNFunction.apply(x, weight, bias, eps, group)


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Drop-in for nn.BatchNorm1d/2d/3d whose training statistics span every rank (CPU or GPU) (chapter 7)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise with global batch statistics in training, running statistics in eval."""
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        y, mean, unbiased = sync_batch_norm(x, self.weight, self.bias, self.eps, self.process_group)
        if self.training and self.track_running_stats:
            assert (self.running_mean is not None and self.running_var is not None
                    and self.num_batches_tracked is not None), "track_running_stats keeps all three"
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        return y


def convert_sync_batchnorm(module: nn.Module, process_group: dist.ProcessGroup | None = None,
                           *, use_torch: bool | None = None) -> nn.Module:
    """Replace every BatchNorm layer of module by a synchronised one (torch's on CUDA, ours on CPU) (chapter 7).

    use_torch=None decides from where the module's parameters live.
    """
    if use_torch is None:
        p = next(module.parameters(), None)
        use_torch = p is not None and p.is_cuda
    if use_torch:
        return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
    return _convert(module, process_group)


def _convert(module: nn.Module, group: dist.ProcessGroup | None) -> nn.Module:
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, group)
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        if module.track_running_stats:
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, _convert(child, group))
    return out


def check_against_full_batch(sizes: list[int], *, seed: int = 0, steps: int = 2,
                             dims: int = 4) -> dict[str, float]:
    """On every rank of a running process group: synchronised BN vs plain BN on the global batch (chapter 7).

    Rank r holds sizes[r] samples of one global batch. Returns the max |difference| of outputs,
    input gradients, weight/bias gradients (summed over ranks) and running mean/var after `steps`
    training steps. Uses torch's SyncBatchNorm on CUDA, this module's elsewhere.
    """
    world, rank = _world(None), (dist.get_rank() if _world(None) > 1 else 0)
    if len(sizes) != world:
        raise ValueError(f"{len(sizes)} per-rank sizes for {world} ranks")
    cuda = torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    channels, spatial = 3, [4] * (dims - 2)
    gen = torch.Generator().manual_seed(seed)
    ref = _reference_bn(dims, channels, gen).to(device)
    sync = convert_sync_batchnorm(nn.Sequential(_copy_bn(ref)), use_torch=cuda).to(device)
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    worst: dict[str, float] = {}
    for _ in range(steps):
        x = (torch.randn(sum(sizes), channels, *spatial, generator=gen) * 3 + 1).to(device)
        g = torch.randn(x.shape, generator=gen).to(device)  # loss = sum(y * g): any dy works
        for name, diff in _step_differences(ref, sync, x, g, slice(lo, hi), world).items():
            worst[name] = max(worst.get(name, 0.0), diff)
    return worst


def _reference_bn(dims: int, channels: int, gen: torch.Generator) -> nn.modules.batchnorm._BatchNorm:
    """Plain BN for inputs of `dims` dimensions, with random weight and bias drawn from gen (chapter 7)."""
    bn_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[dims]
    ref = bn_cls(channels)
    with torch.no_grad():
        ref.weight.copy_(torch.rand(channels, generator=gen) + 0.5)
        ref.bias.copy_(torch.randn(channels, generator=gen))
    return ref


def _step_differences(ref: nn.Module, sync: nn.Module, x: torch.Tensor, g: torch.Tensor, mine: slice,
                      world: int) -> dict[str, float]:
    """One training step of ref on batch x and of sync on this rank's slice: max |difference| of each (chapter 7)."""
    xf = x.clone().requires_grad_(True)
    ref.zero_grad()
    yf = ref(xf)
    (yf * g).sum().backward()
    xr = x[mine].clone().requires_grad_(True)
    sync.zero_grad()
    yr = sync(xr)
    (yr * g[mine]).sum().backward()
    bn = cast(nn.modules.batchnorm._BatchNorm, cast(nn.Sequential, sync)[0])
    ref_bn = cast(nn.modules.batchnorm._BatchNorm, ref)
    assert bn.weight.grad is not None and bn.bias.grad is not None, "a training step gives both"
    gw, gb = bn.weight.grad.clone(), bn.bias.grad.clone()
    if world > 1:  # each rank holds its share of the parameter gradients: add them up
        dist.all_reduce(gw)
        dist.all_reduce(gb)
    pairs = {"output": (yr, yf[mine]), "grad_input": (xr.grad, None if xf.grad is None else xf.grad[mine]),
             "grad_weight": (gw, ref_bn.weight.grad), "grad_bias": (gb, ref_bn.bias.grad),
             "running_mean": (bn.running_mean, ref_bn.running_mean),
             "running_var": (bn.running_var, ref_bn.running_var)}
    return {name: _max_difference(name, a, b) for name, (a, b) in pairs.items()}


def _max_difference(name: str, a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a - b| of two tensors that must both be there (chapter 7)."""
    assert a is not None and b is not None, f"{name}: nothing to compare"
    return (a - b).abs().max().item()


def _copy_bn(bn: nn.modules.batchnorm._BatchNorm) -> nn.modules.batchnorm._BatchNorm:
    twin = type(bn)(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    twin.load_state_dict(bn.state_dict())
    return twin
