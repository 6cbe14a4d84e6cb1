"""Test worker for helpers.ring: the course's ring and the naive PS reduce against dist.all_reduce.

Checks several sizes (not divisible by the world size, smaller than it, empty), dtypes and piece
sizes; with `count`, also the bytes each rank sends. Prints one `ok ...` line per rank.
"""

import torch
import torch.distributed as dist

from helpers.ring import count_sends, deadlock_guard, ps_allreduce, ring_allreduce, ring_bytes_per_worker
from helpers.worker import finish, report, start

start("gloo", timeout=60)
rank, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
checked = 0
with deadlock_guard(60, "ring_worker checks"):
    for dtype in (torch.float32, torch.float64, torch.int64):
        for numel in (0, 1, n - 1, 7 * n + 3, 1000, 65537):
            if dtype.is_floating_point:
                x = torch.randn(numel, dtype=dtype)
            else:
                x = torch.randint(-1000, 1000, (numel,), dtype=dtype)
            want = x.clone()
            dist.all_reduce(want)
            # one piece per chunk, and (small sizes only: each piece is a message) many pieces
            for piece_bytes in ((1 << 20, 40) if numel <= 1000 else (1 << 20,)):
                got = ring_allreduce(x.clone(), piece_bytes=piece_bytes)
                assert got.dtype == dtype and got.shape == want.shape
                tol = 1e-5 if dtype == torch.float32 else 1e-12
                assert torch.allclose(got, want, rtol=tol, atol=tol) if dtype.is_floating_point \
                    else torch.equal(got, want), f"ring wrong: {dtype} numel={numel} piece={piece_bytes}"
                checked += 1
            ps = ps_allreduce(x.clone())
            assert torch.allclose(ps, want, rtol=1e-5, atol=1e-5) if dtype.is_floating_point \
                else torch.equal(ps, want), f"ps wrong: {dtype} numel={numel}"
    counts = count_sends()
    numel = 40 * n
    ring_allreduce(torch.ones(numel))
    expect = ring_bytes_per_worker(numel * 4, n)
    assert counts["bytes"] == expect, (counts, expect)
    # a blocking dist.send (torch implements it with isend) is one message, counted once
    msg = torch.ones(10)
    for op in ((dist.send, dist.recv) if rank % 2 == 0 else (dist.recv, dist.send)):
        op(msg, (rank + 1) % n if op is dist.send else (rank - 1) % n)
    expect += 40
    assert (counts["bytes"], counts["messages"]) == (expect, 2 * (n - 1) + 1), (counts, expect)
    assert set(counts) == {"bytes", "messages", f"to {(rank + 1) % n}"}, counts
print(f"ok rank {rank} of {n}: {checked} ring checks, {counts['bytes']} bytes sent to the right")
report(checked=checked, bytes_sent=counts["bytes"])
finish()
