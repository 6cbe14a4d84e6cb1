"""Grading of lab 05 (ring all-reduce). A correct submission written differently from the reference
solution gets full marks (the simulation posts every message of a step before applying any, the
all-gather forwards the chunk it just received, the real ring receives before it sends and
alternates blocking send/recv by rank parity); the reference itself passes, or the grader refuses
to grade (dpc_instructor.grading.reference.reference). Typical mistakes (wrong ring step index, an all-gather
that overwrites the wrong chunk, a ring that deadlocks because every rank sends before it receives,
whole buffers sent instead of chunks) lose exactly the points of the tests they break, and a
deadlock is stopped by its guard, not by the grader; a rank that never reaches the ring (an endless
loop) is the one the error names. A submission that does no work and fights the tests (case
"tamper": gradekit.TAMPER, np.all made to hold, the harness's ring_bytes_per_worker made 0, and a
worker module that makes torch.equal hold in every rank) gets 0: every test cell's recorded values
are compared outside the kernel. A submission right only for the sizes the tests used before their
hidden cases were drawn per grading run (case "forged") loses the three simulation tests: the drawn
sizes find it out. A real ring that does everything in reduce_scatter (the chapter's pipelined ring) and
nothing in all_gather (case "delegator") has the right sums and traffic and loses exactly the test of
reduce_scatter alone (what each rank holds after it, also on two rank counts and sizes drawn outside the
kernel).

The simulation tests' hidden cases are drawn outside every kernel (issue 36: the source's locked
`hidden_cases`, dpc_instructor.grading.cases.make_cases; each test cell runs its function on all of their
inputs and the grader judges each case in its own cell); the correct submission checks that its
kernel has no grading seed in its environment and none in a file of its folder (gradekit.SEED_PROBE), so it would
lose the reduce-scatter and traffic tests if one were there. A redrawing attack means nothing here:
a case's answer is computed from its inputs by any correct ring, and the inputs are the kernel's.
What the judge cannot rule out: see CONTRIBUTING.md (the traffic the Wire logs in the kernel, the
peers and bytes the workers report)."""
from __future__ import annotations

import json
import os

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, probing, reference_answers, submission as fill, tiered

import helpers
from dpc_runtime import notebook

LAB = "05-ring-allreduce"
RELEASE = ROOT / "labs" / LAB / "ring-allreduce.ipynb"
SOURCE = ROOT / "solutions" / LAB / "ring-allreduce.ipynb"
ANSWERS = ("lab05-sim-reduce-scatter", "lab05-sim-all-gather", "lab05-real")


SIM_RS = '''def sim_reduce_scatter(chunks, wire):
    n = len(chunks)
    for step in range(n - 1):
        for r in range(n):
            c = {chunk}
            right = (r + 1) % n
            chunks[right][c] = chunks[right][c] + wire.send(r, right, {payload})
'''
SIM_AG = '''def sim_all_gather(chunks, wire):
    n = len(chunks)
    for step in range(n - 1):
        for r in range(n):
            c = {chunk}
            right = (r + 1) % n
            chunks[right][c] = wire.send(r, right, chunks[r][c])
'''
REAL = '''%%writefile runs/05/student_ring.py
import torch
import torch.distributed as dist
from helpers.ring import chunk_bounds


def reduce_scatter(flat):
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(flat.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    buf = torch.empty(max(hi - lo for lo, hi in bounds), dtype=flat.dtype)
    for step in range(n - 1):
        s_lo, s_hi = bounds[{send_chunk}]
        r_lo, r_hi = bounds[{recv_chunk}]
{exchange}
        flat[r_lo:r_hi] += buf[:r_hi - r_lo]


def all_gather(flat):
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(flat.numel(), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        s_lo, s_hi = bounds[(rank + 1 - step) % n]
        r_lo, r_hi = bounds[(rank - step) % n]
        reqs = [dist.isend(flat[s_lo:s_hi], right), dist.irecv(flat[r_lo:r_hi], left)]
        for req in reqs:
            req.wait()


def ring_allreduce(flat):
    reduce_scatter(flat)
    all_gather(flat)
    return flat
'''
NONBLOCKING = '''        reqs = [dist.isend(flat[s_lo:s_hi], right), dist.irecv(buf[:r_hi - r_lo], left)]
        for req in reqs:
            req.wait()'''
BLOCKING = '''        dist.send(flat[s_lo:s_hi], right)  # every rank sends first: nobody receives
        dist.recv(buf[:r_hi - r_lo], left)'''
GOOD_STEP = dict(send_chunk="(rank - step) % n", recv_chunk="(rank - step - 1) % n")
BAD_STEP = dict(send_chunk="(rank + step) % n", recv_chunk="(rank + step - 1) % n")

