"""Grading spread over SLURM (src/dpc_instructor/spread.py, `grade --slurm`) on the course's real
two-node test cluster (src/dpc_setup/cluster.py), as an instructor would run it.

Four of lab 4's grading submissions (tests/test_grading_04_manual_towers.py: a correct one written
differently, two typical mistakes, one that fights the tests; its other three are graded locally only)
are graded over the cluster with the seed of lab 4's own test, which grades the same submissions on
this machine. Mid-way through the cluster run, node2 is taken down
(`scontrol update ... state=down`, as an administrator or a failure does) while it grades a student:
that command ends with exit 1 naming the students it could not grade; the node comes back; the same
command again grades only those. The course then holds every student once, graded as the local run
grades them (lab 4's LOSES and SCORES: the same points, 'graded', the run's seed). Each task takes a whole node (--exclusive): one student per node.

Skipped, with the reason, where no cluster or no sandbox can run (not root, no slurm-wlm/munge, no
bubblewrap).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_grading_04_manual_towers as lab4
from gradekit import lost, write_submissions

from dpc_runtime import sandbox
from dpc_setup import cluster as tool

pytestmark = pytest.mark.full  # the full tier: the SLURM spread with a node lost (tests/tiers.py)

WHY = tool.unavailable() or sandbox.unavailable()
if WHY:
    pytest.skip(f"no SLURM cluster or sandbox here: {WHY}", allow_module_level=True)

# Lab 4's seed (its reference is run once for the suite: tests/conftest.py's DPC_REFERENCES).
SEED = str(lab4.grading_seed())
LIMITS = ("--cell-timeout", "60", "--notebook-timeout", "400", "--parameters", "ci", "--seed", SEED)
STUDENTS = {"correct": lab4.CORRECT, "summing": lab4.SUMMING, "own-variables": lab4.OWN_VARIABLES,
            "tamper": lab4.TAMPERING}


def rows(path: Path) -> dict[str, dict[str, str]]:
    """The CSV's rows by student, without the notes (they name where a job ran)."""
    with path.open(encoding="utf-8") as f:
        return {r["student"]: {k: v for k, v in r.items() if k != "notes"} for r in csv.DictReader(f)}


def on_node(c: tool.Cluster, node: str) -> bool:
    """True when a task of a grading job is running on node."""
    out = c.run("squeue", "-h", "-r", "-n", f"dpc-grade-{lab4.LAB}", "-t", "R", "-o", "%N", check=False)
    return node in out.split()


def test_a_class_graded_over_slurm_with_a_node_lost_mid_run_equals_the_local_run(tmp_path):
    submissions = write_submissions(tmp_path / "submissions", lab4.LAB,
                                    {s: {lab4.RELEASE.name: lab4.submission(a)} for s, a in STUDENTS.items()})
    course, out = tmp_path / "course", tmp_path / "grades.csv"
    argv = [sys.executable, "-m", "dpc_instructor.grade", str(submissions), "--lab", lab4.LAB, "--out", str(out),
            "--course", str(course), *LIMITS, "--slurm", "--sbatch=--exclusive"]
    with tool.cluster() as c:
        env = c.env  # and the session's DPC_REFERENCES
        first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        end = time.monotonic() + 900
        while not on_node(c, "node2"):  # the event: a student is being graded on node2
            assert first.poll() is None and time.monotonic() < end, "no task ever ran on node2"
            time.sleep(0.5)
        c.run("scontrol", "update", "nodename=node2", "state=down", "reason=dpc-test: a node lost mid-run")
        said, _ = first.communicate(timeout=1800)
        print(said)
        assert first.returncode == 1, said
        dropped = [r["student"] for r in rows(out).values() if "SLURM task ended without a result" in r["status"]]
        assert dropped, said
        assert f"{len(dropped)} student(s) not graded because their task ended without a result" in said

        # Back in service (ReturnToService=2 may have done it when its slurmd registered again).
        c.run("scontrol", "update", "nodename=node2", "state=resume", check=False)
        back = time.monotonic() + 300
        while c.sinfo().get("node2") not in {"idle", "mix", "alloc"}:
            assert time.monotonic() < back, f"node2 did not come back: {c.sinfo()}"
            time.sleep(0.5)
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        print(second.stdout, second.stderr)
        assert second.returncode == 0, second.stdout + second.stderr
        assert f"{len(STUDENTS) - len(dropped)} already graded, {len(dropped)} submitted" in second.stdout
        graded_again = [ln.split(":")[0].strip() for ln in second.stdout.splitlines() if " / 14 " in ln]
        assert sorted(graded_again) == sorted(dropped), "only the lost students are graded again"
    graded = rows(out)
    assert sorted(graded) == sorted(STUDENTS)
    for student, row in graded.items():
        assert (row["status"], row["score"], row["seed"]) == ("graded", lab4.SCORES[student], SEED), row
        if student in lab4.LOSES:
            assert lost(row) == lab4.LOSES[student], row
    statuses = json.loads((course / "status.json").read_text())
    assert sorted(statuses) == sorted(r["grader_id"] for r in graded.values())
    assert all(s[lab4.LAB]["graded"] for s in statuses.values())
    progress = json.loads(next((course / "spread").glob("*/progress.json")).read_text())
    assert (progress["total"], progress["done"], progress["failed"]) == (len(STUDENTS), len(STUDENTS), 0)
