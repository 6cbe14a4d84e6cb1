"""Lab 6 (Horovod) graded end to end: submissions built from the student copy in labs/ are launched
with horovodrun and autograded by src/dpc_instructor/grade.py.

A correct answer written differently from the reference gets full marks (contiguous shards of
each global batch, the loss summed and divided, the broadcast before the wrapper; the resume done
the chapter's way: rank 0 restores, broadcast_parameters and broadcast_optimizer_state send the
tensors, broadcast_object the step and the schedule's state); the reference itself passes, or the
grader refuses to grade (dpc_instructor.grading.reference.reference). The typical mistakes lose exactly the
points of the tests they break: without the broadcast the ranks drift apart (and away from the
single-process run), a loss that is not averaged over the ranks shows in the loss log, every rank
writing checkpoints shows in the checkpoint log; a resume that sends the others the weights, the
momentum and the step but not the schedule's position restarts their warm-up (the ranks drift apart,
away from the run that never stopped, and their learning rates differ from it). A worker that never
shards (every rank trains on the whole global batch: its weights still match) loses the matching
test, whose hidden part checks the ranks' own losses, and a resume where every rank reads the
checkpoint itself (the result is right) loses the test of who read it. A submission whose scripts do
no work and that fights the tests from a cell of its own in the kernel (gradekit.TAMPER) gets
nothing: every test cell's recorded values are judged outside the kernel. Each submission costs
three launches (a single-process reference, two horovodrun jobs).
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill, tiered

LAB = "06-horovod"
RELEASE = ROOT / "labs" / LAB / "horovod.ipynb"
SOURCE = ROOT / "solutions" / LAB / "horovod.ipynb"
ANSWERS = ("lab06-torch-script", "lab06-resume-script")



def edit(text: str, old: str, new: str) -> str:
    """text with old replaced by new (old must be there: the mistake must really be made)."""
    assert old in text, f"{old!r} not in the solution: update the mistakes of this test"
    return text.replace(old, new)


CORRECT = reference_answers(SOURCE, ANSWERS)

# Correct, written differently: the conversion broadcasts before wrapping, cuts each global batch
# into contiguous chunks (any equal split gives the same mean gradient), sums the losses and divides;
# the resume restores on rank 0 only and sends the state the chapter's way (broadcast_parameters,
# broadcast_optimizer_state) plus the step and the schedule's state with broadcast_object, and skips
# the steps done with `continue`.
GIVEN_TORCH = CORRECT["lab06-torch-script"].split("    model = make_model()")[0]
GIVEN_RESUME = CORRECT["lab06-resume-script"].split("    model = make_model()")[0]
TAIL = """

if __name__ == "__main__":
"""
OTHER = {
    "lab06-torch-script": GIVEN_TORCH + """    size, rank = hvd.size(), hvd.rank()
    model = make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sgd = torch.optim.SGD(model.parameters(), lr=size * BASE_LR, momentum=0.9, nesterov=True)
    hvd.broadcast_optimizer_state(sgd, root_rank=0)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), op=hvd.Average)
    warmup = make_schedule(opt)
    batches = global_batches(BATCH_SIZE * size, STEPS)
    for step in range(1, STEPS + 1):
        x, y = next(batches)
        my_loss = train_step(model, opt, x.chunk(size)[rank], y.chunk(size)[rank])
        warmup.step()
        if step % LOG_EVERY == 0:
            total = hvd.allreduce(torch.tensor([my_loss]), op=hvd.Sum, name=f"sum{step}")
            if rank == 0:
                log_loss(step, total.item() / size, OUT)
        if rank == 0 and step in range(CKPT_EVERY, STEPS + 1, CKPT_EVERY):
            save_checkpoint(model, opt, warmup, step, OUT)
    report(model, opt, OUT)
""" + TAIL + CORRECT["lab06-torch-script"].split(TAIL)[1],
    "lab06-resume-script": GIVEN_RESUME + """    size, rank = hvd.size(), hvd.rank()
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=size * BASE_LR, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    warmup = make_schedule(opt)
    done = restore(load_checkpoint(args.resume, OUT), model, opt, warmup) if rank == 0 else 0
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    done, position = hvd.broadcast_object((done, warmup.state_dict()), root_rank=0, name="resume")
    warmup.load_state_dict(position)
    for step, (x, y) in enumerate(global_batches(BATCH_SIZE * size, STEPS), start=1):
        if step <= done:
            continue
        train_step(model, opt, x.chunk(size)[rank], y.chunk(size)[rank])
        warmup.step()
    report(model, opt, OUT)