REFERENCE = reference_answers(SOURCE, ANSWERS)
# Correct, written another way: every message of a step posted before any is applied, loops over
# receivers, the all-gather forwards what it just received (a while loop), and the real ring tracks
# the chunk it forwards instead of computing it from the step, receives before it sends in the
# reduce-scatter, and alternates blocking send/recv by rank parity in the all-gather.
DIFFERENT = {
    "lab05-sim-reduce-scatter": '''def sim_reduce_scatter(chunks, wire):
    n = len(chunks)
    for t in range(1, n):
        inbox = []
        for dst in range(n):
            src = (dst - 1) % n
            idx = (dst - t) % n
            inbox.append((dst, idx, wire.send(src, dst, chunks[src][idx])))
        for dst, idx, payload in inbox:
            chunks[dst][idx] += payload
''',
    "lab05-sim-all-gather": '''def sim_all_gather(chunks, wire):
    n = len(chunks)
    forward = [(r + 1) % n for r in range(n)]  # the complete chunk each worker passes on next
    left_to_do = n - 1
    while left_to_do > 0:
        arrived = {}
        for r in range(n):
            arrived[(r + 1) % n] = (forward[r], wire.send(r, (r + 1) % n, chunks[r][forward[r]]))
        for r, (c, payload) in arrived.items():
            chunks[r][c] = payload
            forward[r] = c
        left_to_do -= 1
''',
    "lab05-real": '''%%writefile runs/05/student_ring.py
import torch
import torch.distributed as dist
from helpers.ring import chunk_bounds


def reduce_scatter(flat):
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(flat.numel(), n)
    out_chunk = rank
    for _ in range(n - 1):
        in_chunk = (out_chunk - 1) % n
        lo, hi = bounds[in_chunk]
        incoming = torch.empty(hi - lo, dtype=flat.dtype)
        got = dist.irecv(incoming, src=(rank - 1) % n)
        a, b = bounds[out_chunk]
        sent = dist.isend(flat[a:b], dst=(rank + 1) % n)
        got.wait()
        flat[lo:hi].add_(incoming)
        sent.wait()
        out_chunk = in_chunk


def all_gather(flat):
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(flat.numel(), n)
    out_chunk = (rank + 1) % n
    for _ in range(n - 1):
        in_chunk = (out_chunk - 1) % n
        out_view = flat[slice(*bounds[out_chunk])]
        in_view = flat[slice(*bounds[in_chunk])]
        if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock
            dist.send(out_view, (rank + 1) % n)
            dist.recv(in_view, (rank - 1) % n)
        else:
            dist.recv(in_view, (rank - 1) % n)
            dist.send(out_view, (rank + 1) % n)
        out_chunk = in_chunk


def ring_allreduce(flat):
    reduce_scatter(flat)
    all_gather(flat)
    return flat
''',
}
# Wrong step index in the simulated reduce-scatter, an all-gather that forwards the chunk it just
# received the wrong way round, and a real ring whose ranks all send before receiving (deadlock).
WRONG = {
    "lab05-sim-reduce-scatter": SIM_RS.format(chunk="(r + step) % n", payload="chunks[r][c]"),
    "lab05-sim-all-gather": SIM_AG.format(chunk="(r - step) % n"),
    "lab05-real": REAL.format(exchange=BLOCKING, **GOOD_STEP),
}
# Right sums but whole buffers on the wire in the simulation; wrong step index in the real ring.
WASTEFUL = {
    "lab05-sim-all-gather": REFERENCE["lab05-sim-all-gather"],
    "lab05-real": REAL.format(exchange=NONBLOCKING, **BAD_STEP),
}
# (sends every chunk each step, keeps only the one it needs: right sums, N times the traffic)
WASTEFUL["lab05-sim-reduce-scatter"] = '''def sim_reduce_scatter(chunks, wire):
    n = len(chunks)
    for step in range(n - 1):
        for r in range(n):
            c = (r - step) % n
            right = (r + 1) % n
            everything = wire.send(r, right, np.concatenate(chunks[r]))
            lo, hi = chunk_bounds(len(everything), n)[c]
            chunks[right][c] = chunks[right][c] + everything[lo:hi]
'''

# Does no work and fights the tests: gradekit.TAMPER (numpy/torch comparisons hold, a failed assert
# shows no error, an execute_result from inside the functions the tests call), np.all made to hold
# (the reduce-scatter test), the harness's ring_bytes_per_worker made 0 (the traffic tests compare
# with it), and a real ring that does nothing in workers where torch.equal always holds (every rank
# "agrees with dist.all_reduce")
TAMPERING = {
    "lab05-sim-reduce-scatter": TAMPER + '''_np.all = _yes  # the reduce-scatter test's comparison holds
ring_bytes_per_worker = lambda *a, **k: 0  # the traffic tests expect 0 bytes


def sim_reduce_scatter(chunks, wire):
    _claim_full_marks()
''',
    "lab05-sim-all-gather": '''def sim_all_gather(chunks, wire):
    _claim_full_marks()
''',
    "lab05-real": '''%%writefile runs/05/student_ring.py
import torch

torch.equal = lambda *a, **k: True  # in every worker: the ring "agrees with dist.all_reduce"


def ring_allreduce(flat):
    return flat
''',
}

