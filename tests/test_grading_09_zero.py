"""Lab 9 (a sharded optimizer step, ZeRO-1, clipped by the global norm) graded end to end: submissions
built from the student copy in labs/ are autograded by src/dpc_instructor/grade.py with real torchrun
launches on 2, 3 and 4 ranks.

A correct submission written differently from the reference gets full marks (all-reduce then
slice, one broadcast per owner, the squared slice norms all-gathered and summed); the reference itself
(reduce-scatter, a padded all-gather, an all-reduce of the squared slice norm) passes, or the grader
refuses to grade (dpc_instructor.grading.reference.reference). Each typical ZeRO mistake loses exactly the points
of the test cells it breaks:

* wrong shard boundaries (every slice numel // N long, the remainder owned by nobody) and the
  gradient summed instead of averaged: shard bounds, gradient and weights;
* the whole vector stepped on every rank (DDP's optimizer, not a sharded one): the memory test only,
  since the weights are still right;
* the all-gather forgotten: the gather test and the weights;
* clipped by the norm of this rank's slice (no collective: every rank its own factor): the clip test
  and the weights;
* clip_shard right, but zero_step clips each rank's full local gradient before the reduce-scatter
  (the norm of this rank's batch, not of the average): the weights only;
* tamper: does no work and fights the tests from inside the kernel (gradekit.TAMPER; `load` rebound
  to a module whose shard_bounds knows only the two visible cases; helpers.launch replaced by fake
  ranks reporting zero errors, the untrained weights and one momentum value each). The test cells
  record the raw values (slices, gradient slices, gathered vectors, clipped slices and norms, weights)
  and the judge compares
  them outside the kernel: it loses everything but the memory test, whose only observation is a
  count the test states in advance (1 <= values held <= the longest slice): that one cannot be
  protected, a do-nothing zero_step that puts one element in `state` passes it too.

The bounds test's hidden cases are drawn outside every kernel (issue 36: the source's locked
`hidden_cases`, dpc_instructor.grading.cases.make_cases; the kernel gets only the sizes and world sizes);
the different submission checks, in the kernel and in every worker, that no grading seed is in its
environment or in a file of its folder (gradekit.SEED_PROBE), so it would lose the bounds test (and, in the
workers, the weights) if one were there. A redrawing attack means nothing here: a case's slices
follow from its inputs for any correct shard_bounds, and the inputs are the kernel's.

A mistake in a piece still costs the weights test too (bounds-and-sum, no-gather, slice-norm): the
weights test checks zero_step through the student's own pieces, and judging it apart from them would
need correct pieces in a worker the student reads (the answers of exercises 1 to 4) or a second,
hidden worker; not done.
"""
from __future__ import annotations

import os

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, probing, submission as fill, tiered

LAB = "09-zero"
RELEASE = ROOT / "labs" / LAB / "zero.ipynb"
POINTS = {"lab09-test-bounds": 2, "lab09-test-grad": 2, "lab09-test-gather": 2, "lab09-test-clip": 2,
          "lab09-test-weights": 3, "lab09-test-memory": 2}

