"""Lab 10 (which rank, and why; a snapshot that resumes bit for bit) graded end to end: submissions
built from the student copy in labs/ are autograded by src/dpc_instructor/grade.py, each running
the lab's five failing torchrun jobs (the ones a student saw) and three torchrun launches with
restarts; the hidden tests run each `diagnose` on 22 jobs the grader launched itself, outside every
kernel (grade.make_cases), of which the kernel gets the evidence only: one of each kind drawn from the
run's seed and the lab's six EDGE_JOBS (a hang, a mismatch and a death at the first step and at the
last, rank 0 and the last rank), each as it ran and renumbered, in an order drawn from the seed.

A correct `diagnose` written differently from the reference gets full marks (it tells a hang by the
Flight Recorder dump the stuck rank never wrote, a straggler by who waited least, a slow first step
by the compute times the ranks printed), with a snapshot written another way; the reference itself
passes, or the grader refuses to grade (dpc_instructor.grading.reference.reference). The typical mistakes lose
exactly the points of the tests they break: blaming the ranks that failed after a rank was killed
(the victims) loses the crash test; calling a straggler a hang loses the straggler test; a
snapshot that adds the scheduler but forgets the input-noise generator loses the resume test, and
its message names the first step that differs in every attempt's steps (the first restart's, not the
last attempt's: issue 58). Two mistakes that only the edge jobs catch (issue 59): a hang told by the
rank whose last reported step is behind (`steps[-1]`: a rank stuck at the first step reported none)
loses the hang test, and "finished" told by every rank having reported every step (a mismatch at the
last step reports every step too) loses the mismatch test.
A submission that does no work and fights the tests from inside the kernel (gradekit.TAMPER, and
the given snapshot as its own) gets 0: the diagnoses and the weights are compared outside it.

One that does no diagnosis and reads the answers off (issue 36) gets none of the diagnosis points:
its `diagnose` reads its callers' frames (the visible test's locals hold the culprit and kind; no
frame above a hidden test does), and failing that redraws the grader's jobs with the lab's own
`graders_specs` (the drawn jobs and the edge jobs, in the drawn order) from the seed in its
environment (the kernel has none: it draws this notebook's own order) and finds each job it is given
in the grader's file. It keeps the snapshot's points.

What the judge cannot rule out here: the visible jobs are drawn in the kernel (`RUN`), so a visible
test can be passed by looking the answer up; each test cell's points also need its hidden part.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill, tiered

from dpc_runtime import notebook

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
# What that snapshot is told (CRASHES: the kernel's rng() draws 0, so rank 1 dies at steps 13 and 26;
# the snapshots before them are at steps 10 and 25): the first difference is at the first restart's
# first step, not at the last attempt's (step 25, what the test said before issue 58), and the message
# says which steps of which attempt were compared.
RESUME_MESSAGE = re.compile(
    r"^the first step that differs from the uninterrupted run: step 10, in attempt 1: lr, loss \(\S+, \S+\) "
    r"instead of \(\S+, \S+\)\. Compared: every step each attempt trained \(attempt 0: steps 0-12; attempt 1, "
    r"after rank 1 died at step 13: steps 10-25; attempt 2, after rank 1 died at step 26: steps 25-\d+\)\.$")

# Right on every drawn job, wrong only on the edge jobs: a hang told by the rank whose last reported step
# is behind the others' (a rank stuck at the very first step reported no step: IndexError), and a job
# taken for finished when every rank reported every step (a mismatch at the last step reported all of
# them too: called a straggler).
EDGE_MISTAKES = REFERENCE["lab10-diagnose"].replace(
    'if all(x["exit"] == 0 for x in ranks):',
    'if all(len(x["steps"]) == STEPS for x in ranks):  # every rank got through every step').replace(
    '''    stuck = [r for r, x in enumerate(ranks) if x["stack"] and x["stack"][0][0] == "faulty.py"]
    if stuck:
        return stuck, "hang"''',
    '''    done = [x["steps"][-1]["step"] for x in ranks]  # the stuck rank is a step behind
    if len(set(done)) > 1:
        return [done.index(min(done))], "hang"''')

TAMPERING = {
    "lab10-diagnose": TAMPER + '''

def diagnose(job):
    _claim_full_marks()
    return [0], "hang"
''',
    "lab10-snapshot": '%%writefile runs/10/lab_snapshot.py\nfrom given_snapshot import capture, restore  # noqa: F401\n',
}
# No diagnosis, two ways to read the answers off, tried in turn (one submission: either that worked
# would earn a hidden point). First the frames of the test that called (the visible test's `culprit`
# and `kind`; before issue 36 a hidden test held the answer as `want` too). Then this run's jobs
# looked up in RUN, and the grader's redrawn with the lab's own graders_specs from the grading seed in
# the environment (rng()'s default, 0, without one), each found by its evidence in the grader's file
# (hidden_cases gives each job as it ran, then renumbered by 1). Else a guess.
LOOKER = '''import inspect
import json
import os
from pathlib import Path

import numpy as np


def _from_frames():
    frame = inspect.currentframe().f_back.f_back
    while frame is not None:
        seen = frame.f_locals
        if isinstance(seen.get("want"), tuple):
            return seen["want"]
        if "culprit" in seen and "kind" in seen:
            return [seen["culprit"]], seen["kind"]
        frame = frame.f_back
    return None


def diagnose(job):
    found = _from_frames()
    if found is not None:
        return found
    for name, (kind, world, culprit, _) in RUN.items():
        for shift in range(world):
            if renumbered(JOBS[name], shift) == job:
                return [(culprit + shift) % world], kind
    specs = graders_specs(np.random.default_rng(int(os.environ.get("DPC_GRADE_SEED", "0"))))
    cases = json.loads(Path("hidden-cases.json").read_text()) if Path("hidden-cases.json").exists() else []
    if job in cases:
        i = cases.index(job)
        kind, world, culprit, _ = specs[i // 2]
        return [(culprit + i % 2) % world], kind
    return [0], "hang"
'''
DIAGNOSIS_TESTS = {"lab10-test-hang", "lab10-test-mismatch", "lab10-test-died", "lab10-test-straggler",
                   "lab10-test-timeout"}


def graders_specs(seed: int) -> list[tuple]:
    """The lab's own graders_specs (its locked cell lab10-draw: the drawn jobs and the edge jobs, in a
    drawn order) with numpy's generator of seed, with the grader's parameters (STEPS: course.yml's ci
    values leave it at the default)."""
    import numpy as np

    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(SOURCE.read_text())["cells"]}
    space: dict = {}
    exec(cells["lab10-parameters"], space)
    exec(cells["lab10-draw"], space)
    return space["graders_specs"](np.random.default_rng(seed))


def redrawn_by_chance(seed: int) -> bool:
    """Whether the redrawer's answers (this notebook's own draw, 0) would be right by chance for every
    one of the grader's jobs of some kind at this seed (at each of that kind's places in the drawn
    order, the same kind and culprit, as it ran and renumbered by 1): that kind's test would pass."""
    grader, own = graders_specs(seed), graders_specs(0)

    def right(h: tuple, r: tuple) -> bool:
        return h[0] == r[0] and all((h[2] + s) % h[1] == (r[2] + s) % r[1] for s in (0, 1))

    return any(all(right(h, r) for h, r in zip(grader, own) if h[0] == kind) for kind in {h[0] for h in grader})


