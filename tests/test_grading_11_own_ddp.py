"""Lab 11 (your own DDP: buckets, overlap, the global mean) graded end to end: submissions built from
the student copy in labs/ are autograded by src/dpc_instructor/grade.py, each training with the
student's wrapper in real torchrun launches on 2 and 3 ranks, with even and uneven samples per rank.

A correct submission written differently from the reference gets full marks (a plan built with a
running total, a wrapper that counts ready gradients with sets, divides each bucket by the world size
before its all-reduce, as PyTorch's default comm hook does, and finishes the mean in finish(), a
prediction written as a fold): the schedule test judges what each all-reduce carried up to one factor
per step (issue 58: a pre-dividing wrapper got 9/12 after its visible cell had printed OK). The
reference itself passes, or the grader refuses to grade (dpc_instructor.grading.reference.reference).
The typical mistakes lose exactly their points: a wrapper that all-reduces every bucket in finish(),
after backward, trains the right weights and loses the schedule test (its ledger shows the calls after
backward returned); dividing by the world size times this rank's samples is right only when every
rank has as many, and loses the uneven test, whose message names the global sample count. A plan
filled from the first parameter instead of the last loses the buckets and prediction tests and
nothing else: its wrapper trains the right weights and all-reduces each of its own buckets during
backward, and the schedule test judges the ledger against the student's own plan. A plan that closes
a bucket only past the cap (`>` for `>=`) loses the plan test (a visible case reaches the cap
exactly) and the prediction test (every draw of the hidden cases holds predict cases whose buckets
reach the cap exactly, where the step time differs), and nothing else.
A submission that does no work and fights the tests from inside the kernel (gradekit.TAMPER, a
fake launch whose ledger has the right buckets, a plan and a prediction that know only the visible
cases) gets 0: the judge compares the values outside the kernel, and the schedule's record carries
the weights trained in the same launch.

The ledger is held by its reader (issues 36 and 54): the worker's comm and the worker send each
all-reduce and each backward() as it happens over a loopback connection to the kernel that launched
them (the locked cell lab11-run opens a port per launch), which keeps the lines in its memory; the
test reads them there, not what the launch reported, and refuses a ledger that a second connection
also claimed to be rank 0's or that goes on after the worker closed it. Forgers that all-reduce after
backward (the honest mistake, 9/12) and then rewrite every ledger they can reach lose the schedule
test and nothing else: the comm's, as the worker kept it before, and what rank 0 reported, through a
wrapped helpers.launch in the kernel (both passed before issue 36); a thread of rank 0 that, the
moment the worker's ledger is closed, sends a forged one on a connection of its own and writes the
file the ledger once was (the other ranks wait for it before their last barrier); and a plain child
of rank 0 that does the same the instant rank 0 has exited (the last two got 12/12 while the ledger
was a file in the student's folder, issue 54). What still rests on the student's own processes: a
rank that rebinds the locked worker's own Ledger or Comm, or writes on its connection, in its own
process, and kernel code that rebinds the test's own harness.

The hidden plan and prediction cases are made outside the kernel (the locked cell lab11-draw's
hidden_cases; dpc_instructor.grading.cases.make_cases): the kernel has no DPC_GRADE_SEED. Redrawing them is no
attack on this lab (a drawn case is not its own answer: sizes and a cap do not tell the plan), so the
forger instead shows that the seed is out of reach: its plan breaks itself (losing the plan and
prediction tests) if the kernel's environment, its folder, its home or its /tmp holds the run's seed
or the cases' truth.
"""
from __future__ import annotations

import os
import re

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill, tiered

from dpc_instructor import gradebook, report

LAB = "11-own-ddp"
RELEASE = ROOT / "labs" / LAB / "own-ddp.ipynb"
SOURCE = ROOT / "solutions" / LAB / "own-ddp.ipynb"
ANSWERS = ("lab11-plan", "lab11-ddp", "lab11-predict")
REFERENCE = reference_answers(SOURCE, ANSWERS)
POINTS = {"lab11-test-plan": 2, "lab11-test-weights": 3, "lab11-test-uneven": 2, "lab11-test-schedule": 3,
          "lab11-test-predict": 2}

