"""helpers.syncbn: statistics, single-process equality with BatchNorm, convert, and real N-rank runs
against BatchNorm on the whole global batch (outputs, gradients, running statistics)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import helpers
from helpers.syncbn import (
    SyncBatchNorm,
    batch_stats,
    check_against_full_batch,
    combine_stats,
    convert_sync_batchnorm,
    sync_batch_norm,
)

pytestmark = pytest.mark.gate  # tests/tiers.py

WORKER = Path(__file__).parent / "workers" / "syncbn_check.py"


def test_batch_stats_and_combine_give_the_global_moments():
    x = torch.randn(10, 3, 2, 2, dtype=torch.float64)
    parts = [batch_stats(x[:3]), batch_stats(x[3:])]
    s, ss, n = (sum(p[i] for p in parts) for i in range(3))
    mean, var, unbiased = combine_stats(s, ss, n)
    assert n.tolist() == [40.0] * 3
    assert torch.allclose(mean, x.mean((0, 2, 3)))
    assert torch.allclose(var, x.var((0, 2, 3), unbiased=False))
    assert torch.allclose(unbiased, x.var((0, 2, 3), unbiased=True))


def test_function_matches_batch_norm_in_one_process():
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.rand(4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y, _, _ = sync_batch_norm(x, w, b)
    ref = nn.functional.batch_norm(x, None, None, w, b, True, 0.0, 1e-5)
    assert torch.allclose(y, ref)
    assert torch.autograd.gradcheck(lambda x, w, b: sync_batch_norm(x, w, b)[0], (x, w, b))


def test_single_process_check_and_eval_mode():
    worst = check_against_full_batch([7], dims=3)
    assert max(worst.values()) < 1e-5, worst
    bn = SyncBatchNorm(3).eval()
    x = torch.randn(4, 3)
    assert torch.equal(bn(x), nn.BatchNorm1d(3).eval()(x))


def test_convert_replaces_every_batchnorm_and_keeps_state():
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Sequential(nn.BatchNorm1d(5)))
    model[1].running_mean.fill_(3.0)
    out = convert_sync_batchnorm(model)
    kinds = [type(m) for m in out.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert kinds == [SyncBatchNorm, SyncBatchNorm]
    assert out[1].running_mean.tolist() == [3.0, 3.0] and out[1].weight is model[1].weight


@pytest.mark.parametrize("sizes", ["4,4", "3,5,2", "1,6"])
def test_n_ranks_equal_full_batch_norm(sizes):
    n = len(sizes.split(","))
    res = helpers.launch(WORKER, n, args=["--sizes", sizes], timeout=120, echo=False)
    for r in range(n):
        assert any(line.endswith("all equal") for line in res.lines(r)), res.lines(r)
        got = res.report(r)  # the worker reports the verdict and every max |difference|
        assert got["equal"] is True, got
        assert set(got) == {"equal", "output", "grad_input", "grad_weight", "grad_bias",
                            "running_mean", "running_var"}, got
        assert all(v < 1e-4 for k, v in got.items() if k != "equal"), got