""" + TAIL + CORRECT["lab06-resume-script"].split(TAIL)[1],
}

# PyTorch: no broadcast of rank 0's state, rank 0's own loss logged, every rank writes checkpoints.
_torch = edit(CORRECT["lab06-torch-script"],
              "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", "")
_torch = edit(_torch, "    hvd.broadcast_optimizer_state(opt, root_rank=0)\n", "")
_torch = edit(_torch, 'mean_loss = hvd.allreduce(torch.tensor([loss]), name="loss").item()', "mean_loss = loss")
_torch = edit(_torch, "if hvd.rank() == 0 and step % CKPT_EVERY == 0:", "if step % CKPT_EVERY == 0:")
# Resume: rank 0 restores and sends the others the weights, the momentum (the chapter's step 5) and
# the step, but not the schedule's position: their warm-up starts over.
_resume = edit(OTHER["lab06-resume-script"],
               """    done, position = hvd.broadcast_object((done, warmup.state_dict()), root_rank=0, name="resume")
    warmup.load_state_dict(position)
""", """    done = hvd.broadcast_object(done, root_rank=0, name="step")
""")
WRONG = {"lab06-torch-script": _torch, "lab06-resume-script": _resume}
# Narrow mistakes. Conversion: every rank trains on the whole global batch (no shard). The averaged
# gradient is then the global batch's, so the weights still match one process: only the sharding check
# (hidden, in the matching test) sees it, from the ranks' own losses. Resume: every rank reads the
# checkpoint itself (rank 0's copy is still the one broadcast, so the run is right): only the test of
# who read it sees it.
NARROW = {"lab06-torch-script": edit(CORRECT["lab06-torch-script"], "train_step(model, opt, x[shard], y[shard])",
                                     "train_step(model, opt, x, y)"),
          "lab06-resume-script": edit(CORRECT["lab06-resume-script"],
                                      "load_checkpoint(args.resume, OUT) if hvd.rank() == 0 else None",
                                      "load_checkpoint(args.resume, OUT)")}

NO_WORK = {gid: given + "    pass" + TAIL + "    start(backend=None)\n    main()\n    finish()\n"
           for gid, given in (("lab06-torch-script", GIVEN_TORCH), ("lab06-resume-script", GIVEN_RESUME))}


def tampering() -> dict:
    """NO_WORK, plus a cell of the student's own, right after the imports, that fights the tests."""
    nb = fill(RELEASE, NO_WORK)
    at = next(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {})
              .get("grade_id") == "lab06-imports")
    nb["cells"].insert(at + 1, {"cell_type": "code", "execution_count": None, "id": "tamper01",
                                "metadata": {}, "outputs": [], "source": TAMPER})
    return nb


TESTS = {  # test cell -> points
    "lab06-test-torch-consistent": 2, "lab06-test-torch-matches": 2, "lab06-test-torch-lr": 1,
    "lab06-test-torch-metrics": 1, "lab06-test-torch-checkpoints": 2,
    "lab06-test-resume-consistent": 1, "lab06-test-resume-matches": 2, "lab06-test-resume-lr": 1,
    "lab06-test-resume-read": 1,
}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = tiered(request, {"other": {name: fill(RELEASE, OTHER)}, "wrong": {name: fill(RELEASE, WRONG)}},
                      {"narrow": {name: fill(RELEASE, NARROW)}, "tamper": {name: tampering()}})
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), notebook_timeout=900)


@pytest.mark.gate
def test_every_test_cell_is_in_the_csv(graded):
    assert set(TESTS) <= set(graded["other"]), sorted(graded["other"])


@pytest.mark.gate
def test_a_correct_conversion_gets_full_marks(graded):
    row = graded["other"]
    assert row["status"] == "graded", row["status"]
    assert {k: float(row[k]) for k in TESTS} == {k: float(v) for k, v in TESTS.items()}
    assert (float(row["score"]), float(row["max_score"])) == (sum(TESTS.values()),) * 2


@pytest.mark.gate
def test_typical_mistakes_lose_exactly_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row["status"]
    # No broadcast: ranks disagree, and rank 0 no longer matches one process on the global batch;
    # rank 0's own loss in the log: the metrics test; every rank checkpointing: the log names rank 1
    # too. The lr after the warm-up is right: kept. Resume without the schedule's position: the other
    # ranks' warm-up starts over, so they drift apart, away from the uninterrupted run, with other
    # learning rates; only rank 0 read the checkpoint: kept.
    assert lost(row) == {"lab06-test-torch-consistent", "lab06-test-torch-matches", "lab06-test-torch-metrics",
                         "lab06-test-torch-checkpoints", "lab06-test-resume-consistent",
                         "lab06-test-resume-matches", "lab06-test-resume-lr"}
    assert float(row["score"]) == 1 + 1  # torch-lr, resume-read


@pytest.mark.full
def test_narrow_mistakes_lose_only_the_test_that_sees_them(graded):
    row = graded["narrow"]
    assert row["status"] == "graded", row["status"]
    assert lost(row) == {"lab06-test-torch-matches", "lab06-test-resume-read"}, row
    assert float(row["score"]) == sum(TESTS.values()) - 2 - 1


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], float(row["score"])) == ("graded", 0.0), row
