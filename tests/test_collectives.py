"""The rule over every worker's collectives (src/dpc_maintainer/collectives.py, issue 34): a tensor
handed to torch.distributed is made on a device. On a CPU a device-less tensor works; on a GPU rank
with NCCL it fails, as chapter 8's bench did on the first real GPU."""
from __future__ import annotations

import pytest

from dpc_maintainer import collectives

pytestmark = pytest.mark.gate  # tests/tiers.py

# chapter 8's ddp_worker.py bench as it was (project 673d1f3): the medians made on the CPU
BENCH_673D1F3 = '''
import statistics
import torch
import torch.distributed as dist

def bench(times, rank):
    med = torch.tensor([statistics.median(times[k]) for k in times], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
'''


def test_every_worker_of_the_course_gives_its_collectives_a_device():
    found = collectives.check()
    assert not found, "\n".join(f.text() for f in found)


def test_the_rule_covers_the_notebooks_workers():
    where = {w for w, _ in collectives.workers()}
    assert "examples/scaling/ddp_worker.py" in where
    assert "course/09-sharding.ipynb[runs/09/shard_zero3.py]" in where
    assert "solutions/11-own-ddp/own-ddp.ipynb[runs/11/own_ddp.py]" in where


def test_the_rule_finds_chapter_8s_bench_as_it_was():
    (found,) = collectives.check_source(BENCH_673D1F3, "ddp_worker.py")
    assert (found.line, found.call, found.tensor) == (8, "all_reduce", "med")
    assert "made without device= (CPU)" in found.text()


@pytest.mark.parametrize("code, bad", [
    ("dist.broadcast(torch.zeros(8), src=0)", True),
    ("x = torch.from_numpy(a)\ndist.all_reduce(x)", True),
    ("x = torch.ones(4, device=me.device)\ndist.all_reduce(x)", False),
    ("x = torch.ones(4).to(dev)\ndist.all_reduce(x)", False),
    ("x = torch.ones(4, device='cpu')  # on purpose\ndist.isend(x, 1)", False),
    ("x = torch.ones(4)\nx = x.cuda()\ndist.all_reduce(x)", False),  # the last assignment counts
    ("x = torch.zeros_like(y)\ndist.all_reduce(x)", False),  # *_like keeps y's device
])
def test_the_rule_on_small_cases(code, bad):
    assert bool(collectives.check_source("import torch\nimport torch.distributed as dist\n" + code, "w.py")) is bad


def test_every_collective_name_exists_since_the_minimum_torch():
    # chapter 9 called dist.reduce_scatter_single, which torch 2.11 lacks: a name is either in every
    # torch since TORCH_MIN, or one of torch 2.13's that worker.start() gives an older torch.
    assert collectives.too_new() == {}
    used = collectives.names_used()
    assert "reduce_scatter_single" in used and "all_reduce" in used  # the rule sees chapter 9's calls
