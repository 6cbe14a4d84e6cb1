"""Test worker for helpers.link: the dialled ring's sums, and its time against the alpha-beta prediction.

    link_check.py PRESET NBYTES[,NBYTES...] REPEAT

Every rank checks its sums (exact: small integers); rank 0 reports, per size, the median over REPEAT
calls of the slowest rank's time (and every call's), beside link.ring_seconds(N, size).
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist

from helpers.link import PRESETS, ring_allreduce
from helpers.worker import finish, report, start

start("gloo", timeout=60)
torch.set_num_threads(1)
rank, n = dist.get_rank(), dist.get_world_size()
link = PRESETS[sys.argv[1]]
sizes = [int(s) for s in sys.argv[2].split(",")]
repeat = int(sys.argv[3])
for numel in (0, 1, n + 1, 1001):  # uneven and empty chunks: right sums, whatever the time
    x = torch.arange(numel, dtype=torch.float32) + rank
    assert torch.equal(ring_allreduce(x, link), torch.arange(numel, dtype=torch.float32) * n + n * (n - 1) / 2)
rows = []
for nbytes in sizes:
    numel = nbytes // 4
    expected = (torch.arange(numel, dtype=torch.float32) % 7) * n + n * (n - 1) / 2
    times = []
    for i in range(repeat + 1):  # the first call warms up
        buf = (torch.arange(numel, dtype=torch.float32) % 7) + rank
        dist.barrier()
        t0 = time.monotonic()
        ring_allreduce(buf, link)
        took = torch.tensor([time.monotonic() - t0], dtype=torch.float64, device="cpu")
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        assert torch.equal(buf, expected), f"wrong sum at {nbytes} bytes"
        if i:
            times.append(float(took))
    rows.append({"nbytes": numel * 4, "measured": statistics.median(times), "times": times,
                 "predicted": link.ring_seconds(n, numel * 4)})
if rank == 0:
    report(rows=rows)
finish()
