"""Ring all-reduce from scratch (chapter 5): chunk boundaries, a one-process simulation you can watch step by
step, the real thing over torch.distributed point-to-point (gloo), a naive parameter-server
reduce, the alpha-beta cost model, bus bandwidth, a deadlock guard and a side-by-side measurement.

Ring convention used everywhere (course, lab, tests): with N workers and the data cut into N
chunks, at step t = 0 .. 2(N-1)-1 worker r sends chunk (r - t) mod N to worker r+1 and receives
chunk (r - t - 1) mod N from worker r-1. During the first N-1 steps (reduce-scatter) it adds what
it receives; afterwards worker r holds the complete sum of chunk (r + 1) mod N. During the last
N-1 steps (all-gather) it overwrites its copy with what it receives.
"""
from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpc_runtime.worker import where_now

PHASES = ("reduce-scatter", "all-gather")


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """(start, stop) of n contiguous chunks of numel elements; the first numel % n get one more (chapter 5)."""
    if n < 1 or numel < 0:
        raise ValueError(f"chunk_bounds needs n >= 1 and numel >= 0, got numel={numel}, n={n}")
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_schedule(rank: int, n: int, t: int) -> tuple[str, int, int]:
    """(phase, chunk sent, chunk received) by worker rank at ring step t (0 .. 2(n-1)-1) (chapter 5)."""
    if not 0 <= t < 2 * (n - 1):
        raise ValueError(f"step {t} is outside 0 .. {2 * (n - 1) - 1} for {n} workers")
    return PHASES[t >= n - 1], (rank - t) % n, (rank - t - 1) % n


def ring_bytes_per_worker(nbytes: float, n: int) -> float:
    """Bytes each worker sends in a ring all-reduce of nbytes: 2(n-1)/n * nbytes (chapter 5)."""
    return 2 * (n - 1) / n * nbytes


def ps_bytes_at_server(nbytes: float, n: int) -> float:
    """Bytes through a single parameter server's link: (n-1) gradients in, (n-1) results out (chapter 5)."""
    return 2 * (n - 1) * nbytes


def cost_ring(n: int, nbytes: float, alpha: float, beta: float) -> float:
    """Alpha-beta time of a ring all-reduce: 2(n-1) steps of one latency plus nbytes/n each (chapter 5)."""
    return 2 * (n - 1) * (alpha + nbytes / n * beta) if n > 1 else 0.0