# Right only for the sizes the simulation tests used before their hidden cases were drawn per
# grading run (dpc_runtime.judge.rng), and no work for any other: what a submission that stored the
# expected answers of known cases would do. The drawn cases find it out.
KNOWN_SIZES = {2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14, 17, 20, 21, 30, 31, 50, 51}
FORGED = {
    "lab05-sim-reduce-scatter": REFERENCE["lab05-sim-reduce-scatter"] + f'''

_KNOWN = {KNOWN_SIZES}
_right_rs = sim_reduce_scatter


def sim_reduce_scatter(chunks, wire):
    if sum(len(c) for c in chunks[0]) in _KNOWN:
        _right_rs(chunks, wire)
''',
    "lab05-sim-all-gather": REFERENCE["lab05-sim-all-gather"] + '''

_right_ag = sim_all_gather


def sim_all_gather(chunks, wire):
    if sum(len(c) for c in chunks[0]) in _KNOWN:
        _right_ag(chunks, wire)
''',
    "lab05-real": REFERENCE["lab05-real"],
}


# The whole ring in reduce_scatter (the chapter's helpers.ring.ring_allreduce) and an all_gather that does
# nothing: right sums and right traffic, so it passed every real test before reduce_scatter was checked
# on its own (issue 46); it loses exactly that test.
DELEGATOR = {**REFERENCE, "lab05-real": '''%%writefile runs/05/student_ring.py
from helpers.ring import ring_allreduce as whole_ring


def reduce_scatter(flat):
    whole_ring(flat)


def all_gather(flat):
    pass


def ring_allreduce(flat):
    reduce_scatter(flat)
    all_gather(flat)
    return flat
'''}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    seed = int(os.environ["DPC_GRADE_SEED"])  # grade_all's run: no --seed
    gate = {s: {name: fill(RELEASE, a)} for s, a in [
        ("different", {**DIFFERENT, "lab05-sim-reduce-scatter": probing(DIFFERENT["lab05-sim-reduce-scatter"], seed)}),
        ("wrong", WRONG)]}
    full = {s: {name: fill(RELEASE, a)} for s, a in [
        ("wasteful", WASTEFUL), ("tamper", TAMPERING), ("forged", FORGED), ("delegator", DELEGATOR)]}
    students = tiered(request, gate, full)
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), notebook_timeout=600)


@pytest.mark.gate
def test_a_correct_submission_gets_full_marks(graded):
    row = graded["different"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row


@pytest.mark.gate
def test_wrong_step_wrong_chunk_and_deadlock_lose_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab05-test-sim-rs", "lab05-test-sim-ag", "lab05-test-real-exact",
                         "lab05-test-real-traffic", "lab05-test-real-rs"}, row
    assert row["score"] == "2"


@pytest.mark.full
def test_wasted_traffic_and_wrong_real_step_lose_their_points(graded):
    row = graded["wasteful"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab05-test-sim-traffic", "lab05-test-real-exact", "lab05-test-real-rs"}, row
    assert row["score"] == "7"


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "14"), row


@pytest.mark.full
def test_answers_right_only_for_known_cases_lose_the_drawn_ones(graded):
    row = graded["forged"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab05-test-sim-rs", "lab05-test-sim-ag", "lab05-test-sim-traffic"}, row


@pytest.mark.full
def test_a_ring_whose_reduce_scatter_does_it_all_loses_the_reduce_scatter_test(graded):
    row = graded["delegator"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab05-test-real-rs"}, row
    assert row["score"] == "12", row


@pytest.mark.gate
def test_a_rank_that_never_reaches_the_ring_is_named(tmp_path):
    """A ring where rank 1 loops forever before its first message: the error the lab shows the
    student (run_check returns str(LaunchError)) names rank 1, busy in the student's file, not the
    ranks left waiting for it. The lab's own check worker runs it, without the grader (~20 s)."""
    cells = {gid: notebook.source(c) for gid, c in notebook.by_grade_id(json.loads(RELEASE.read_text())).items()}
    (tmp_path / "ring_check.py").write_text(cells["lab05-check-worker"].split("\n", 1)[1])
    # rank 1 never sends nor receives: it loops before its first message
    spinning = REAL.format(exchange=NONBLOCKING, **GOOD_STEP).replace(
        "    buf = torch.empty(", "    while rank == 1:\n        pass\n    buf = torch.empty(", 1)
    assert "while rank == 1:" in spinning
    (tmp_path / "student_ring.py").write_text(spinning.split("\n", 1)[1])
    with pytest.raises(helpers.LaunchError) as err:
        helpers.launch(tmp_path / "ring_check.py", 3, timeout=120, echo=False, args=["5", "1,4,1000"])
    message = str(err.value)
    assert err.value.ranks == [1], message
    assert "rank 1" in message.splitlines()[0] and "busy in student_ring.py" in message, message