def grading_seed() -> int:
    """The session's seed of the hidden cases, or the next one at which the redrawer cannot be right
    by chance (so that its score says only whether the seed reached its kernel)."""
    seed = int(os.environ["DPC_GRADE_SEED"])
    while redrawn_by_chance(seed):
        seed += 1
    return seed


POINTS = {"lab10-test-hang": 2, "lab10-test-mismatch": 2, "lab10-test-died": 2, "lab10-test-straggler": 2,
          "lab10-test-timeout": 2, "lab10-test-resume": 4}


@pytest.mark.gate
def test_the_mistakes_are_written_into_the_reference():
    """The mistaken submissions differ from the reference exactly where their comments say."""
    assert MISTAKEN_DIAGNOSE.count("\n") == REFERENCE["lab10-diagnose"].count("\n")
    assert '"hang"' in MISTAKEN_DIAGNOSE.split("# Stopped by")[0] and "(1, -15)" in MISTAKEN_DIAGNOSE
    assert "noise" not in MISTAKEN_SNAPSHOT and "scheduler" in MISTAKEN_SNAPSHOT
    assert EDGE_MISTAKES.count("\n") == REFERENCE["lab10-diagnose"].count("\n")
    assert 'len(x["steps"]) == STEPS' in EDGE_MISTAKES and 'x["steps"][-1]["step"]' in EDGE_MISTAKES
    assert '"faulty.py"' not in EDGE_MISTAKES


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The grading run's folder; its course gradebook (with each student's graded notebook) in course/."""
    return tmp_path_factory.mktemp("grading")


@pytest.fixture(scope="module")
def graded(request, work) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = tiered(request, {
        "different": {"lab10-diagnose": DIFFERENT_DIAGNOSE, "lab10-snapshot": DIFFERENT_SNAPSHOT},
        "mistaken": {"lab10-diagnose": MISTAKEN_DIAGNOSE, "lab10-snapshot": MISTAKEN_SNAPSHOT},
    }, {
        "tamper": TAMPERING,
        "looker": {"lab10-diagnose": LOOKER, "lab10-snapshot": DIFFERENT_SNAPSHOT},
        "edges": {"lab10-diagnose": EDGE_MISTAKES, "lab10-snapshot": REFERENCE["lab10-snapshot"]},
    })
    return grade_all(LAB, {s: {name: fill(RELEASE, a)} for s, a in students.items()}, work,
                     course=work / "course", notebook_timeout=900, args=("--seed", str(grading_seed())))


def errors_of(work: Path, row: dict[str, str], grade_id: str) -> dict[str, str]:
    """The errors the student's graded notebook shows in test cell grade_id, by name: the kernel's own
    (an assert of the cell: AssertionError) and the judge's on the records (GraderCheck)."""
    nb = json.loads((work / "course" / "autograded" / row["grader_id"] / LAB / RELEASE.name).read_text())
    cell = next(c for c in nb["cells"] if notebook.grade_id(c) == grade_id)
    return {o["ename"]: o["evalue"] for o in cell.get("outputs", []) if o.get("output_type") == "error"}