def cost_ps(n: int, nbytes: float, alpha: float, beta: float) -> float:
    """Alpha-beta time of a single-server reduce: 2(n-1) full messages through the server's link (chapter 5)."""
    return 2 * (n - 1) * (alpha + nbytes * beta) if n > 1 else 0.0


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s (nccl-tests' definition): algbw * 2(n-1)/n, algbw = nbytes/seconds (chapter 5)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return nbytes / seconds * 2 * (n - 1) / n


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class Transfer:
    """One message of the simulated ring: who sent which chunk to whom, and how many bytes (chapter 5)."""

    step: int
    src: int
    dst: int
    chunk: int
    nbytes: int


@dataclass
class RingStep:
    """The state after one step: the transfers of that step, every worker's data and contributors (chapter 5)."""

    step: int  # -1 for the starting state
    phase: str
    transfers: list[Transfer]
    buffers: list[np.ndarray]  # one flat copy per worker
    who: list[list[frozenset[int]]]  # who[w][c]: workers whose data is summed in w's chunk c


def simulate_ring(data: Sequence[np.ndarray]) -> list[RingStep]:
    """Run a ring all-reduce of data (one flat array per worker) in one process; every state (chapter 5)."""
    n = len(data)
    if n < 1:
        raise ValueError("simulate_ring needs at least one worker")
    bufs = [np.array(d, copy=True).ravel() for d in data]
    if len({b.size for b in bufs}) != 1:
        raise ValueError("every worker must hold the same number of elements")
    bounds = chunk_bounds(bufs[0].size, n)
    who = [[frozenset([w]) for _ in range(n)] for w in range(n)]
    steps = [RingStep(-1, "start", [], [b.copy() for b in bufs], [list(row) for row in who])]
    for t in range(2 * (n - 1)):
        phase = ring_schedule(0, n, t)[0]
        # All workers send at once: take every message before anyone changes its data.
        msgs = []
        for r in range(n):
            _, c_send, _ = ring_schedule(r, n, t)
            lo, hi = bounds[c_send]
            msgs.append((Transfer(t, r, (r + 1) % n, c_send, int(bufs[r][lo:hi].nbytes)),
                         bufs[r][lo:hi].copy(), who[r][c_send]))
        for tr, payload, contrib in msgs:
            lo, hi = bounds[tr.chunk]
            if phase == "reduce-scatter":
                bufs[tr.dst][lo:hi] += payload
                who[tr.dst][tr.chunk] = who[tr.dst][tr.chunk] | contrib
            else:
                bufs[tr.dst][lo:hi] = payload
                who[tr.dst][tr.chunk] = contrib
        steps.append(RingStep(t, phase, [m[0] for m in msgs], [b.copy() for b in bufs],
                              [list(row) for row in who]))
    return steps


def sent_bytes(steps: Sequence[RingStep], n: int) -> list[int]:
    """Bytes each worker sent over a simulated run (chapter 5)."""
    out = [0] * n
    for st in steps:
        for tr in st.transfers:
            out[tr.src] += tr.nbytes
    return out


def plot_ring_step(step: RingStep, n: int, ax: Any = None) -> Any:
    """Draw one state as a grid (rows: workers, columns: chunks); arrows mark this step's sends (chapter 5)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(0.55 * n + 1.2, 0.5 * n + 0.9))
    counts = np.array([[len(step.who[w][c]) for c in range(n)] for w in range(n)])
    ax.imshow(counts, cmap="YlGn", vmin=0, vmax=n + 0.5)
    sent = {(tr.src, tr.chunk) for tr in step.transfers}
    got = {(tr.dst, tr.chunk) for tr in step.transfers}
    for w in range(n):
        for c in range(n):
            label = "".join(str(x) for x in sorted(step.who[w][c])) if n <= 6 else str(counts[w, c])
            full = counts[w, c] == n
            ax.text(c, w, label, ha="center", va="center", fontsize=8 if n <= 4 else 6,
                    fontweight="bold" if full else "normal")
            if (w, c) in got:
                ax.add_patch(plt.Rectangle((c - 0.5, w - 0.5), 1, 1, fill=False, ec="tab:red", lw=2))
            if (w, c) in sent:
                ax.add_patch(plt.Rectangle((c - 0.42, w - 0.42), 0.84, 0.84, fill=False,
                                           ec="tab:blue", lw=1.2, ls="--"))
    ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
    ax.set_yticks(range(n), [f"w{w}" for w in range(n)], fontsize=7)
    title = "start" if step.step < 0 else f"step {step.step + 1}: {step.phase}"
    ax.set_title(title, fontsize=8)
    return ax


def plot_ring(steps: Sequence[RingStep], n: int, cols: int = 4) -> Any:
    """All states of a simulated ring, one grid per step; returns the matplotlib Figure (chapter 5)."""
    import matplotlib.pyplot as plt

    rows = -(-len(steps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (0.5 * n + 1.1), rows * (0.5 * n + 0.9)),
                             squeeze=False)
    for ax in axes.ravel()[len(steps):]:
        ax.axis("off")
    for st, ax in zip(steps, axes.ravel()):
        plot_ring_step(st, n, ax)
    fig.suptitle("digits: whose data is summed in each chunk; dashed blue: sent, red: received",
                 fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- real processes


def _pieces(lo: int, hi: int, piece: int) -> list[tuple[int, int]]:
    """Split [lo, hi) into consecutive pieces of at most `piece` elements (none when empty)."""
    return [(a, min(a + piece, hi)) for a in range(lo, hi, piece)]


def ring_allreduce(flat: Any, *, piece_bytes: int = 1 << 20, group: Any = None) -> Any:
    """Sum flat (a contiguous 1-D tensor) over all ranks in place with a pipelined ring; returns it (chapter 5).

    Each chunk is cut into pieces of about piece_bytes; a piece is forwarded to the right neighbour
    as soon as it has been received (and, in the reduce-scatter, added), so the reduction of one
    piece overlaps the transfer of the next. Any size (chunks are uneven when numel % N != 0), any
    dtype torch can add.
    """
    import torch
    import torch.distributed as dist

    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError("ring_allreduce works in place on a contiguous 1-D tensor: pass t.view(-1)")
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return flat
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    right, left = ranks[(rank + 1) % n], ranks[(rank - 1) % n]
    bounds = chunk_bounds(flat.numel(), n)
    piece = max(1, piece_bytes // flat.element_size())
    pieces = [_pieces(lo, hi, piece) for lo, hi in bounds]
    biggest = max(hi - lo for lo, hi in bounds)
    scratch = [torch.empty(biggest, dtype=flat.dtype), torch.empty(biggest, dtype=flat.dtype)]
    steps = 2 * (n - 1)
    sends: list[list[Any]] = [[] for _ in range(steps)]

    def post_recvs(t: int) -> list[Any]:
        _, _, c = ring_schedule(rank, n, t)
        lo = bounds[c][0]
        if t < n - 1:  # reduce-scatter: into scratch, added afterwards
            buf = scratch[t % 2]
            return [dist.irecv(buf[a - lo:b - lo], left, group=group, tag=t) for a, b in pieces[c]]
        for work in sends[t + 1 - n]:  # this chunk left us N-1 steps ago: that send must be done
            work.wait()
        sends[t + 1 - n] = []  # (a gloo work must be waited for once only)
        return [dist.irecv(flat[a:b], left, group=group, tag=t) for a, b in pieces[c]]

    sends[0] = [dist.isend(flat[a:b], right, group=group, tag=0) for a, b in pieces[rank]]
    recvs = post_recvs(0)
    for t in range(steps):
        nxt = post_recvs(t + 1) if t + 1 < steps else []
        _, _, c = ring_schedule(rank, n, t)
        lo = bounds[c][0]
        for (a, b), work in zip(pieces[c], recvs):
            work.wait()
            if t < n - 1:
                flat[a:b].add_(scratch[t % 2][a - lo:b - lo])
            if t + 1 < steps:  # what we just got is what we send next
                sends[t + 1].append(dist.isend(flat[a:b], right, group=group, tag=t + 1))
        recvs = nxt
    for works in sends:
        for work in works:
            work.wait()
    return flat


def _wait(work: Any) -> None:
    """Wait for a point-to-point request (torch types it as optional; gloo always returns one)."""
    assert work is not None, "no request object for a point-to-point call"
    work.wait()


def ps_allreduce(flat: Any, *, server: int = 0) -> Any:
    """Naive parameter-server sum in place: everyone sends to server, which sums and sends back (chapter 5)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return flat
    if rank != server:
        dist.send(flat, server)
        dist.recv(flat, server)
        return flat
    others = [r for r in range(n) if r != server]
    bufs = {r: torch.empty_like(flat) for r in others}
    works = {r: dist.irecv(bufs[r], r) for r in others}
    for r in others:
        _wait(works[r])
        flat.add_(bufs[r])
    for work in [dist.isend(flat, r) for r in others]:
        _wait(work)
    return flat


@contextmanager
def deadlock_guard(seconds: float, what: str = "the ring") -> Iterator[None]:
    """Exit this process with a clear message if the block does not finish within seconds (chapter 5)."""
    done = threading.Event()
    rank = os.environ.get("RANK", "?")

    def watch() -> None:
        if not done.wait(seconds):
            waiting, where = where_now()
            print(f"DEADLOCK? rank {rank}: {what} did not finish within {seconds:g} s; this rank was "
                  f"{where}.", file=sys.stderr, flush=True)
            if waiting:
                print("Every rank may be waiting for a peer that waits too: a blocking dist.send "
                      "waits until the receiver posts its recv, so if every rank sends first, "
                      "nobody receives. Post the receive before waiting (dist.isend + dist.irecv, "
                      "then .wait()), and check that sender and receiver agree on the step and the "
                      "chunk size.", file=sys.stderr, flush=True)
            else:
                print("It never reached the communication its peers were waiting for: look at "
                      "that line (a loop that does not end?).", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def count_sends() -> dict[str, int]:
    """Wrap dist.send/isend of this process to count bytes and peers; returns the live counters (chapter 5).

    Call it before importing code that does `from torch.distributed import isend`.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    counts: dict[str, int] = {"bytes": 0, "messages": 0}
    inside = threading.local()  # dist.send calls isend: count the outer call only

    for name in ("send", "isend"):
        original = getattr(c10d, name)
        if getattr(original, "_counted", False):
            original = original.__wrapped__

        def wrapped(tensor: Any, dst: int | None = None, *args: Any, _f: Any = original,
                    **kwargs: Any) -> Any:
            if getattr(inside, "depth", 0) == 0:
                counts["bytes"] += tensor.numel() * tensor.element_size()
                counts["messages"] += 1
                peer = dst if dst is not None else kwargs.get("dst", kwargs.get("group_dst"))
                counts[f"to {peer}"] = counts.get(f"to {peer}", 0) + tensor.numel() * tensor.element_size()
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return _f(tensor, dst, *args, **kwargs)
            finally:
                inside.depth -= 1

        wrapped._counted = True  # type: ignore[attr-defined]
        wrapped.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(dist, name, wrapped)
        setattr(c10d, name, wrapped)  # P2POp / batch_isend_irecv check ops against this module
    return counts


@dataclass
class Measurement:
    """Median time of one all-reduce method at one size and world size, with its bandwidths (chapter 5)."""

    method: str
    n: int
    nbytes: int
    seconds: float
    times: list[float] = field(default_factory=list)

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth in bytes/s: message size / time."""
        return self.nbytes / self.seconds

    @property
    def busbw(self) -> float:
        """Bus bandwidth in bytes/s: algbw * 2(n-1)/n."""
        return bus_bandwidth(self.nbytes, self.seconds, self.n)


def measure_allreduce(sizes: Sequence[int], *, repeat: int = 5, warmup: int = 1,
                      methods: Sequence[str] = ("ring", "gloo", "ps")) -> list[Measurement]:
    """Inside a worker: time each method at each size (bytes of float32), interleaved; medians (chapter 5).

    The time of one call is the slowest rank's, taken after a barrier. Every result is checked
    against the exact sum. Returns the same list on every rank.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = {"ring": ring_allreduce, "gloo": lambda t: dist.all_reduce(t), "ps": ps_allreduce}
    out = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        # small integers: every summation order gives the exact same float32 result
        base = (torch.arange(numel, dtype=torch.float32) % 7) + rank
        expected = (torch.arange(numel, dtype=torch.float32) % 7) * n + n * (n - 1) / 2
        bufs = {m: base.clone() for m in methods}
        times: dict[str, list[float]] = {m: [] for m in methods}
        for i in range(warmup + repeat):
            for m in methods:  # interleaved: noise on the shared box hits every method alike
                buf = bufs[m]
                buf.copy_(base)
                dist.barrier()
                start = time.perf_counter()
                ops[m](buf)
                took = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device="cpu")
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if not torch.equal(buf, expected):
                    raise RuntimeError(f"{m} all-reduce of {nbytes} bytes gave a wrong sum")
                if i >= warmup:
                    times[m].append(float(took))
        out += [Measurement(m, n, numel * 4, statistics.median(times[m]), times[m]) for m in methods]
    return out
