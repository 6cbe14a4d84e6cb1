"""Lab 11 (your own DDP: buckets, overlap, the global mean) graded end to end: submissions built from
the student copy in labs/ are autograded by src/dpc_instructor/grade.py, each training with the
student's wrapper in real torchrun launches on 2 and 3 ranks, with even and uneven samples per rank.

A correct submission written differently from the reference gets full marks (a plan built with a
running total, a wrapper that counts ready gradients with sets and divides by the count once, a
prediction written as a fold); the reference itself passes, or the grader refuses to grade
(dpc_instructor.grade.reference). The typical mistakes lose exactly their points: a wrapper that
all-reduces every bucket in finish(), after backward, trains the right weights and loses the
schedule test (its ledger shows the calls after backward returned); dividing by the world size
times this rank's samples is right only when every rank has as many, and loses the uneven test. A
plan filled from the first parameter instead of the last loses the buckets and prediction tests and
nothing else: its wrapper trains the right weights and all-reduces each of its own buckets during
backward, and the schedule test judges the ledger against the student's own plan.
A submission that does no work and fights the tests from inside the kernel (gradekit.TAMPER, a
fake launch whose ledger has the right buckets, a plan and a prediction that know only the visible
cases) gets 0: the judge compares the values outside the kernel, and the schedule's record carries
the weights trained in the same launch.
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill

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
        self.comm = comm
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
                    flat = torch.cat([self.params[j].grad.flatten() for j in members])
                    self.flying.append((members, flat, self.comm.all_reduce(flat)))
        return on_ready

    def finish(self, count):
        n = torch.tensor([count], dtype=torch.float64)
        dist.all_reduce(n)
        for members, flat, handle in self.flying:
            handle.wait()
            pieces = flat.div(n.item()).split([self.params[j].numel() for j in members])
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


def test_the_mistakes_are_written_into_the_reference():
    """The mistaken submission differs from the reference exactly where its docstring says."""
    assert MISTAKEN_DDP != REFERENCE["lab11-ddp"]
    assert "sent in finish()" in MISTAKEN_DDP and "count * dist.get_world_size()" in MISTAKEN_DDP
    assert MISTAKEN_DDP.count("self.comm.all_reduce(flat)") == 1
    assert FORWARD_PLAN != REFERENCE["lab11-plan"] and "reversed" not in FORWARD_PLAN


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {
        "different": DIFFERENT,
        "mistaken": {**REFERENCE, "lab11-ddp": MISTAKEN_DDP},
        "forward": {**REFERENCE, "lab11-plan": FORWARD_PLAN},
        "tamper": TAMPERING,
    }
    return grade_all(LAB, {s: {name: fill(RELEASE, a)} for s, a in students.items()},
                     tmp_path_factory.mktemp("grading"))


def test_a_correct_wrapper_written_differently_gets_full_marks(graded):
    row = graded["different"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "12", "12"), row
    assert {k: float(row[k]) for k in POINTS} == POINTS, row


def test_all_reducing_after_backward_and_dividing_by_the_local_count_lose_exactly_their_points(graded):
    row = graded["mistaken"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-schedule", "lab11-test-uneven"}, row
    assert row["score"] == "7", row


def test_a_plan_in_forward_order_loses_the_plan_and_prediction_tests_and_keeps_the_schedule(graded):
    row = graded["forward"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab11-test-plan", "lab11-test-predict"}, row
    assert float(row["lab11-test-schedule"]) == POINTS["lab11-test-schedule"], row
    assert row["score"] == str(12 - POINTS["lab11-test-plan"] - POINTS["lab11-test-predict"]), row


def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "12"), row
