"""A network you can dial: ranks on one machine communicate as if over a slower link (chapter 5's
alpha-beta model, made real; chapter 11 times DDP's buckets on it).

Loopback between processes on one laptop is fast and noisy (gloo reaches about 0.7 GB/s of bus
bandwidth on 2 cores), so the effects that decide data-parallel speed on a cluster — per-message
latency, bandwidth-bound transfers — vanish in the noise. A `Link` says what one message of `n`
bytes costs on a real link: `alpha + n / bandwidth` seconds. `ring_allreduce(flat, link)` is a real
ring all-reduce over gloo point-to-point messages in which every message is delivered no earlier
than the link would deliver it: the sender stamps it with the time it was sent (CLOCK_MONOTONIC,
one clock for every process of the machine), and the receiver, once the bytes are there, waits
until that time plus the link's cost. So each step of the ring costs what the model says, and the
whole all-reduce composes to chapter 5's `cost_ring` — which `tests/test_link.py` checks by
measuring it. `LinkHook` sends DDP's gradient buckets over the same link, in a thread of its own (as
NCCL runs on its own stream), and keeps a ledger of when each bucket was issued, started and done,
beside when each gradient became ready: the overlap of communication with the backward pass, as
data. Only links slower than the machine's loopback can be dialled: a message that really
took longer than the model allows is not sped up (`Link.reachable` says which presets fit).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from .ring import chunk_bounds, cost_ring

__all__ = ["PRESETS", "Link", "LinkHook", "ring_allreduce"]

_HEADER = 8  # bytes of the send time (float64) in front of every message


@dataclass(frozen=True)
class Link:
    """A link of the alpha-beta model: alpha seconds per message, bandwidth in bytes/s (chapter 11)."""

    name: str
    alpha: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not (self.alpha >= 0 and self.bandwidth > 0):
            raise ValueError(f"Link {self.name!r}: alpha must be >= 0 s and bandwidth > 0 bytes/s, "
                             f"not alpha={self.alpha!r}, bandwidth={self.bandwidth!r}")

    def message_seconds(self, nbytes: float) -> float:
        """Seconds one message of nbytes takes on this link: alpha + nbytes / bandwidth (chapter 11)."""
        return self.alpha + nbytes / self.bandwidth

    def ring_seconds(self, n: int, nbytes: float) -> float:
        """Predicted seconds of a ring all-reduce of nbytes on n ranks over this link (chapter 11; chapter 5's cost_ring)."""
        return cost_ring(n, nbytes, self.alpha, 1.0 / self.bandwidth)

    def reachable(self, loopback_bandwidth: float) -> bool:
        """Whether a machine whose loopback moves loopback_bandwidth bytes/s can dial this link (chapter 11)."""
        return self.bandwidth < loopback_bandwidth


# Typical figures of real links (vendor specifications: 1 Gb/s is 125 MB/s of payload at best; one
# small TCP message across a switch costs tens of microseconds, RDMA a few). Loopback on a laptop
# can stand in for the first two only.
PRESETS = {
    "100Mb": Link("100 Mb/s Ethernet", alpha=100e-6, bandwidth=12.5e6),
    "1GbE": Link("1 Gb/s Ethernet", alpha=50e-6, bandwidth=125e6),
    "10GbE": Link("10 Gb/s Ethernet", alpha=20e-6, bandwidth=1.25e9),
}


def _complete(request: Any) -> None:
    """Block until a point-to-point request is done (gloo returns one for every isend and irecv)."""
    assert request is not None, "no request object for a point-to-point call"
    request.wait()


def _exchange(out: Any, into_bytes: int, right: int, left: int, link: Link, group: Any, tag: int) -> Any:
    """Send out (a contiguous tensor) right and receive into_bytes from left, delivered as the link would."""
    import torch
    import torch.distributed as dist

    msg = torch.empty(_HEADER + out.numel() * out.element_size(), dtype=torch.uint8, device="cpu")  # point-to-point: CPU only
    msg[_HEADER:] = out.reshape(-1).view(torch.uint8)
    got = torch.empty(_HEADER + into_bytes, dtype=torch.uint8, device="cpu")
    recv = dist.irecv(got, left, group=group, tag=tag)
    msg[:_HEADER] = torch.tensor([time.monotonic()], dtype=torch.float64).view(torch.uint8)
    send = dist.isend(msg, right, group=group, tag=tag)
    _complete(recv)
    sent_at = float(got[:_HEADER].view(torch.float64).item())
    wait = sent_at + link.message_seconds(into_bytes) - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # the bytes are here; the link would not have delivered them yet
    _complete(send)
    return got[_HEADER:]


def ring_allreduce(flat: Any, link: Link, *, group: Any = None) -> Any:
    """Sum flat (a contiguous 1-D tensor) over all ranks in place with a ring whose messages cross link; returns it (chapter 11).

    2(N-1) steps: N-1 of reduce-scatter (each rank adds the chunk its left neighbour sends), N-1 of
    all-gather (each forwards the chunk it completed). Every message is delivered at its send time
    plus link.message_seconds(its size), so the call takes link.ring_seconds(N, bytes) plus what the
    ranks spend between messages (adding, copying): the compute a real link overlaps with nothing.
    """
    import torch.distributed as dist

    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError("ring_allreduce works in place on a contiguous 1-D tensor: pass t.view(-1)")
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return flat
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    right, left = ranks[(rank + 1) % n], ranks[(rank - 1) % n]
    bounds = chunk_bounds(flat.numel(), n)
    size = flat.element_size()
    for t in range(n - 1):  # reduce-scatter: after it, rank r holds the sum of chunk (r + 1) % n
        s_lo, s_hi = bounds[(rank - t) % n]
        r_lo, r_hi = bounds[(rank - t - 1) % n]
        got = _exchange(flat[s_lo:s_hi], (r_hi - r_lo) * size, right, left, link, group, tag=t)
        flat[r_lo:r_hi] += got.view(flat.dtype)
    for t in range(n - 1):  # all-gather: forward the complete chunk, receive the next one
        s_lo, s_hi = bounds[(rank + 1 - t) % n]
        r_lo, r_hi = bounds[(rank - t) % n]
        got = _exchange(flat[s_lo:s_hi], (r_hi - r_lo) * size, right, left, link, group, tag=n + t)
        flat[r_lo:r_hi] = got.view(flat.dtype)
    return flat


class LinkHook:
    """DDP communication hook: each gradient bucket averaged over a dialled link by a thread of its own, with a ledger (chapter 11).

        hook = LinkHook(PRESETS["1GbE"])          # on every rank, in the same order (it makes a group)
        hook.watch(model)                          # also note when each gradient is ready
        ddp.register_comm_hook(None, hook.hook)

    The hook returns at once with a future; the thread runs the buckets' all-reduces one after the
    other, in the order DDP issued them, while the backward pass goes on. ledger: one dict per event
    ("grad ready" with the parameter's name; "issued", "started", "done" with the bucket's index and
    bytes), each with its time.monotonic().
    """

    def __init__(self, link: Link, *, group: Any = None) -> None:
        import torch.distributed as dist

        self.link = link
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.world = dist.get_world_size(self.group)
        self.ledger: list[dict[str, Any]] = []
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="dialled-link", daemon=True)
        self._thread.start()

    def note(self, event: str, **what: Any) -> None:
        """Add an event to the ledger, stamped with time.monotonic() (chapter 11)."""
        self.ledger.append({"event": event, "t": time.monotonic(), **what})

    def watch(self, model: Any) -> None:
        """Note "grad ready" for each parameter of model when its gradient is accumulated (chapter 11)."""
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda _p, name=name: self.note("grad ready", param=name))

    def hook(self, state, bucket):  # noqa: ANN001, ANN201 (DDP reads the names; annotations must be absent or exact)
        """What DDP calls when a bucket is full: queue its all-reduce, return its future (chapter 11)."""
        import torch

        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        buf = bucket.buffer()
        self.note("issued", bucket=bucket.index(), bytes=buf.numel() * buf.element_size())
        self._jobs.put((bucket.index(), buf, fut))
        return fut

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            index, buf, fut = job
            try:
                self.note("started", bucket=index)
                ring_allreduce(buf, self.link, group=self.group)
                buf.div_(self.world)
                self.note("done", bucket=index)
                fut.set_result(buf)
            except Exception as err:  # noqa: BLE001 (handed to DDP, which raises it in backward)
                fut.set_exception(err)

    def close(self) -> None:
        """Stop the thread once the queued all-reduces are done (chapter 11)."""
        self._jobs.put(None)
        self._thread.join()
