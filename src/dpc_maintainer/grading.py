"""Grading throughput: students per minute at 1 job and at N jobs, side by side, as a ratio; with
--slurm also over the course's two-node test cluster (src/dpc_setup/cluster.py), at 1 and N tasks.

    python -m dpc_maintainer.grading [--labs 01-input-pipeline,07-ddp-syncbn] [--students 4] [--jobs N]
                                     [--slurm]

Each "student" hands in the lab's reference solution (full marks expected), and the class is graded
exactly as `make grade` does (src/dpc_instructor/grade.py: sandboxed, into a throw-away course gradebook), once
with --jobs 1 and once with --jobs N (default: the grader's own default for the lab,
dpc_instructor.grading.run.default_jobs, at least 2), alternating, --rounds times; --slurm adds `grade --slurm` with --max-running 1 and N. The rate is
the grader's own (its last line: students after the reference run, which is made once and shared).
Prints the median students/minute of each and their ratios, and SLURM's cost per student (1 task at
a time against 1 job at a time); exit 1 if a student did not get full marks. The machine is shared
and noisy: read the ratios, not the times. Both cluster nodes are this machine: the cluster's rate
shows the cost of spreading, not a speed-up.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dpc_instructor.grading.run import default_jobs  # the grader's default number of jobs
from dpc_setup import cluster  # the two-node test cluster (--slurm)

ROOT = Path(__file__).resolve().parents[2]


RATE = re.compile(r"^graded (\d+) in (\d+) s", re.M)  # the grader's last line: after its reference run


def grade_class(lab: str, students: int, jobs: int, tmp: Path,
                slurm: dict[str, str] | None = None) -> tuple[float, list[str]]:
    """Grade `students` copies of lab's solution with `jobs` at a time (over SLURM: `slurm` is the
    cluster's environment, `jobs` tasks at once); (seconds the students took, problems)."""
    subs = tmp / "subs"
    if not subs.exists():
        for k in range(students):
            dest = subs / f"student{k:02d}" / lab
            dest.mkdir(parents=True)
            for nb in (ROOT / "solutions" / lab).glob("*.ipynb"):
                shutil.copy(nb, dest / nb.name)
    tag = f"{'slurm' if slurm else 'local'}-{jobs}"
    course, out = tmp / f"course-{tag}", tmp / f"grades-{tag}.csv"
    shutil.rmtree(course, ignore_errors=True)
    argv = [sys.executable, "-m", "dpc_instructor.grade", str(subs), "--lab", lab, "--course", str(course),
            "--out", str(out), "--seed", "1"]
    argv += ["--slurm", f"--max-running={jobs}"] if slurm else ["--jobs", str(jobs)]
    env = {**(slurm or os.environ), "DPC_REFERENCES": str(tmp / "references")}  # one reference run per lab
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    took = time.monotonic() - start
    said = RATE.search(done.stdout)
    if said:
        took = float(said.group(2))
    if done.returncode != 0:
        return took, [f"grade.py exited {done.returncode}: {done.stderr[-500:]}"]
    with out.open() as f:
        rows = list(csv.DictReader(f))
    bad = [f"{r['student']}: {r['score']}/{r['max_score']} {r['status']}" for r in rows
           if r["status"] != "graded" or r["score"] != r["max_score"]]
    return took, bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labs", default="01-input-pipeline")
    p.add_argument("--students", type=int, default=4)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--slurm", action="store_true", help="also over a two-node test cluster (root, slurm-wlm)")
    a = p.parse_args(argv)
    if a.slurm and cluster.unavailable():
        raise SystemExit(f"grading: --slurm: no cluster here: {cluster.unavailable()}")
    with cluster.cluster() if a.slurm else contextlib.nullcontext() as c:
        return measure(a, c.env if c else None)


def measure(a: argparse.Namespace, slurm: dict[str, str] | None) -> int:
    """The benchmark's rounds and table (slurm: the test cluster's environment, or None)."""
    labs = sorted(d.name for d in (ROOT / "solutions").iterdir() if d.is_dir()) \
        if a.labs == "all" else a.labs.split(",")
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    for lab in labs:
        with tempfile.TemporaryDirectory(prefix="dpc-gradebench-") as tmp:
            n = a.jobs or max(2, default_jobs(lab, a.students))
            ways = [("local", 1), ("local", n)] + ([("slurm", 1), ("slurm", n)] if slurm else [])
            rate: dict[tuple[str, int], list[float]] = {w: [] for w in ways}
            for r in range(a.rounds):
                for where, jobs in ways:
                    took, bad = grade_class(lab, a.students, jobs, Path(tmp), slurm if where == "slurm" else None)
                    problems += [f"{lab} {where} at {jobs}: {b}" for b in bad]
                    rate[where, jobs].append(60 * a.students / max(took, 1.0))
                    print(f"{lab}: round {r + 1}, {where}, {jobs} at once: {a.students} students in {took:.0f} s "
                          f"({rate[where, jobs][-1]:.2f}/min)", flush=True)
            med = {w: statistics.median(v) for w, v in rate.items()}
            row: dict[str, Any] = {"lab": lab, "students": a.students, "jobs": n, "per_min_1": med["local", 1],
                                   "per_min_n": med["local", n], "ratio": med["local", n] / med["local", 1]}
            if slurm:
                row.update(slurm_per_min_1=med["slurm", 1], slurm_per_min_n=med["slurm", n],
                           slurm_vs_local_n=med["slurm", n] / med["local", n],
                           slurm_s_per_student=60 / med["slurm", 1] - 60 / med["local", 1])
            results.append(row)
    print(f"\n{'lab':<22} {'students':>8} {'1 job /min':>11} {'N jobs /min':>12} {'N':>3} {'ratio':>6}")
    for row in results:
        print(f"{row['lab']:<22} {row['students']:>8} {row['per_min_1']:>11.2f} {row['per_min_n']:>12.2f} "
              f"{row['jobs']:>3} {row['ratio']:>6.2f}")
    if slurm:
        print(f"\n{'lab':<22} {'SLURM 1 /min':>12} {'SLURM N /min':>13} {'SLURM N / local N':>18} "
              f"{'SLURM s/student':>16}")
        for row in results:
            print(f"{row['lab']:<22} {row['slurm_per_min_1']:>12.2f} {row['slurm_per_min_n']:>13.2f} "
                  f"{row['slurm_vs_local_n']:>18.2f} {row['slurm_s_per_student']:>16.1f}")
    if a.json:
        a.json.write_text(json.dumps({"results": results, "problems": problems}, indent=1))
    for msg in problems:
        print("PROBLEM:", msg)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