DIFFERENT = {
    "lab11-plan": '''%%writefile runs/11/own_plan.py
from itertools import accumulate


def plan_buckets(sizes, cap):
    order = list(range(len(sizes)))[::-1]
    plan = []
    while order:
        totals = list(accumulate(sizes[i] for i in order))
        k = next((j + 1 for j, t in enumerate(totals) if t >= cap), len(order))
        plan.append(order[:k])
        order = order[k:]
    return plan
''',
    "lab11-ddp": '''%%writefile runs/11/own_ddp.py
import torch
import torch.distributed as dist
from own_plan import plan_buckets


class OwnDDP:
    def __init__(self, model, cap, comm):
        self.comm, self.world = comm, dist.get_world_size()
        self.params = list(model.parameters())
        self.plan = plan_buckets([p.numel() * p.element_size() for p in self.params], cap)
        self.ready = set()
        self.flying = []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    def _hook(self, i):
        def on_ready(param):
            self.ready.add(i)
            for members in self.plan:
                if i in members and self.ready.issuperset(members):
                    flat = torch.cat([self.params[j].grad.flatten() for j in members]) / self.world
                    self.flying.append((members, flat, self.comm.all_reduce(flat)))  # sums the shares
        return on_ready

    def finish(self, count):
        n = torch.tensor([count], dtype=torch.float64)
        dist.all_reduce(n)
        for members, flat, handle in self.flying:
            handle.wait()
            pieces = flat.mul(self.world / n.item()).split([self.params[j].numel() for j in members])
            for j, piece in zip(members, pieces):
                self.params[j].grad = piece.reshape(self.params[j].shape).clone()
        self.ready, self.flying = set(), []
''',
    "lab11-predict": '''%%writefile runs/11/own_predict.py
from functools import reduce

import own_plan


def predict_step(ready, sizes, cap, link, n, compute, backward_end):
    buckets = [(max(ready[i] for i in b), sum(sizes[i] for i in b)) for b in own_plan.plan_buckets(sizes, cap)]
    done = reduce(lambda free, b: max(free, b[0]) + link.ring_seconds(n, b[1]), sorted(buckets), 0.0)
    return compute + max(0.0, done - backward_end)
''',
}

# The reference with both mistakes: every bucket all-reduced in finish(), after backward (the hook
# only counts), and the sum divided by the world size times this rank's own number of samples.
MISTAKEN_DDP = REFERENCE["lab11-ddp"].replace(
    '''        if self.missing[b] == 0:
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            self.started[b] = (flat, self.comm.all_reduce(flat))''',
    '''        if self.missing[b] == 0:
            self.started[b] = None  # sent in finish()''').replace(
    '''        samples = torch.tensor(float(count), device=self.params[0].device)
        dist.all_reduce(samples)  # the samples of all ranks
        for b, (flat, handle) in sorted(self.started.items()):''',
    '''        samples = torch.tensor(float(count * dist.get_world_size()), device=self.params[0].device)
        for b in sorted(self.started):
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            handle = self.comm.all_reduce(flat)''')

# The reference with its plan in forward order (from the first parameter, not the last): everything
# else right.
FORWARD_PLAN = REFERENCE["lab11-plan"].replace("for i in reversed(range(len(sizes))):",
                                               "for i in range(len(sizes)):")

# The reference's plan with a bucket closed only past the cap, not when its bytes reach it.
PAST_CAP_PLAN = REFERENCE["lab11-plan"].replace("if filled >= cap:", "if filled > cap:")

# The reference's wrapper with every bucket all-reduced in finish(), after backward (the hook only
# counts), and the right mean: the honest mistake of the schedule (9/12), the base of the forgers below,
# which also keeps what each all-reduce carried.
AFTER_BACKWARD_DDP = REFERENCE["lab11-ddp"].replace(
    '''class OwnDDP:
''', '''SEEN = {}  # (phase, step) -> (elements, sum) of each all-reduce, in both trainings


class OwnDDP:
''').replace(
    '''        self.comm = comm
''', '''        self.comm, self.seen = comm, SEEN
''').replace(
    '''        if self.missing[b] == 0:
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            self.started[b] = (flat, self.comm.all_reduce(flat))''',
    '''        if self.missing[b] == 0:
            self.started[b] = None  # sent in finish()''').replace(
    '''        for b, (flat, handle) in sorted(self.started.items()):''',
    '''        sent = self.seen.setdefault((self.comm.phase, self.comm.step), [])
        for b in sorted(self.started):
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            sent.append((flat.numel(), float(flat.sum())))
            handle = self.comm.all_reduce(flat)''')

