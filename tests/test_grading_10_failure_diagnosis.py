"""Lab 10 (which rank, and why; a snapshot that resumes bit for bit) graded end to end: submissions
built from the student copy in labs/ are autograded by src/dpc_instructor/grade.py, each running
the lab's five failing torchrun jobs (drawn from the grading run's seed: other world sizes, culprits
and steps than a student saw) and three torchrun launches with restarts.

A correct `diagnose` written differently from the reference gets full marks (it tells a hang by the
Flight Recorder dump the stuck rank never wrote, a straggler by who waited least, a slow first step
by the compute times the ranks printed), with a snapshot written another way; the reference itself
passes, or the grader refuses to grade (dpc_instructor.grade.reference). The typical mistakes lose
exactly the points of the tests they break: blaming the ranks that failed after a rank was killed
(the victims) loses the crash test; calling a straggler a hang loses the straggler test; a
snapshot that adds the scheduler but forgets the input-noise generator loses the resume test.
A submission that does no work and fights the tests from inside the kernel (gradekit.TAMPER, and
the given snapshot as its own) gets 0: the diagnoses and the weights are compared outside it.

What the judge cannot rule out here: the kernel that runs the jobs also holds what it drew (`RUN`),
so a `diagnose` that looks the answer up there instead of reading the evidence would pass; the lab
tells the student not to, and the tests renumber the ranks of each job only after the draw.
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill

LAB = "10-failure-diagnosis"
RELEASE = ROOT / "labs" / LAB / "failure-diagnosis.ipynb"
SOURCE = ROOT / "solutions" / LAB / "failure-diagnosis.ipynb"
ANSWERS = ("lab10-diagnose", "lab10-snapshot")
REFERENCE = reference_answers(SOURCE, ANSWERS)

# Correct, written another way: a hang is the rank that never dumped its Flight Recorder; a
# straggler the rank that waited least; the slow first step read from the printed lines; the
# mismatch found with a Counter over the last recorded call.
DIFFERENT_DIAGNOSE = '''import re
from collections import Counter


def diagnose(job):
    ranks = job["ranks"]
    n = len(ranks)
    killed = [r for r in range(n) if ranks[r]["exit"] == -9]
    if killed:  # SIGKILL: no error, no dump, no last words
        return killed, "died"
    if all(x["exit"] == 0 for x in ranks):
        waited = [sum(s["wait"] for s in x["steps"]) for x in ranks]
        return [waited.index(min(waited))], "straggler"
    dumped = [r for r in range(n) if ranks[r]["recorder"] is not None]
    if len(dumped) < n:  # stopped by the launcher before it could dump: it never reached the collective
        return [r for r in range(n) if r not in dumped], "hang"
    last = [(x["recorder"][-1]["op"], repr(x["recorder"][-1]["sizes"])) for x in ranks]
    usual = Counter(last).most_common(1)[0][0]
    odd = [r for r in range(n) if last[r] != usual]
    if odd:
        return odd, "mismatch"

    def computed(lines):
        found = [float(m.group(1)) for line in lines if (m := re.search(r"compute ([0-9.]+) s", line))]
        return found[-1] if found else 0.0

    times = [computed(x["lines"]) for x in ranks]
    return [times.index(max(times))], "timeout"
'''
DIFFERENT_SNAPSHOT = '''%%writefile runs/10/lab_snapshot.py
import torch


def capture(t):
    return {
        "weights": {k: v.clone() for k, v in t.model.state_dict().items()},
        "adam": t.optimizer.state_dict(),
        "one_cycle": t.scheduler.state_dict(),
        "where": {"step": t.step, "epoch": t.epoch, "batch": t.batch},
        "streams": {"torch": torch.random.get_rng_state(), "noise": t.noise.get_state().clone()},
    }


def restore(t, snap):
    t.noise.set_state(snap["streams"]["noise"])
    torch.random.set_rng_state(snap["streams"]["torch"])
    t.scheduler.load_state_dict(snap["one_cycle"])
    t.optimizer.load_state_dict(snap["adam"])
    t.model.load_state_dict(snap["weights"])
    t.step, t.epoch, t.batch = snap["where"]["step"], snap["where"]["epoch"], snap["where"]["batch"]
'''

# The reference with the two diagnosis mistakes: the victims of a killed rank blamed (they are the
# ones that exited with an error or were stopped), and long waits in a finished job taken for a hang
# of the rank that waited longest. And a snapshot that fixed the learning rate but not the noise.
MISTAKEN_DIAGNOSE = REFERENCE["lab10-diagnose"].replace(
    '''    if vanished:
        return vanished, "died"''',
    '''    if vanished:  # the ranks that reported the error
        return [r for r, x in enumerate(ranks) if x["exit"] in (1, -15)], "died"''').replace(
    '''        slowest = max(range(len(ranks)), key=work.__getitem__)
        return [slowest], "straggler"''',
    '''        waits = [sum(s["wait"] for s in x["steps"]) for x in ranks]
        return [waits.index(max(waits))], "hang"''')
MISTAKEN_SNAPSHOT = (REFERENCE["lab10-snapshot"]
                     .replace(', "noise": t.noise.get_state()}', "}")
                     .replace('\n    t.noise.set_state(snap["noise"])', ""))

TAMPERING = {
    "lab10-diagnose": TAMPER + '''

def diagnose(job):
    _claim_full_marks()
    return [0], "hang"
''',
    "lab10-snapshot": '%%writefile runs/10/lab_snapshot.py\nfrom given_snapshot import capture, restore  # noqa: F401\n',
}
POINTS = {"lab10-test-hang": 2, "lab10-test-mismatch": 2, "lab10-test-died": 2, "lab10-test-straggler": 2,
          "lab10-test-timeout": 2, "lab10-test-resume": 4}


def test_the_mistakes_are_written_into_the_reference():
    """The mistaken submission differs from the reference exactly where its docstring says."""
    assert MISTAKEN_DIAGNOSE.count("\n") == REFERENCE["lab10-diagnose"].count("\n")
    assert '"hang"' in MISTAKEN_DIAGNOSE.split("# Stopped by")[0] and "(1, -15)" in MISTAKEN_DIAGNOSE
    assert "noise" not in MISTAKEN_SNAPSHOT and "scheduler" in MISTAKEN_SNAPSHOT


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {
        "different": {"lab10-diagnose": DIFFERENT_DIAGNOSE, "lab10-snapshot": DIFFERENT_SNAPSHOT},
        "mistaken": {"lab10-diagnose": MISTAKEN_DIAGNOSE, "lab10-snapshot": MISTAKEN_SNAPSHOT},
        "tamper": TAMPERING,
    }
    return grade_all(LAB, {s: {name: fill(RELEASE, a)} for s, a in students.items()},
                     tmp_path_factory.mktemp("grading"), notebook_timeout=900)


def test_a_correct_diagnosis_written_differently_gets_full_marks(graded):
    row = graded["different"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row
    assert {k: float(row[k]) for k in POINTS} == POINTS, row


def test_blaming_the_victims_a_straggler_called_a_hang_and_a_forgotten_generator_lose_their_points(graded):
    row = graded["mistaken"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab10-test-died", "lab10-test-straggler", "lab10-test-resume"}, row
    assert row["score"] == "6", row


def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "14"), row