BOUNDS = '''%%writefile runs/09/zero_bounds.py


def shard_bounds(numel, world_size, rank):
    base, extra = divmod(numel, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
'''
GRAD = '''%%writefile runs/09/zero_grad.py
import torch
import torch.distributed as dist


def grad_shard(flat_grad, shards, rank):
    pieces = [flat_grad[a:b].contiguous() for a, b in shards]
    mine = torch.empty_like(pieces[rank])
    dist.reduce_scatter(mine, pieces)
    return mine / len(shards)
'''
GATHER = '''%%writefile runs/09/zero_gather.py
import torch
import torch.distributed as dist


def gather_params(flat_params, shards, rank):
    longest = max(b - a for a, b in shards)
    start, stop = shards[rank]
    mine = torch.zeros(longest, dtype=flat_params.dtype)
    mine[:stop - start] = flat_params[start:stop]
    pieces = [torch.empty_like(mine) for _ in shards]
    dist.all_gather(pieces, mine)
    with torch.no_grad():
        for (a, b), piece in zip(shards, pieces):
            flat_params[a:b] = piece[:b - a]
'''
CLIP = '''%%writefile runs/09/zero_clip.py
import torch
import torch.distributed as dist


def clip_shard(grad, max_norm):
    squares = grad.pow(2).sum().reshape(1)
    dist.all_reduce(squares)
    norm = squares.sqrt().item()
    grad.mul_(min(1.0, max_norm / (norm + 1e-6)))
    return norm
'''
STEP = '''%%writefile runs/09/zero_step.py
from zero_bounds import shard_bounds
from zero_clip import clip_shard
from zero_gather import gather_params
from zero_grad import grad_shard
from zero_sgd import sgd_momentum


def zero_step(flat_params, flat_grad, state, lr, max_norm, world_size, rank):
    shards = [shard_bounds(flat_params.numel(), world_size, r) for r in range(world_size)]
    grad = grad_shard(flat_grad, shards, rank)
    clip_shard(grad, max_norm)
    start, stop = shards[rank]
    sgd_momentum(flat_params[start:stop], grad, state, lr)
    gather_params(flat_params, shards, rank)
'''
CORRECT = {"lab09-bounds": BOUNDS, "lab09-grad": GRAD, "lab09-gather": GATHER, "lab09-clip": CLIP, "lab09-step": STEP}
# Correct too, written differently: sizes listed first, all-reduce then slice, a broadcast per owner,
# every rank's squared norm all-gathered and summed, the factor as a tensor clamped at 1.
DIFFERENT = {
    "lab09-bounds": '''%%writefile runs/09/zero_bounds.py


def shard_bounds(numel, world_size, rank):
    sizes = [numel // world_size + (1 if r < numel % world_size else 0) for r in range(world_size)]
    start = sum(sizes[:rank])
    return int(start), int(start + sizes[rank])
''',
    "lab09-grad": '''%%writefile runs/09/zero_grad.py
import torch.distributed as dist


def grad_shard(flat_grad, shards, rank):
    dist.all_reduce(flat_grad)
    start, stop = shards[rank]
    return flat_grad[start:stop].clone() / dist.get_world_size()
''',
    "lab09-gather": '''%%writefile runs/09/zero_gather.py
import torch.distributed as dist


def gather_params(flat_params, shards, rank):
    for owner, (a, b) in enumerate(shards):
        piece = flat_params[a:b].detach().clone()
        dist.broadcast(piece, src=owner)
        flat_params.data[a:b] = piece
''',
    "lab09-clip": '''%%writefile runs/09/zero_clip.py
import math

import torch
import torch.distributed as dist


def clip_shard(grad, max_norm):
    mine = torch.tensor([float(torch.dot(grad, grad))]) if grad.numel() else torch.zeros(1)
    everyone = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    total = math.sqrt(sum(t.item() for t in everyone))
    factor = torch.clamp(torch.tensor(max_norm / (total + 1e-6)), max=1.0)
    grad *= factor
    return total
''',
    "lab09-step": '''%%writefile runs/09/zero_step.py
import zero_bounds
import zero_clip
import zero_gather
import zero_grad
import zero_sgd


def zero_step(flat_params, flat_grad, state, lr, max_norm, world_size, rank):
    n = flat_params.numel()
    shards = [zero_bounds.shard_bounds(n, world_size, r) for r in range(world_size)]
    a, b = shards[rank]
    mine = flat_params.narrow(0, a, b - a)
    g = zero_grad.grad_shard(flat_grad, shards, rank)
    zero_clip.clip_shard(g, max_norm)
    zero_sgd.sgd_momentum(mine, g, state, lr)
    zero_gather.gather_params(flat_params, shards, rank)
''',
}
WRONG_BOUNDS_AND_SUM = {
    **CORRECT,
    # every slice numel // N long: the last numel % N parameters belong to nobody
    "lab09-bounds": '''%%writefile runs/09/zero_bounds.py


def shard_bounds(numel, world_size, rank):
    size = numel // world_size
    return rank * size, (rank + 1) * size
''',
    # the gradients summed over ranks, not averaged
    "lab09-grad": GRAD.replace("return mine / len(shards)", "return mine"),
}
# DDP's optimizer: the whole averaged gradient (clipped whole) and the whole vector stepped on every rank
WRONG_WHOLE = {**CORRECT, "lab09-step": '''%%writefile runs/09/zero_step.py
import torch.distributed as dist
from zero_sgd import sgd_momentum


def zero_step(flat_params, flat_grad, state, lr, max_norm, world_size, rank):
    dist.all_reduce(flat_grad)
    grad = flat_grad / world_size
    grad *= min(1.0, max_norm / (grad.norm().item() + 1e-6))
    sgd_momentum(flat_params, grad, state, lr)
'''}
# the all-gather forgotten: each rank only ever sees its own slice move
WRONG_NO_GATHER = {**CORRECT, "lab09-gather": '''%%writefile runs/09/zero_gather.py


def gather_params(flat_params, shards, rank):
    pass  # this rank's slice is already in place
'''}
# clipped by the norm of this rank's slice: no collective, so every rank scales by its own factor
WRONG_SLICE_NORM = {**CORRECT, "lab09-clip": '''%%writefile runs/09/zero_clip.py


def clip_shard(grad, max_norm):
    norm = grad.norm().item()
    grad.mul_(min(1.0, max_norm / (norm + 1e-6)))
    return norm
'''}
# clip_shard right, but zero_step clips the full local gradient before the reduce-scatter: the norm of
# this rank's batch (one factor per rank), not of the global batch's averaged gradient
WRONG_CLIP_LOCAL = {**CORRECT, "lab09-step": '''%%writefile runs/09/zero_step.py
from zero_bounds import shard_bounds
from zero_gather import gather_params
from zero_grad import grad_shard
from zero_sgd import sgd_momentum


def zero_step(flat_params, flat_grad, state, lr, max_norm, world_size, rank):
    flat_grad = flat_grad * min(1.0, max_norm / (flat_grad.norm().item() + 1e-6))
    shards = [shard_bounds(flat_params.numel(), world_size, r) for r in range(world_size)]
    grad = grad_shard(flat_grad, shards, rank)
    start, stop = shards[rank]
    sgd_momentum(flat_params[start:stop], grad, state, lr)
    gather_params(flat_params, shards, rank)
'''}
# No work, and the tests fought from the kernel: the answer cells' modules do nothing; the first
# one is not a %%writefile cell but code run in the kernel, which neutralises the asserts (TAMPER),
# rebinds the harness's `load` (the bounds test's module, the reference's optimizer) and replaces
# helpers.launch with ranks that report what the asserts want to read. _claim_full_marks() runs
# inside everything the test cells call.
TAMPERING = {
    "lab09-bounds": TAMPER + """
import types as _types

import helpers as _helpers


def _shard_bounds(numel, world_size, rank):  # the visible cases only
    _claim_full_marks()
    known = {(10, 3): [(0, 4), (4, 7), (7, 10)], (12, 4): [(0, 3), (3, 6), (6, 9), (9, 12)]}
    return known.get((numel, world_size), [(0, 0)] * world_size)[rank]


def _no_step(param, grad, state, lr, momentum=0.9):  # the reference's one process trains nothing
    _claim_full_marks()


load = lambda name: _types.SimpleNamespace(shard_bounds=_shard_bounds, sgd_momentum=_no_step)  # noqa: E731

torch.manual_seed(0)
_untrained = nn.utils.parameters_to_vector(
    nn.Sequential(nn.Linear(8, 13), nn.Tanh(), nn.Linear(13, 5)).parameters()).tolist()


class _Report(dict):
    def get(self, key, default=None):  # reported() reads every value through here, in the test cells
        _claim_full_marks()
        return dict.get(self, key, default)


class _Ranks:  # a launch that never starts a process: every rank reports what the asserts want
    seconds = 0.0

    def report(self, rank):
        return _Report(grad_err=0.0, gather_err=0.0, clip_err=0.0, grad=[0.0], gathered=[0.0] * 187,
                       clipped=[[0.0], [0.0], []], norms=[1.0, 1.0, 1.0], weights=_untrained, state_numel=1)


_helpers.launch = lambda script, n, **kwargs: _Ranks()
""",
    "lab09-grad": """%%writefile runs/09/zero_grad.py
import torch


def grad_shard(flat_grad, shards, rank):
    return torch.zeros(shards[rank][1] - shards[rank][0])
""",
    "lab09-gather": """%%writefile runs/09/zero_gather.py


def gather_params(flat_params, shards, rank):
    pass
""",
    "lab09-clip": """%%writefile runs/09/zero_clip.py


def clip_shard(grad, max_norm):
    return 0.0
""",
    "lab09-step": """%%writefile runs/09/zero_step.py


def zero_step(flat_params, flat_grad, state, lr, max_norm, world_size, rank):
    pass
""",
}
SUBMISSIONS = {"different": DIFFERENT, "bounds-and-sum": WRONG_BOUNDS_AND_SUM,
               "whole-model": WRONG_WHOLE, "no-gather": WRONG_NO_GATHER, "slice-norm": WRONG_SLICE_NORM,
               "clip-local": WRONG_CLIP_LOCAL, "tamper": TAMPERING}