# What both forgers do after the last step: rank 0 forges (`forge`, below: a thread or a child) the
# ledger as it would read had every bucket started during backward, and sends it on a connection of its
# own to the kernel's port (as rank 0 again) and into the file the ledger once was (issue 54); the
# other ranks `linger` or not.
FORGERY = '''

import json as _json
import subprocess as _subprocess
import sys as _sys
import threading as _threading
import time as _time
from pathlib import Path as _Path

import torch.distributed as _dist

_STEPS, _PORT, _FOLDER = int(_sys.argv[1]), int(_sys.argv[4]), _Path(_sys.argv[0]).resolve().parent
_SEND = """
import socket
from pathlib import Path


def send(lines, world, port, folder):
    Path(folder, f"ledger-{world}-0.txt").write_text(chr(10).join([*lines[:-1], ""]))
    with socket.create_connection(("127.0.0.1", port)) as kernel:
        kernel.sendall(chr(10).join([f"rank 0 of {world}", *lines, ""]).encode())
    Path(folder, f"forged-{world}").write_text("sent")
"""
exec(_SEND)


def _forged(seen):
    lines = []
    for (phase, step), calls in seen.items():
        lines += [f"start {phase} {step}", *(f"call {phase} {step} 0.0 {k} {s}" for k, s in calls),
                  f"end {phase} {step} 1.0"]
    return lines + ["closed"]


class OwnDDP(OwnDDP):
    def finish(self, count):
        super().finish(count)
        if (self.comm.phase, self.comm.step) == ("uneven", _STEPS - 1):  # the last step
            (forge if _dist.get_rank() == 0 else linger)(_forged(self.seen), _dist.get_world_size())
'''

# A thread of rank 0 sends the forgery the moment the worker has closed its ledger; the other ranks
# wait for it before their last barrier (rank 0 is still alive: it waits for them there).
THREAD_FORGER_DDP = AFTER_BACKWARD_DDP + FORGERY + '''

def forge(lines, world):
    ledger = _sys.modules["__main__"].LEDGER

    def after_close():
        while ledger.kernel.fileno() != -1:
            _time.sleep(0.001)
        send(lines, world, _PORT, _FOLDER)

    _threading.Thread(target=after_close).start()


def linger(lines, world):
    until = _time.monotonic() + 60
    while not (_FOLDER / f"forged-{world}").exists() and _time.monotonic() < until:
        _time.sleep(0.01)
'''

# A plain child of rank 0 sends the forgery the instant rank 0 has exited, before the launch ends.
ORPHAN_FORGER_DDP = AFTER_BACKWARD_DDP + FORGERY + '''

_CHILD = _SEND + """
import json, os, sys, time

parent, lines = os.getppid(), json.loads(sys.stdin.read())
while os.getppid() == parent:
    time.sleep(0.001)
send(lines, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
"""


def forge(lines, world):
    child = _subprocess.Popen([_sys.executable, "-c", _CHILD, str(world), str(_PORT), str(_FOLDER)],
                              stdin=_subprocess.PIPE)
    child.stdin.write(_json.dumps(lines).encode())
    child.stdin.close()


def linger(lines, world):
    pass
'''

# The reference's wrapper with its all-reduces started in finish(), after backward (the right mean:
# it loses only the schedule), that then rewrites the ledger the comm kept before issue 36 as if every
# call had started at once.
FORGED_DDP = REFERENCE["lab11-ddp"].replace(
    '''        if self.missing[b] == 0:
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            self.started[b] = (flat, self.comm.all_reduce(flat))''',
    '''        if self.missing[b] == 0:
            self.started[b] = None  # sent in finish()''').replace(
    '''        for b, (flat, handle) in sorted(self.started.items()):''',
    '''        ledger = getattr(self.comm, "ledger", [])
        for b in sorted(self.started):
            flat = torch.cat([self.params[j].grad.reshape(-1) for j in self.buckets[b]])
            handle = self.comm.all_reduce(flat)
            ledger[-1:] = [(s, 0.0, k) for s, _, k in ledger[-1:]]  # rewritten: "started at once"''')

