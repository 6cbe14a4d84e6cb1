"""Every benchmark of the course in one run, then one table of the ratios against their goals.

    python -m dpc_maintainer.run_all [--quick] [--only NAME] [--strict] [--out build/bench] [--summary-only]

`make bench` runs this. Each benchmark is its own script (run here one after the other, in a
child process, so one crash does not hide the others) that prints its own table and writes its
results as JSON into OUT. This script then prints the ratios side by side with the goals for a
2-core CPU box, draws the all-reduce bus bandwidth of the course's ring, gloo and Horovod on one
plot, and writes OUT/summary.md and OUT/summary.json. Absolute times are only reported; the
exit status is 1 if a benchmark failed to run, and with --strict also if a goal was not met.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"  # the benchmark scripts this runs side by side
# name: (script, extra arguments). Order: cheap and independent first.
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "input_pipeline": ("input_pipeline.py", []),
    "ring_allreduce": ("ring_allreduce.py", []),
    "hvd_allreduce": ("hvd_allreduce.py", []),
    "ddp_scaling": ("ddp_scaling.py", []),
    "ddp_overlap": ("ddp_overlap.py", []),
    "shaped_link": ("shaped_link.py", []),
    "mirrored": ("mirrored.py", []),
}


def run_one(name: str, out: Path, quick: bool, timeout: float) -> tuple[dict | None, str]:
    """Run one benchmark script; return its JSON (None on failure) and a one-line status."""
    script, extra = BENCHMARKS[name]
    path = out / f"{name}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(BENCH / script), "--json", str(path), *extra] + (["--quick"] if quick else [])
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    took = time.monotonic() - start
    if done.returncode != 0:
        return None, f"failed (exit {done.returncode}) after {took:.0f} s"
    if not path.exists():
        return None, f"wrote no {path.name}"
    return json.loads(path.read_text()), f"ran in {took:.0f} s"


def ratio_rows(name: str, data: dict) -> list[dict]:
    """The ratios a benchmark reports, as rows {benchmark, what, ratio, goal}."""
    if name == "ring_allreduce":
        rows = []
        for r in data["ratios"]:
            if r["mb"] in data.get("goal_mb", (16, 64)):
                rows.append({"benchmark": name, "what": f"course ring / gloo, {r['n']} ranks, {r['mb']:g} MB",
                             "ratio": r["ring_over_gloo"], "goal": data.get("goal", 0.8)})
                rows.append({"benchmark": name, "what": f"parameter server / gloo, {r['n']} ranks, {r['mb']:g} MB",
                             "ratio": r["ps_over_gloo"], "goal": None})
        return rows
    if name == "hvd_allreduce":
        by = {(r["library"], r["ranks"], r["mbytes"]): r["busbw_GBps"] for r in data["rows"]}
        return [{"benchmark": name, "what": f"Horovod / torch.distributed (gloo), {n} ranks, {mb:g} MB",
                 "ratio": bw / by[("torch.distributed", n, mb)], "goal": None}
                for (lib, n, mb), bw in sorted(by.items()) if lib == "horovod" and mb >= 16]
    if name == "ddp_scaling":
        return [{"benchmark": name, "what": "DDP samples/s, 2 single-thread ranks / 1 rank",
                 "ratio": data["speedup_2_vs_1"], "goal": data.get("goal", 1.7)},
                {"benchmark": name, "what": "2 independent processes / 1 (what the machine allows)",
                 "ratio": data["ceiling_2_independent"], "goal": None}]
    return [{"benchmark": name, "what": r["what"], "ratio": r["ratio"], "goal": r.get("goal")}
            for r in data.get("ratios", [])]


def bandwidth_curves(results: dict[str, dict]) -> list[tuple[str, int, list[float], list[float]]]:
    """(label, ranks, sizes in MB, bus bandwidth in GB/s) of every all-reduce measured."""
    curves = []
    ring = results.get("ring_allreduce")
    if ring:
        labels = {"ring": "course ring", "gloo": "gloo all_reduce", "ps": "parameter server"}
        for method, label in labels.items():
            for n in sorted({r["n"] for r in ring["rows"]}):
                pts = sorted((r["bytes"] / 2**20, r["busbw"] / 1e9) for r in ring["rows"]
                             if r["n"] == n and r["method"] == method)
                curves.append((label, n, [p[0] for p in pts], [p[1] for p in pts]))
    hvd = results.get("hvd_allreduce")
    if hvd:
        for n in sorted({r["ranks"] for r in hvd["rows"]}):
            pts = sorted((r["mbytes"], r["busbw_GBps"]) for r in hvd["rows"]
                         if r["ranks"] == n and r["library"] == "horovod")
            curves.append(("Horovod allreduce (gloo, own run)", n, [p[0] for p in pts],
                           [p[1] for p in pts]))
    return curves


def plot_bandwidth(results: dict[str, dict], out: Path) -> Path | None:
    """Bus bandwidth vs message size for every all-reduce measured, one panel per rank count."""
    curves = bandwidth_curves(results)
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({c[1] for c in curves})
    fig, axes = plt.subplots(1, len(ranks), figsize=(5 * len(ranks), 3.6), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        for label, nprocs, sizes, bw in curves:
            if nprocs == n:
                ax.plot(sizes, bw, marker="o", label=label)
        ax.set(xscale="log", xlabel="message size (MB)", ylabel="bus bandwidth (GB/s)",
               title=f"all-reduce, {n} ranks")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "allreduce_busbw.png"
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats (a few minutes)")
    ap.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run only these")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is not met")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    ap.add_argument("--summary-only", action="store_true",
                    help="run nothing: summarise the JSON results already in OUT")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.only or list(BENCHMARKS)
    results: dict[str, dict] = {}
    status: dict[str, str] = {}
    for name in names:
        if a.summary_only:
            path = a.out / f"{name}.json"
            data = json.loads(path.read_text()) if path.exists() else None
            status[name] = "results of an earlier run" if data else f"no {path.name}"
        else:
            data, status[name] = run_one(name, a.out, a.quick, a.timeout)
        if data is not None:
            results[name] = data
    rows = [row for name in names if name in results for row in ratio_rows(name, results[name])]
    plot = plot_bandwidth(results, a.out)
    lines = ["| benchmark | ratio | measured | goal (2-core CPU box) |", "|---|---|---|---|"]
    for r in rows:
        goal = r["goal"]
        verdict = "-" if goal is None else (f">= {goal}x: met" if r["ratio"] >= goal else f">= {goal}x: NOT met")
        lines.append(f"| {r['benchmark']} | {r['what']} | {r['ratio']:.2f}x | {verdict} |")
    lines += ["", *(f"- {name}: {status[name]}" for name in names)]
    if plot:
        lines.append(f"- plot: {plot.relative_to(ROOT) if plot.is_relative_to(ROOT) else plot}")
    text = "\n".join(lines)
    print("\n=== summary (medians; ratios measured side by side in one run)\n" + text)
    (a.out / "summary.md").write_text(text + "\n")
    (a.out / "summary.json").write_text(json.dumps({"ratios": rows, "status": status}, indent=2))
    failed = [n for n in names if n not in results]
    unmet = [r for r in rows if r["goal"] is not None and r["ratio"] < r["goal"]]
    if failed:
        print(f"bench: failed to run: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or (a.strict and unmet) else 0


if __name__ == "__main__":
    sys.exit(main())