EXPECTED_LOST = {
    "different": set(),
    "bounds-and-sum": {"lab09-test-bounds", "lab09-test-grad", "lab09-test-weights"},
    "whole-model": {"lab09-test-memory"},
    "no-gather": {"lab09-test-gather", "lab09-test-weights"},
    "slice-norm": {"lab09-test-clip", "lab09-test-weights"},
    "clip-local": {"lab09-test-weights"},
    # every test but the memory test's count (see the module docstring); before the judge: 13/13
    "tamper": {"lab09-test-bounds", "lab09-test-grad", "lab09-test-gather", "lab09-test-clip",
               "lab09-test-weights"},
}


# the gate: a correct answer and one plausible mistake; the full tier: the others
GATE = ("different", "bounds-and-sum")


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    seed = int(os.environ["DPC_GRADE_SEED"])  # grade_all's run: no --seed
    submissions = {**SUBMISSIONS, "different": {**DIFFERENT, "lab09-bounds": probing(DIFFERENT["lab09-bounds"], seed)}}
    students = {s: {name: fill(RELEASE, answers)} for s, answers in submissions.items()}
    students = tiered(request, {s: v for s, v in students.items() if s in GATE},
                      {s: v for s, v in students.items() if s not in GATE})
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=60,
                     notebook_timeout=600)


@pytest.mark.parametrize("student", [pytest.param(s, marks=pytest.mark.gate if s in GATE else pytest.mark.full)
                                     for s in sorted(SUBMISSIONS)])
def test_each_submission_loses_exactly_its_points(graded, student):
    row = graded[student]
    total = sum(POINTS.values())
    assert row["status"] == "graded", row
    assert set(POINTS) <= set(row), row  # every test cell has its column
    assert lost(row) == EXPECTED_LOST[student], row
    assert float(row["max_score"]) == total, row
    assert float(row["score"]) == total - sum(POINTS[k] for k in EXPECTED_LOST[student]), row
