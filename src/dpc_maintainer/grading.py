"""Grading throughput: students per minute at 1 job and at N jobs, side by side, as a ratio.

    python -m dpc_maintainer.grading [--labs 01-input-pipeline,07-ddp-syncbn] [--students 4] [--jobs N]

Each "student" hands in the lab's reference solution (full marks expected), and the class is graded
exactly as `make grade` does (src/dpc_instructor/grade.py: sandboxed, into a throw-away course gradebook), once
with --jobs 1 and once with --jobs N (default: src/dpc_instructor/grade.py's own default for the lab, at least
2), alternating, --rounds times. Prints the median students/minute of each and their ratio; exit 1
if a student did not get full marks. The machine is shared and noisy: read the ratio, not the times.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dpc_instructor import grade  # its default number of jobs

ROOT = Path(__file__).resolve().parents[2]


def grade_class(lab: str, students: int, jobs: int, tmp: Path) -> tuple[float, list[str]]:
    """Grade `students` copies of lab's solution with `jobs` at a time; (seconds, problems)."""
    subs = tmp / f"subs-{jobs}"
    shutil.rmtree(subs, ignore_errors=True)
    for k in range(students):
        dest = subs / f"student{k:02d}" / lab
        dest.mkdir(parents=True)
        for nb in (ROOT / "solutions" / lab).glob("*.ipynb"):
            shutil.copy(nb, dest / nb.name)
    course, out = tmp / f"course-{jobs}", tmp / f"grades-{jobs}.csv"
    shutil.rmtree(course, ignore_errors=True)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.grade", str(subs), "--lab", lab,
                           "--course", str(course), "--jobs", str(jobs), "--out", str(out)],
                          capture_output=True, text=True)
    took = time.monotonic() - start
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
    a = p.parse_args(argv)
    labs = sorted(d.name for d in (ROOT / "solutions").iterdir() if d.is_dir()) \
        if a.labs == "all" else a.labs.split(",")
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dpc-gradebench-") as tmp:
        for lab in labs:
            n = a.jobs or max(2, grade.default_jobs(lab, a.students))
            rate: dict[int, list[float]] = {1: [], n: []}
            for r in range(a.rounds):
                for jobs in (1, n):
                    took, bad = grade_class(lab, a.students, jobs, Path(tmp))
                    problems += [f"{lab} at {jobs} job(s): {b}" for b in bad]
                    rate[jobs].append(60 * a.students / took)
                    print(f"{lab}: round {r + 1}, {jobs} job(s): {a.students} students in {took:.0f} s "
                          f"({rate[jobs][-1]:.2f}/min)", flush=True)
            one, many = statistics.median(rate[1]), statistics.median(rate[n])
            results.append({"lab": lab, "students": a.students, "jobs": n, "per_min_1": one,
                            "per_min_n": many, "ratio": many / one})
    print(f"\n{'lab':<22} {'students':>8} {'1 job /min':>11} {'N jobs /min':>12} {'N':>3} {'ratio':>6}")
    for row in results:
        print(f"{row['lab']:<22} {row['students']:>8} {row['per_min_1']:>11.2f} {row['per_min_n']:>12.2f} "
              f"{row['jobs']:>3} {row['ratio']:>6.2f}")
    if a.json:
        a.json.write_text(json.dumps({"results": results, "problems": problems}, indent=1))
    for msg in problems:
        print("PROBLEM:", msg)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