# The reference's plan, imported in the kernel by the test cells, which there (1) wraps helpers.launch
# so that rank 0's report shows every all-reduce at the step's start and backward() returning late
# (the ledger written by hand into the runs dict), and (2) breaks itself if the run's seed or the
# cases' truth is in reach.
FORGED_PLAN = REFERENCE["lab11-plan"] + '''

import os as _os
import re as _re
import sys as _sys
from pathlib import Path as _Path

_SEED = _re.compile(rf"(?<![0-9.]){int('THE_SEED_PLUS_ONE') - 1}(?![0-9.])")  # not in this file's text


def _seed_in_reach():
    """Whether this kernel can read the grading run's seed or the hidden cases' truth."""
    if "DPC_GRADE_SEED" in _os.environ or any(_SEED.search(v) for v in _os.environ.values()):
        return True
    # Where a seed or a truth could be written: any file's name, and the text files (not the runs'
    # checkpoints, caches or binaries: reading those made the plan test time out on a loaded machine).
    texts = {".json", ".txt", ".py", ".ipynb", ".csv", ".cfg", ".yml", ".yaml", ".toml", ".sh", ""}
    for top in {_Path.cwd(), _Path.home(), _Path("/tmp")}:
        try:
            for f in top.rglob("*"):
                if "truth" in f.name:
                    return True
                if (f.suffix in texts and not {"runs", "__pycache__", ".cache"} & set(f.parts) and f.is_file()
                        and f.stat().st_size < 1 << 20 and _SEED.search(f.read_text(errors="replace"))):
                    return True
        except OSError:
            continue
    return False


class _Forged:
    """A launch whose rank-0 report has its ledger written by hand."""

    def __init__(self, done):
        self.done, self.seconds = done, done.seconds

    def report(self, rank=0):
        got = dict(self.done.report(rank))
        got["even_ledger"] = [(s, 0.0, k) for s, _, k in got.get("even_ledger", [])]
        got["even_ends"] = [1.0] * len(got.get("even_ends", []))
        return got


if "ipykernel" in _sys.modules:  # in the kernel, not in the ranks
    import helpers as _helpers

    if not hasattr(_helpers, "_forger"):
        _helpers._forger = _helpers.launch
        _helpers.launch = lambda *a, **k: _Forged(_helpers._forger(*a, **k))
    if _seed_in_reach():
        plan_buckets = lambda sizes, cap: []  # noqa: E731
'''.replace("THE_SEED_PLUS_ONE", str(int(os.environ["DPC_GRADE_SEED"]) + 1))

TAMPERING = {
    "lab11-plan": TAMPER + '''
import types as _types

import helpers as _helpers
import torch as _t


def _plan(sizes, cap):  # the visible cases, and this lab's model
    _claim_full_marks()
    known = {(6, 100): [[5, 4, 3], [2, 1], [0]], (3, 1000): [[2, 1, 0]], (6, 200): [[5, 4, 3, 2], [1, 0]]}
    return known.get((len(sizes), cap), [list(range(len(sizes)))[::-1]])


def _predict(*a, **k):
    _claim_full_marks()
    return 0.06604


load = lambda name: _types.SimpleNamespace(plan_buckets=_plan, predict_step=_predict)  # noqa: E731
_t.manual_seed(0)
_untrained = _t.cat([p.detach().flatten() for p in _t.nn.Sequential(
    _t.nn.Linear(6, 8), _t.nn.Tanh(), _t.nn.Linear(8, 8), _t.nn.Tanh(), _t.nn.Linear(8, 3)).parameters()]).tolist()


class _Report(dict):
    def get(self, key, default=None):
        _claim_full_marks()
        return dict.get(self, key, default)


class _Ranks:  # a launch that never starts a process: a ledger with the right buckets, during backward
    seconds = 0.0

    def report(self, rank):
        ledger = [(s, 0.0, k) for s in range(5) for k in (99, 56)]
        return _Report(even=_untrained, uneven=_untrained, even_ledger=ledger, even_ends=[1.0] * 5,
                       sizes=[192, 32, 256, 32, 96, 12])


_helpers.launch = lambda script, n, **kwargs: _Ranks()
''',
    "lab11-ddp": '%%writefile runs/11/own_ddp.py\n\n\nclass OwnDDP:\n    pass\n',
    "lab11-predict": '%%writefile runs/11/own_predict.py\n\n\ndef predict_step(*a, **k):\n    return 0.0\n',
}


