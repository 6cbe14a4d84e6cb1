"""A real slow network on one machine: gloo's own all-reduce over a loopback that Linux rate-limits
(tc's token bucket filter, in a private network namespace), against the alpha-beta model and
against helpers.link's dialled ring at the same rate.

Needs root and `unshare`/`tc` (iproute2); prints why not and exits 0 otherwise. The script starts
itself again inside `unshare -n` (a network namespace with only its own loopback), brings `lo` up,
adds `tc qdisc add dev lo root tbf rate RATE`, and launches N gloo ranks there (helpers.launch).
Every byte any rank sends crosses that one loopback, so N ranks share its rate: the model is a link
of RATE / N per rank (`Link.ring_seconds`), which a cluster with one NIC per node does not have.

    python benchmarks/shaped_link.py [--mbit 100] [--ranks 2] [--sizes-mb 2,8] [--repeat 3] [--quick] [--json PATH]

Goal: measured / predicted within 10 % (reported as min/max of the two, goal >= 0.9) for gloo's
all-reduce on the shaped loopback, and for helpers.link's dialled ring on an unshaped one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def worker(mbit: float, sizes: list[int], repeat: int) -> None:
    """One rank: the median over `repeat` calls of the slowest rank's all-reduce time, per size."""
    import torch
    import torch.distributed as dist

    from helpers.link import Link, ring_allreduce
    from helpers.worker import finish, report, start

    me = start("gloo", timeout=120)
    torch.set_num_threads(1)
    shaped = os.environ.get("DPC_SHAPED") == "1"
    dialled = Link(f"{mbit:g} Mb/s", alpha=0.0, bandwidth=mbit * 1e6 / 8)
    rows = []
    for nbytes in sizes:
        times = []
        for i in range(repeat + 1):  # the first call warms up
            buf = torch.ones(nbytes // 4, device="cpu")  # gloo over the loopback: CPU tensors
            dist.barrier()
            t0 = time.monotonic()
            if shaped:
                dist.all_reduce(buf)  # gloo's own collective, over the rate-limited loopback
            else:
                ring_allreduce(buf, dialled)  # helpers.link's ring, each message delayed as the link would
            took = torch.tensor([time.monotonic() - t0], dtype=torch.float64, device="cpu")
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            assert buf[0].item() == me.world_size
            times.append(took.item())
        rows.append({"nbytes": nbytes, "measured": statistics.median(times[1:])})
    if me.rank == 0:
        report(rows=rows)
    finish()


def unavailable() -> str:
    """Why this machine cannot shape its loopback ('' when it can)."""
    if os.geteuid() != 0:
        return "not root (a network namespace and tc need CAP_NET_ADMIN)"
    missing = [t for t in ("unshare", "tc", "ip") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (util-linux, iproute2)"
    done = subprocess.run(["unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit",
                           "burst", "32kb", "latency", "1s"], capture_output=True, text=True)
    return "" if done.returncode == 0 else f"tc in a new network namespace failed: {done.stderr.strip()}"


def options(a: argparse.Namespace) -> list[str]:
    """The options a launch passes on: rate, sizes, repeats."""
    return ["--mbit", str(a.mbit), "--sizes-mb", a.sizes_mb, "--repeat", str(a.repeat)]


def launch_rows(a: argparse.Namespace) -> list[dict]:
    """Rank 0's rows of one launch of the workers on this network namespace's loopback."""
    import helpers

    return helpers.launch(__file__, a.ranks, args=["--worker", *options(a)], timeout=600, echo=False).report(0)["rows"]


def shaped_rows(a: argparse.Namespace) -> list[dict]:
    """Rank 0's rows of a launch inside a new network namespace whose loopback is limited to --mbit."""
    # one shell in the new namespace: loopback up, its rate limited, then this script with --inside
    setup = (f"ip link set lo mtu 1500 up && tc qdisc add dev lo root tbf rate {a.mbit:g}mbit burst 64kb latency 1s && "
             f'exec "$0" "$@"')
    cmd = ["unshare", "-n", "sh", "-c", setup, sys.executable, __file__, "--inside", *options(a), "--ranks", str(a.ranks)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "DPC_SHAPED": "1"})
    if out.returncode != 0:
        raise SystemExit(f"the shaped launch failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbit", type=float, default=100.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes-mb", default="2,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 MB only, 2 repeats")
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(float(s) * (1 << 20)) for s in a.sizes_mb.split(",")]
    if a.worker:
        return worker(a.mbit, sizes, a.repeat)
    if a.inside:  # in the namespace: launch, print rank 0's rows as the last line
        print(json.dumps(launch_rows(a)))
        return None
    if a.quick:
        a.sizes_mb, a.repeat = "2", 2
    why = unavailable()
    if why:
        print(f"shaped loopback: skipped: {why}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"ratios": [], "skipped": why}, f)
        return None
    from helpers.link import Link

    rate = a.mbit * 1e6 / 8  # bytes/s
    per_rank = Link(f"{a.mbit:g} Mb/s loopback shared by {a.ranks} ranks", alpha=0.0, bandwidth=rate / a.ranks)
    dialled = Link(f"{a.mbit:g} Mb/s", alpha=0.0, bandwidth=rate)
    ratios = []
    for name, rows, link in (("gloo all_reduce, tc-shaped loopback", shaped_rows, per_rank),
                             ("helpers.link ring, dialled", launch_rows, dialled)):
        for row in rows(a):
            predicted = link.ring_seconds(a.ranks, row["nbytes"])
            print(f"{name}: {row['nbytes'] / 2**20:g} MiB on {a.ranks} ranks: measured {row['measured']:.3f} s, "
                  f"predicted {predicted:.3f} s ({link.name})")
            ratios.append({"what": f"{name}, {row['nbytes'] / 2**20:g} MiB, {a.ranks} ranks: measured vs predicted, min/max",
                           "ratio": min(predicted, row["measured"]) / max(predicted, row["measured"]), "goal": 0.9})
    for r in ratios:
        print(f"{r['what']}: {r['ratio']:.2f} (goal >= {r['goal']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ratios": ratios}, f, indent=1)
    return None


if __name__ == "__main__":
    main()