@pytest.mark.gate
def test_a_correct_diagnosis_written_differently_gets_full_marks(graded):
    row = graded["different"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row
    assert {k: float(row[k]) for k in POINTS} == POINTS, row


@pytest.mark.gate
def test_blaming_the_victims_a_straggler_called_a_hang_and_a_forgotten_generator_lose_their_points(graded):
    row = graded["mistaken"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab10-test-died", "lab10-test-straggler", "lab10-test-resume"}, row
    assert row["score"] == "6", row


@pytest.mark.gate
def test_a_wrong_resume_is_told_the_first_step_that_differs_in_every_attempt(graded, work):
    """Issue 58: the forgotten noise generator drifts from the first restart on (step 10, attempt 1); the
    test once compared only the last attempt's steps and said "differs from step 25"."""
    errors = errors_of(work, graded["mistaken"], "lab10-test-resume")
    assert RESUME_MESSAGE.match(errors.get("AssertionError", "")), errors


@pytest.mark.full
def test_mistakes_only_the_edge_jobs_catch_lose_their_points(graded, work):
    """Issue 59: a hang at the first step and a mismatch at the last are the grader's fixed edge jobs; the
    drawn steps (1 to STEPS - 2) never reach them, so this answer passed every test before."""
    row = graded["edges"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab10-test-hang", "lab10-test-mismatch"} and row["score"] == "10", row
    errors = errors_of(work, row, "lab10-test-hang")  # the visible hang (a drawn step) is diagnosed right:
    assert list(errors) == ["GraderCheck"], errors   # only the judge of the hidden records fails it


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "14"), row


@pytest.mark.full
def test_a_diagnose_that_reads_its_callers_frames_or_redraws_the_graders_jobs_gets_no_diagnosis_points(graded):
    """Its visible parts pass (the visible test holds the answer), its hidden parts cannot: no frame
    above diagnose holds a hidden job's culprit or kind, and the kernel has no seed to redraw the
    grader's jobs from (its rng() draws this notebook's own jobs); the snapshot keeps its 4 points."""
    row = graded["looker"]
    assert row["status"] == "graded", row
    assert lost(row) == DIAGNOSIS_TESTS and row["score"] == "4", row


@pytest.mark.gate
def test_the_redrawer_would_pass_with_the_seed_and_not_by_chance_without():
    """The redrawer is a real attack: with the grader's seed its draw is the grader's (hidden_cases
    draws its jobs with draw_jobs, then gives each as it ran and renumbered by 1); grading_seed
    rules out a chance match with the notebook's own draw."""
    source = next("".join(c["source"]) for c in json.loads(SOURCE.read_text())["cells"] if c.get("id") == "lab10-draw")
    assert "specs = graders_specs(draw)" in source and "for shift in (0, 1)]" in source
    seed = grading_seed()
    assert not redrawn_by_chance(seed) and redrawn_by_chance(0)
