"""helpers.ddp and the one "who am I" (helpers.worker.place): torchrun/SLURM environments, the lr schedule, and a real 2-rank launch."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import helpers
from helpers.ddp import cosine_warmup, reduce_value
from helpers.worker import Worker, place, slurm_first_host

pytestmark = pytest.mark.gate  # tests/tiers.py

WORKER = Path(__file__).parent / "workers" / "ddp_check.py"


def test_place_reads_torchrun_and_where_rank_0_listens():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
    assert place(env) == Worker(3, 8, 1, 8, "torchrun", master_addr="n1", master_port="1234")
    assert place(env).distributed and not place(env).is_main


def test_place_reads_slurm_and_finds_the_master():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NODELIST": "gpu[07-08]"}
    got = place(env)
    assert (got.rank, got.world_size, got.local_rank, got.source) == (5, 8, 1, "slurm")
    assert (got.master_addr, got.master_port) == ("gpu07", "29500")
    assert place({**env, "MASTER_ADDR": "login1", "MASTER_PORT": "2222"}).master_addr == "login1"


def test_place_without_launcher_is_not_distributed():
    assert place({}) == Worker() and not place({}).distributed and place({}).is_main


@pytest.mark.parametrize("nodes,first", [("a1", "a1"), ("gpu[03-05,9],cpu1", "gpu03"),
                                         ("node[12]", "node12"), ("x2,y[1-2]", "x2")])
def test_slurm_first_host(nodes, first):
    assert slurm_first_host(nodes) == first


def test_cosine_warmup_shape():
    f = [cosine_warmup(s, 100, warmup=10, final=0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0) and f[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])), "decreasing after warm-up"
    assert cosine_warmup(100, 100, 10, 0.1) == pytest.approx(0.1)


def test_single_process_fallbacks():
    t = torch.tensor([2.0])
    assert reduce_value(t) is t


def test_two_ranks_reduce_and_ddp_with_our_syncbn_on_cpu():
    res = helpers.launch(WORKER, 2, timeout=120, echo=False)
    for r in (0, 1):
        text = "\n".join(res.lines(r))
        assert f"rank {r} of 2 via torchrun: mean 0.5 sum 1 main {r == 0}" in text
        assert f"rank {r} weights equal after a step: True" in text


def test_setup_without_launcher_starts_nothing():
    import torch.distributed as dist

    from helpers.ddp import setup

    me, device = setup(environ={})
    assert isinstance(me, Worker) and not me.distributed and me.is_main and not dist.is_initialized()
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
