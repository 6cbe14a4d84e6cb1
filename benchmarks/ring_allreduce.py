"""Ring all-reduce benchmark: the course's ring vs gloo's all_reduce vs a naive parameter server.

For each world size N, one torchrun launch runs the three methods interleaved (REPEAT times per
size, after a warm-up) on float32 messages of each size, takes the median of the slowest rank's
time, and reports bus bandwidth = (bytes / time) * 2(N-1)/N (nccl-tests' definition, also used by
the Horovod benchmark). Goal on a 2-core CPU box: the ring >= 0.8x gloo's bus bandwidth at 16-64 MB
with 2 and 4 ranks. Absolute bandwidths are only reported.

    python benchmarks/ring_allreduce.py [--sizes-mb 1 4 16 64] [--nprocs 2 4] [--repeat 5]
                                        [--quick] [--json build/bench/ring_allreduce.json]

The script launches itself with torchrun (hidden --worker flag) as the worker of each measurement.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.8
GOAL_MB = (16, 64)


def worker(sizes: list[int], repeat: int) -> None:
    """Inside torchrun: measure; rank 0 reports the rows."""
    from helpers.ring import measure_allreduce
    from helpers.worker import finish, report, start

    me = start("gloo", timeout=300)
    rows = measure_allreduce(sizes, repeat=repeat)
    if me.is_main:
        report(rows=[{"method": r.method, "n": r.n, "bytes": r.nbytes, "seconds": r.seconds,
                      "times": r.times, "busbw": r.busbw, "algbw": r.algbw} for r in rows])
    finish()


def run(sizes_mb: list[float], nprocs: list[int], repeat: int, timeout: float) -> list[dict]:
    """Launch one measurement per world size; all rows."""
    import helpers

    sizes = [int(mb * 2**20) for mb in sizes_mb]
    rows: list[dict] = []
    for n in nprocs:
        res = helpers.launch(__file__, n, args=["--worker", "--sizes", *map(str, sizes),
                                                "--repeat", str(repeat)],
                             timeout=timeout, echo=False)
        rows += res.report(0)["rows"]
    return rows


def report(rows: list[dict]) -> tuple[str, list[dict]]:
    """The bus-bandwidth table with ring/gloo and PS/gloo ratios, and the ratio records."""
    import helpers

    by = {(r["n"], r["bytes"], r["method"]): r for r in rows}
    table, ratios = [], []
    for n, nbytes in sorted({(r["n"], r["bytes"]) for r in rows}):
        ring, gloo, ps = (by[(n, nbytes, m)]["busbw"] for m in ("ring", "gloo", "ps"))
        mb = nbytes / 2**20
        ratios.append({"n": n, "mb": mb, "ring_over_gloo": ring / gloo, "ps_over_gloo": ps / gloo})
        table.append([n, f"{mb:g}", ring / 1e9, gloo / 1e9, ps / 1e9, ring / gloo, ps / gloo])
    text = helpers.format_table(["N", "MB", "ring GB/s", "gloo GB/s", "PS GB/s", "ring/gloo",
                                 "PS/gloo"], table)
    return text, ratios


def plot(rows: list[dict], path: Path) -> None:
    """Bus bandwidth vs message size, one panel per world size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(ns), figsize=(4.2 * len(ns), 3.2), squeeze=False)
    for ax, n in zip(axes[0], ns):
        for method, label in [("ring", "course ring"), ("gloo", "gloo all_reduce"),
                              ("ps", "parameter server")]:
            pts = sorted((r["bytes"], r["busbw"]) for r in rows if r["n"] == n and r["method"] == method)
            ax.plot([b / 2**20 for b, _ in pts], [v / 1e9 for _, v in pts], "o-", label=label)
        ax.set_xscale("log", base=2)
        mbs = sorted({r["bytes"] / 2**20 for r in rows})
        ax.set_xticks(mbs, [f"{mb:g}" for mb in mbs])
        ax.set_xlabel("message size (MB)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"N = {n} ranks")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="sizes 1 and 16 MB, 3 repeats")
    p.add_argument("--json", type=Path, default=None, help="also write rows and ratios here")
    p.add_argument("--plot", type=Path, default=None,
                   help="the plot (default: ring_allreduce.png beside --json, else in build/bench/)")
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args()
    if a.worker:
        worker(a.sizes, a.repeat)
        return
    if a.quick:
        a.sizes_mb, a.repeat = [1, 16], 3
    print(f"ring all-reduce: sizes {a.sizes_mb} MB float32, N in {a.nprocs}, gloo on CPU, "
          f"median of {a.repeat} interleaved repeats, {os.cpu_count()} cores")
    rows = run(a.sizes_mb, a.nprocs, a.repeat, a.timeout)
    text, ratios = report(rows)
    print(text)
    goal = [r for r in ratios if r["mb"] in GOAL_MB]
    for r in goal:
        ok = r["ring_over_gloo"] >= GOAL
        print(f"RATIO ring/gloo N={r['n']} {r['mb']:g} MB: {r['ring_over_gloo']:.2f}x "
              f"(goal >= {GOAL}x: {'met' if ok else 'NOT met'})")
    if a.plot is None:
        a.plot = (a.json.parent if a.json else ROOT / "build" / "bench") / "ring_allreduce.png"
    plot(rows, a.plot)
    print(f"plot: {a.plot}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "ratios": ratios, "goal": GOAL,
                                      "goal_mb": list(GOAL_MB)}, indent=1))
        print(f"json: {a.json}")


if __name__ == "__main__":
    main()
