"""Lab 6 (Horovod) graded end to end: submissions built from the student copy in labs/ are launched
with horovodrun and autograded by src/dpc_instructor/grade.py.

A correct conversion written differently from the reference gets full marks (contiguous shards of
each global batch, the loss summed and divided, the broadcast before the wrapper; in Keras an
unscaled optimizer whose schedule callback returns the scaled rates, a boolean shard mask); the
reference itself passes, or the grader refuses to grade (dpc_instructor.grade.reference). The
typical mistakes lose exactly the points of the tests they break: without the broadcast the PyTorch
ranks drift apart (and away from the single-process run), a loss that is not averaged over the ranks
shows in the loss log, every rank writing checkpoints shows in the checkpoint log, and a Keras
schedule that returns unscaled rates no longer matches one process on the global batch, and a
PyTorch worker that never shards (every rank trains on the whole global batch: its weights still
match) loses the matching test, whose hidden part checks the ranks' own losses. A submission whose
scripts do no work and that fights the tests from a cell of its own in the kernel (gradekit.TAMPER)
gets nothing: every test cell's recorded values are judged outside the kernel. Each submission
costs four launches (two single-process references, two horovodrun jobs).
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill

LAB = "06-horovod"
RELEASE = ROOT / "labs" / LAB / "horovod.ipynb"
SOURCE = ROOT / "solutions" / LAB / "horovod.ipynb"
ANSWERS = ("lab06-torch-script", "lab06-keras-script")



def edit(text: str, old: str, new: str) -> str:
    """text with old replaced by new (old must be there: the mistake must really be made)."""
    assert old in text, f"{old!r} not in the solution: update the mistakes of this test"
    return text.replace(old, new)


CORRECT = reference_answers(SOURCE, ANSWERS)

# Correct, written differently: PyTorch broadcasts before wrapping, cuts each global batch into
# contiguous chunks (any equal split gives the same mean gradient), sums the losses and divides;
# Keras compiles an unscaled SGD and lets the schedule callback (which sets the rate at every epoch's
# start) return the scaled rates, and shards with a boolean mask.
GIVEN_TORCH = CORRECT["lab06-torch-script"].split("    model = make_model()")[0]
GIVEN_KERAS = CORRECT["lab06-keras-script"].split("    model = make_model()")[0]
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
            save_checkpoint(model, opt, step, OUT)
    report(model, opt, OUT)
""" + TAIL + CORRECT["lab06-torch-script"].split(TAIL)[1],
    "lab06-keras-script": GIVEN_KERAS + """    import numpy as np
    size, rank = hvd.size(), hvd.rank()
    model = make_model()
    broadcast_variables(model.trainable_weights + model.non_trainable_weights, root_rank=0)
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(momentum=0.9)))
    data_x, data_y = make_data()
    mine = np.arange(len(data_x)) % size == rank
    cbs = [keras.callbacks.LearningRateScheduler(lambda epoch, lr: size * lr_at(epoch)),
           hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0)]
    cbs += [Checkpoint(OUT)] if rank == 0 else []
    model.fit(data_x[mine], data_y[mine], batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False,
              callbacks=cbs, verbose=0)
    report(model, OUT)
""" + TAIL + CORRECT["lab06-keras-script"].split(TAIL)[1],
}

# PyTorch: no broadcast of rank 0's state, rank 0's own loss logged, every rank writes checkpoints.
_torch = edit(CORRECT["lab06-torch-script"],
              "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", "")
_torch = edit(_torch, "    hvd.broadcast_optimizer_state(opt, root_rank=0)\n", "")
_torch = edit(_torch, 'mean_loss = hvd.allreduce(torch.tensor([loss]), name="loss").item()', "mean_loss = loss")
_torch = edit(_torch, "if hvd.rank() == 0 and step % CKPT_EVERY == 0:", "if step % CKPT_EVERY == 0:")
# Keras: the optimizer's lr is scaled, but the schedule callback, which overrides it, is not.
_keras = edit(CORRECT["lab06-keras-script"], "lambda epoch: lr_at(epoch, hvd.size())", "lambda epoch: lr_at(epoch)")
WRONG = {"lab06-torch-script": _torch, "lab06-keras-script": _keras}
# PyTorch: every rank trains on the whole global batch (no shard). The averaged gradient is then the
# global batch's, so the weights still match one process: only the sharding check (hidden, in the
# matching test) sees it, from the ranks' own losses.
UNSHARDED = {**CORRECT, "lab06-torch-script": edit(CORRECT["lab06-torch-script"],
                                                   "train_step(model, opt, x[shard], y[shard])",
                                                   "train_step(model, opt, x, y)")}

NO_WORK = {gid: given + "    pass" + TAIL + "    start(backend=None)\n    main()\n    finish()\n"
           for gid, given in (("lab06-torch-script", GIVEN_TORCH), ("lab06-keras-script", GIVEN_KERAS))}


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
    "lab06-test-keras-consistent": 1, "lab06-test-keras-matches": 2, "lab06-test-keras-lr": 1,
    "lab06-test-keras-checkpoints": 1,
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {"other": {name: fill(RELEASE, OTHER)}, "wrong": {name: fill(RELEASE, WRONG)},
                "unsharded": {name: fill(RELEASE, UNSHARDED)}, "tamper": {name: tampering()}}
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), notebook_timeout=900)


def test_every_test_cell_is_in_the_csv(graded):
    assert set(TESTS) <= set(graded["other"]), sorted(graded["other"])


def test_a_correct_conversion_gets_full_marks(graded):
    row = graded["other"]
    assert row["status"] == "graded", row["status"]
    assert {k: float(row[k]) for k in TESTS} == {k: float(v) for k, v in TESTS.items()}
    assert (float(row["score"]), float(row["max_score"])) == (sum(TESTS.values()),) * 2


def test_typical_mistakes_lose_exactly_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row["status"]
    # No broadcast: ranks disagree, and rank 0 no longer matches one process on the global batch;
    # rank 0's own loss in the log: the metrics test; every rank checkpointing: the log names rank 1
    # too. The PyTorch lr is right: kept. Unscaled Keras schedule: the lr test and the match with the
    # single-process run fail; the ranks still agree with each other and only rank 0 checkpoints: kept.
    assert lost(row) == {"lab06-test-torch-consistent", "lab06-test-torch-matches", "lab06-test-torch-metrics",
                         "lab06-test-torch-checkpoints", "lab06-test-keras-matches", "lab06-test-keras-lr"}
    assert float(row["score"]) == 1 + 1 + 1  # torch-lr, keras-consistent, keras-checkpoints


def test_a_worker_that_never_shards_loses_the_matching_test(graded):
    row = graded["unsharded"]
    assert row["status"] == "graded", row["status"]
    assert lost(row) == {"lab06-test-torch-matches"}, row
    assert float(row["score"]) == sum(TESTS.values()) - 2


def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], float(row["score"])) == ("graded", 0.0), row