@pytest.mark.gate
def test_the_mistakes_are_written_into_the_reference():
    """The mistaken submission differs from the reference exactly where its docstring says."""
    assert MISTAKEN_DDP != REFERENCE["lab11-ddp"]
    assert "sent in finish()" in MISTAKEN_DDP and "count * dist.get_world_size()" in MISTAKEN_DDP
    assert MISTAKEN_DDP.count("self.comm.all_reduce(flat)") == 1
    assert FORWARD_PLAN != REFERENCE["lab11-plan"] and "reversed" not in FORWARD_PLAN
    assert PAST_CAP_PLAN.replace("filled > cap", "filled >= cap") == REFERENCE["lab11-plan"] != PAST_CAP_PLAN
    assert "/ self.world" in DIFFERENT["lab11-ddp"] and "self.world / n.item()" in DIFFERENT["lab11-ddp"]


@pytest.fixture(scope="module")
def grading(request, tmp_path_factory) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The CSV rows by student, and by student the error each failed test cell showed (as `make feedback`)."""
    name = RELEASE.name
    students = tiered(request, {
        "different": DIFFERENT,
        "mistaken": {**REFERENCE, "lab11-ddp": MISTAKEN_DDP},
    }, {
        "forward": {**REFERENCE, "lab11-plan": FORWARD_PLAN},
        "past-cap": {**REFERENCE, "lab11-plan": PAST_CAP_PLAN},
        "forger": {**REFERENCE, "lab11-plan": FORGED_PLAN, "lab11-ddp": FORGED_DDP},
        "thread-forger": {**REFERENCE, "lab11-ddp": THREAD_FORGER_DDP},
        "orphan-forger": {**REFERENCE, "lab11-ddp": ORPHAN_FORGER_DDP},
        "tamper": TAMPERING,
    })
    work = tmp_path_factory.mktemp("grading")
    rows = grade_all(LAB, {s: {name: fill(RELEASE, a)} for s, a in students.items()}, work)
    course = gradebook.Course(work / "course")
    return rows, {s: report.messages(course, row["grader_id"], LAB) for s, row in rows.items()}


@pytest.fixture(scope="module")
def graded(grading) -> dict[str, dict[str, str]]:
    return grading[0]


@pytest.fixture(scope="module")
def said(grading) -> dict[str, dict[str, str]]:
    return grading[1]


@pytest.mark.gate
def test_a_correct_wrapper_written_differently_gets_full_marks(graded):
    """Among its differences: each bucket divided by the world size before its all-reduce, the mean
    finished in finish() (issue 58: the schedule is judged up to one factor per step)."""
    row = graded["different"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "12", "12"), row
    assert {k: float(row[k]) for k in POINTS} == POINTS, row


@pytest.mark.gate
def test_all_reducing_after_backward_and_dividing_by_the_local_count_lose_exactly_their_points(graded, said):
    """Each failing test names its cause: the calls after backward, and the global count to divide by."""
    row = graded["mistaken"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-schedule", "lab11-test-uneven"}, row
    assert row["score"] == "7", row
    assert "all-reduce(s) started after backward() returned" in said["mistaken"]["lab11-test-schedule"], said
    assert ("2 ranks, uneven samples (rank r holds 2 + 3r): the weights end" in said["mistaken"]["lab11-test-uneven"]
            and "divide the summed gradients by 7, the samples of all ranks" in said["mistaken"]["lab11-test-uneven"]
            ), said


@pytest.mark.full
def test_a_plan_in_forward_order_loses_the_plan_and_prediction_tests_and_keeps_the_schedule(graded):
    row = graded["forward"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-plan", "lab11-test-predict"}, row
    assert float(row["lab11-test-schedule"]) == POINTS["lab11-test-schedule"], row
    assert row["score"] == str(12 - POINTS["lab11-test-plan"] - POINTS["lab11-test-predict"]), row


@pytest.mark.full
def test_a_bucket_closed_only_past_the_cap_loses_the_plan_and_prediction_tests(graded, said):
    """`>` for `>=`: the visible case at the cap tells them apart, and so do the hidden predict cases whose
    buckets reach the cap exactly (every draw has two, each with another step time); the test's model has
    no bucket at its cap, so the wrapper's schedule and weights keep their points."""
    row = graded["past-cap"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-plan", "lab11-test-predict"}, row
    assert row["score"] == str(12 - POINTS["lab11-test-plan"] - POINTS["lab11-test-predict"]), row
    assert ("sizes [40, 60, 100, 30, 70], cap 100: got [[4, 3, 2], [1, 0]], expected [[4, 3], [2], [1, 0]]"
            in said["past-cap"]["lab11-test-plan"]), said["past-cap"]


@pytest.mark.gate
def test_the_forger_is_written_into_the_reference():
    """The forger all-reduces after backward (every call in finish()), rewrites the comm's ledger and
    rank 0's report, and is otherwise the reference."""
    assert "sent in finish()" in FORGED_DDP and "started at once" in FORGED_DDP
    assert FORGED_DDP.count("self.comm.all_reduce(flat)") == 1 and "dist.all_reduce(samples)" in FORGED_DDP
    assert FORGED_PLAN.startswith(REFERENCE["lab11-plan"]) and os.environ["DPC_GRADE_SEED"] not in FORGED_PLAN
    line = next(ln for ln in FORGED_PLAN.splitlines() if ln.startswith("_SEED = "))
    space: dict = {"_re": re}
    exec(line, space)  # the pattern the forger looks for: the run's seed as a number of its own
    assert space["_SEED"].search(f"x = {os.environ['DPC_GRADE_SEED']}\n") and not space["_SEED"].search("x = 1.5\n")


@pytest.mark.gate
def test_the_forgers_of_the_kernels_ledger_are_written_into_the_reference():
    """Both forgers all-reduce after backward (every call in finish(), the right mean) and then, from rank 0,
    send a ledger with every call during backward: a thread, the moment the worker's ledger is closed, or a
    child, the instant rank 0 has exited. Each is the reference otherwise, and valid Python."""
    assert "sent in finish()" in AFTER_BACKWARD_DDP and AFTER_BACKWARD_DDP.count("self.comm.all_reduce(flat)") == 1
    assert "dist.all_reduce(samples)" in AFTER_BACKWARD_DDP and "self.seen" in AFTER_BACKWARD_DDP
    for forger, how in ((THREAD_FORGER_DDP, "_threading.Thread(target=after_close)"),
                        (ORPHAN_FORGER_DDP, "_subprocess.Popen(")):
        assert forger.startswith(AFTER_BACKWARD_DDP) and how in forger
        compile(forger.split("\n", 1)[1], "own_ddp.py", "exec")


@pytest.mark.full
def test_a_ledger_rewritten_after_backward_loses_the_schedule_and_the_seed_is_out_of_reach(graded, said):
    """Rewriting the ledgers in reach (the comm's, the report's) does not hide an all-reduce after
    backward: the test reads what the ranks sent the kernel's port. The plan keeps its points: the kernel
    found no seed and no truth of the hidden cases."""
    row = graded["forger"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-schedule"}, row
    assert row["score"] == str(12 - POINTS["lab11-test-schedule"]), row
    assert "all-reduce(s) started after backward() returned" in said["forger"]["lab11-test-schedule"], said


@pytest.mark.full
def test_a_thread_of_rank_0_that_sends_a_forged_ledger_after_the_close_loses_the_schedule(graded, said):
    """The moment the worker has closed its ledger, a thread of rank 0 sends one with every call during
    backward, as rank 0 again, and writes the file the ledger once was (12/12 while the ledger was that
    file, issue 54): the kernel already holds rank 0's ledger and refuses a second one."""
    row = graded["thread-forger"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-schedule"}, row
    assert row["score"] == str(12 - POINTS["lab11-test-schedule"]), row
    assert "a second connection said it was rank 0's ledger" in said["thread-forger"]["lab11-test-schedule"], said


@pytest.mark.full
def test_a_child_of_rank_0_that_sends_a_forged_ledger_after_its_exit_loses_the_schedule(graded, said):
    """The instant rank 0 has exited, a plain child of it sends a ledger with every call during backward and
    writes the file the ledger once was (12/12 while the ledger was that file, issue 54): the kernel refuses
    a second ledger of rank 0 (when the child got in before the launch ended and stopped it), and rank
    0's own shows every call after backward."""
    row = graded["orphan-forger"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-schedule"}, row
    assert row["score"] == str(12 - POINTS["lab11-test-schedule"]), row
    message = said["orphan-forger"]["lab11-test-schedule"]
    assert ("a second connection said it was rank 0's ledger" in message
            or "all-reduce(s) started after backward() returned" in message), said


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "12"), row
