"""Horovod all-reduce benchmark (gloo, CPU): bus bandwidth per message size and number of ranks,
side by side with torch.distributed's gloo all_reduce in the same processes.

For N in {2, 4} the script launches itself with `horovodrun -np N --gloo` (helpers.launch). Every
rank all-reduces (sums) float32 tensors of 1, 4, 16 and 64 MB with Horovod and with
torch.distributed (a second gloo group over the same processes); sizes and libraries are
interleaved, REPEAT times, and the medians are reported. Bandwidths use the definition of the
ring benchmark and of nccl-tests:

    algbw = bytes / time        busbw = algbw * 2(N-1)/N

(a ring all-reduce sends and receives 2(N-1)/N of the message per rank, so busbw is comparable
across N, and with the link's bandwidth). On a shared 2-core box ranks compete for cores: the
numbers are what they are; only the ratios measured side by side in one run mean much.

    python benchmarks/hvd_allreduce.py [--ranks 2 4] [--sizes-mb 1 4 16 64] [--repeat 5]
                                       [--quick] [--json PATH]
    python benchmarks/hvd_allreduce.py --show PATH      # the table of an earlier --json, again
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _connect() -> None:
    """Start this rank: the worker protocol, Horovod, and a torch.distributed gloo group over the same ranks."""
    import horovod.torch as hvd
    import torch
    import torch.distributed as dist

    from helpers import free_port
    from helpers.worker import start

    start(backend=None)  # Horovod makes its own communication; the gloo group below is measured
    hvd.init()
    torch.set_num_threads(1)
    port = None
    if hvd.rank() == 0:
        port = free_port()
    port = hvd.broadcast_object(port, root_rank=0, name="port")  # same name on every rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size())


def _libraries() -> dict[str, Callable[[torch.Tensor, str], None]]:
    """Each library's in-place all-reduce (sum) of a tensor, by name (Horovod matches calls by name)."""
    import horovod.torch as hvd
    import torch.distributed as dist

    def run_hvd(t: torch.Tensor, name: str) -> None:
        hvd.allreduce_(t, op=hvd.Sum, name=name)

    def run_torch(t: torch.Tensor, name: str) -> None:
        dist.all_reduce(t)

    return {"horovod": run_hvd, "torch.distributed": run_torch}


def _time(libs: dict[str, Callable[[torch.Tensor, str], None]], tensors: dict[float, torch.Tensor],
          repeat: int, iters: int) -> dict[tuple[str, float], list[float]]:
    """Seconds per all-reduce on the slowest rank, for each (library, MB), interleaved, after a warm-up."""
    import horovod.torch as hvd
    import torch.distributed as dist

    for mb, t in tensors.items():  # warm-up: connections, buffers, Horovod's negotiation
        for lib, fn in libs.items():
            fn(t, f"warm.{mb}")
    times: dict[tuple[str, float], list[float]] = {(lib, mb): [] for lib in libs for mb in tensors}
    for r in range(repeat):
        order = list(libs) if r % 2 == 0 else list(reversed(libs))  # interleaved, alternating
        for mb, t in tensors.items():
            for lib in order:
                dist.barrier()
                t0 = time.perf_counter()
                for i in range(iters):
                    libs[lib](t, f"bench.{mb}")
                elapsed = (time.perf_counter() - t0) / iters
                # the slowest rank decides when an all-reduce is done
                times[(lib, mb)].append(max(hvd.allgather_object(elapsed)))
    return times


def _rows(times: dict[tuple[str, float], list[float]], ranks: int, repeat: int) -> list[dict]:
    """One row per (library, MB): the median time and the algorithm and bus bandwidths."""
    from helpers.ring import bus_bandwidth

    rows = []
    for (lib, mb), ts in times.items():
        med = statistics.median(ts)
        nbytes = int(mb * 2**20) // 4 * 4
        algbw = nbytes / med / 1e9
        rows.append({"library": lib, "ranks": ranks, "mbytes": mb, "bytes": nbytes,
                     "median_s": med, "algbw_GBps": algbw,
                     "busbw_GBps": bus_bandwidth(nbytes, med, ranks) / 1e9, "repeats": repeat})
    return rows


def worker(sizes_mb: list[float], repeat: int, iters: int) -> None:
    """One rank: time Horovod's and torch.distributed's all-reduce; rank 0 prints the medians."""
    import horovod.torch as hvd
    import torch

    from helpers.worker import finish, report

    _connect()
    tensors = {mb: torch.ones(int(mb * 2**20) // 4) for mb in sizes_mb}
    times = _time(_libraries(), tensors, repeat, iters)
    if hvd.rank() == 0:
        report(rows=_rows(times, hvd.size(), repeat))
    finish()


def table(rows: list[dict]) -> str:
    """The results as a text table: one line per (ranks, size), both libraries and their ratio."""
    by = {(r["ranks"], r["mbytes"], r["library"]): r for r in rows}
    keys = sorted({(r["ranks"], r["mbytes"]) for r in rows})
    head = (f"{'ranks':>5} {'MB':>5} | {'horovod ms':>10} {'busbw GB/s':>10} | "
            f"{'torch ms':>9} {'busbw GB/s':>10} | {'hvd/torch busbw':>15}")
    lines = [head, "-" * len(head)]
    for n, mb in keys:
        h, t = by[(n, mb, "horovod")], by[(n, mb, "torch.distributed")]
        lines.append(f"{n:>5} {mb:>5g} | {h['median_s'] * 1e3:>10.1f} {h['busbw_GBps']:>10.2f} | "
                     f"{t['median_s'] * 1e3:>9.1f} {t['busbw_GBps']:>10.2f} | "
                     f"{h['busbw_GBps'] / t['busbw_GBps']:>15.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--repeat", type=int, default=5, help="interleaved repeats (medians over them)")
    p.add_argument("--iters", type=int, default=2, help="all-reduces per timed sample")
    p.add_argument("--quick", action="store_true", help="1 and 4 MB, 3 repeats, 1 iteration")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--show", metavar="PATH", help="print the table of a JSON written by --json; launch nothing")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.sizes_mb, a.repeat, a.iters = [1, 4], 3, 1
    if a.worker:
        worker(a.sizes_mb, a.repeat, a.iters)
        return
    if a.show:
        print(table(json.loads(Path(a.show).read_text())["rows"]))
        return

    import helpers

    rows: list[dict] = []
    for n in a.ranks:
        args = ["--worker", "--repeat", str(a.repeat), "--iters", str(a.iters),
                "--sizes-mb", *map(str, a.sizes_mb)]
        res = helpers.launch(__file__, n, launcher="horovodrun", args=args, timeout=a.timeout,
                             echo=False)
        rows += res.report(0)["rows"]
        print(f"{n} ranks measured in {res.seconds:.0f} s", flush=True)
    print("\nAll-reduce (sum) of float32 tensors over gloo on CPU; medians of "
          f"{a.repeat} interleaved repeats; busbw = bytes/time x 2(N-1)/N")
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps({
            "benchmark": "hvd_allreduce", "backend": "gloo (CPU)",
            "busbw": "algbw * 2(N-1)/N, algbw = bytes / median time", "rows": rows}, indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
