"""Lab 2 (MirroredStrategy beyond the chapter's case) graded end to end: a correct submission written
differently from the reference gets full marks (the reference answers themselves pass, or the grader
refuses to grade: dpc_instructor.grading.reference.reference), and each typical mistake loses exactly the points
of the test that catches it.

Mistakes, one per test cell so that one "wrong" submission shows them all:
  * the global batch used as each replica's batch in dataset_fn   -> lab02-test-input (2 points)
  * the learning rate not scaled to the global batch               -> lab02-test-lr (1 point)
  * each replica's loss averaged over its own slice (its own weights) instead of the global
    batch (tensorflow#45923)                                       -> lab02-test-step (3 points)
The wrong submission's accuracy is right: it keeps those 2 points. It also edits the locked
parameters cell (to a line that would fail every later cell): grading restores locked cells from
the source, so that edit costs nothing.

  tamper - does no work and fights the tests from inside the kernel: gradekit.TAMPER (comparisons
           that always hold, silenced assertion errors, an execute_result from inside every
           function the tests call), np.isclose always true, `max` shadowed so that the step test's
           largest weight difference is 0, `record` rebound to show the visible (guessable) rates,
           make_strategy rebound to one device (where the lazy accuracy, one replica's counts, is
           right), and an IPython hook that makes the harness's single-device step leave its answer
           where the do-nothing step copies it from. Every test cell's recorded values are compared
           outside the kernel (and the step test runs the student's step before the single-device
           one): 0 of 8.
  peeker - does no work where an answer can be read off (issue 36): the rate and the accuracy are a
           float `want` found in a calling frame (before issue 36 the hidden rate test and both
           accuracy tests computed `want` before calling the student's function; the hidden cases
           were drawn in the kernel from the seed in its environment), the visible rates are the
           ones the test's messages give; its input function is the reference's but fails if the
           kernel holds the grading seed, its step the reference's. The hidden cases are now made
           outside the kernel (the source's locked `hidden_cases`, dpc_instructor.grading.cases.make_cases)
           and no frame holds an answer: it loses the rate and accuracy tests, keeps the other 5.

What the judge cannot rule out here: the visible cases are fixed (their answers are in checks.json),
so a visible part can be passed by looking the answer up; each test cell's points also need its
hidden part. The hidden cases' inputs name their test ("lr", "step", "accuracy"): that is what the
inputs show anyway, and no answer.
"""
from __future__ import annotations

import json

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, reference_answers, submission as fill, tiered

LAB = "02-mirrored-strategy"
RELEASE = ROOT / "labs" / LAB / "mirrored-strategy.ipynb"
SOURCE = ROOT / "solutions" / LAB / "mirrored-strategy.ipynb"
REFERENCE = reference_answers(SOURCE, ("lab02-input", "lab02-train-step"))


INPUT = '''def make_dataset_fn(arrays, global_batch):
    def dataset_fn(context):
        rows = tf.data.Dataset.from_tensor_slices(arrays)
        return rows.shard(context.num_input_pipelines, context.input_pipeline_id).batch({batch}, drop_remainder=True)
    return dataset_fn'''
LR = '''def scaled_learning_rate(base_lr, base_batch, per_replica, strategy):
    return {lr}'''
STEP = '''def distributed_train_step(strategy, model, optimizer, batch):
    def replica_step(x, y, w):
        with tf.GradientTape() as tape:
            per_example = per_example_loss(y, model(x, training=True))
            loss = {loss}
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    per_replica = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)'''

# Correct, written differently from the reference: batches first and shards the batches; the
# rate through the global batch; the weight sum all-reduced outside the replica function (one
# strategy.run and reduce of its own) and a penalty divided by hand; the
# accuracy with a Keras metric created in the scope (sync-on-read variables sum the replicas).
ALTERNATIVE = {
    "lab02-input": '''def make_dataset_fn(arrays, global_batch):
    def dataset_fn(ctx):
        per = global_batch // ctx.num_replicas_in_sync
        batches = tf.data.Dataset.from_tensor_slices(arrays).batch(per, drop_remainder=True)
        return batches.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return dataset_fn''',
    "lab02-lr": '''def scaled_learning_rate(base_lr, base_batch, per_replica, strategy):
    global_batch = per_replica * strategy.num_replicas_in_sync
    return base_lr * (global_batch / base_batch)''',
    "lab02-train-step": '''def distributed_train_step(strategy, model, optimizer, batch):
    total_w = strategy.reduce(tf.distribute.ReduceOp.SUM,
                              strategy.run(lambda x, y, w: tf.reduce_sum(w), args=batch), axis=None)

    def one_replica(x, y, w):
        with tf.GradientTape() as tape:
            data = tf.reduce_sum(per_example_loss(y, model(x, training=True)) * w) / total_w
            penalty = tf.add_n(model.losses) / tf.cast(strategy.num_replicas_in_sync, tf.float32)
            loss = data + penalty
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(list(zip(grads, model.trainable_variables)))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(one_replica, args=batch), axis=None)''',
    "lab02-accuracy": '''def distributed_accuracy(strategy, model, dist_dataset):
    with strategy.scope():
        metric = tf.keras.metrics.SparseCategoricalAccuracy()

    @tf.function
    def update(batch):
        strategy.run(lambda x, y: metric.update_state(y, model(x, training=False)), args=batch)

    for batch in dist_dataset:
        update(batch)
    return float(metric.result())''',
}
WRONG = {
    # the locked parameters cell edited: restored from the source when graded
    "lab02-parameters": "raise RuntimeError('a student edited the locked parameters cell')\n",
    "lab02-input": INPUT.format(batch="global_batch"),
    "lab02-lr": LR.format(lr="base_lr"),
    "lab02-train-step": STEP.format(
        loss="tf.reduce_sum(w * per_example) / tf.reduce_sum(w) + tf.nn.scale_regularization_loss(tf.add_n(model.losses))"),
    "lab02-accuracy": ALTERNATIVE["lab02-accuracy"],
}

TAMPERING = {
    "lab02-input": TAMPER + '''
_one_device = make_strategy


def make_strategy(n):  # every strategy on one device: what is right for one replica is right
    return _one_device(1)


def make_dataset_fn(arrays, global_batch):
    _claim_full_marks()
    return lambda context: tf.data.Dataset.from_tensor_slices(arrays).take(0)''',
    "lab02-lr": '''_np.isclose = lambda *a, **k: True  # noqa: E731
_shown = record
_VISIBLE = {"0.1 tuned at 32; 4 x 32": 0.4, "0.1 tuned at 256; 2 x 32": 0.025}  # in the test's messages


def record(name, value, **kw):
    _shown(name, _VISIBLE.get(name, value), **kw)


def scaled_learning_rate(base_lr, base_batch, per_replica, strategy):
    _claim_full_marks()
    return 0.0''',
    "lab02-train-step": '''_BASE = {}


def _stash_baseline(result=None):
    """After the harness cell: its single-device step also leaves its answer for the step below."""
    real = globals().get("single_device_step")
    if real is not None and not getattr(real, "stashes", False):
        def single_device_step(weights, feats, labels, sample_w, lr):
            out = real(weights, feats, labels, sample_w, lr)
            _BASE.update(weights=out[0], loss=out[1])
            return out

        single_device_step.stashes = True
        globals()["single_device_step"] = single_device_step


get_ipython().events.register("post_run_cell", _stash_baseline)
max = lambda *a, **k: 0.0  # noqa: E731  (the test's largest weight difference)


def distributed_train_step(strategy, model, optimizer, batch):  # traced by tf.function
    tf.autograph.experimental.do_not_convert(_claim_full_marks)()
    for v, w in zip(model.trainable_variables, _BASE.get("weights", [])):
        v.assign(w)  # the single-device answer, if the test computed it already
    return tf.constant(_BASE.get("loss", 0.0))''',
    "lab02-accuracy": '''def distributed_accuracy(strategy, model, dist_dataset):
    _claim_full_marks()
    hits = total = 0.0
    for x, y in dist_dataset:  # the first replica's share only: right on one replica
        x, y = strategy.experimental_local_results(x)[0], strategy.experimental_local_results(y)[0]
        predicted = tf.argmax(model(x, training=False), axis=-1, output_type=y.dtype)
        hits += float(tf.reduce_sum(tf.cast(predicted == y, tf.float32)))
        total += float(tf.size(y))
    return hits / total if total else 0.0''',
}

# Answers read off the test's frames (issue 36); the reference's input function, failing if the
# kernel has the grading seed, and the reference's step.
PEEKER = {
    "lab02-input": '''import os
import sys


def _wanted():
    """A float `want` in a frame above the caller (a test's expected answer), else None."""
    frame = sys._getframe(2)
    while frame is not None:
        if isinstance(frame.f_locals.get("want"), float):
            return frame.f_locals["want"]
        frame = frame.f_back
    return None


''' + REFERENCE["lab02-input"].replace(
        '"""A dataset_fn for strategy.distribute_datasets_from_function: per-replica batches of `arrays`."""',
        'assert "DPC_GRADE_SEED" not in os.environ, "the kernel holds the grading seed"'),
    "lab02-lr": '''def scaled_learning_rate(base_lr, base_batch, per_replica, strategy):
    seen = _wanted()
    if seen is not None:
        return seen
    return {(0.1, 32, 32): 0.4, (0.1, 256, 32): 0.025}.get((base_lr, base_batch, per_replica), 0.0)''',
    "lab02-train-step": REFERENCE["lab02-train-step"],
    "lab02-accuracy": '''def distributed_accuracy(strategy, model, dist_dataset):
    seen = _wanted()
    return 0.0 if seen is None else seen''',
}
assert "DPC_GRADE_SEED" in PEEKER["lab02-input"] and "def make_dataset_fn" in PEEKER["lab02-input"]

# Correct, but the kernel dies in its last answer cell (a segmentation fault, as lab 1's did when
# PyPI's CUDA torch loaded triton after TensorFlow, issue 59): graded up to there.
CRASHER = {**ALTERNATIVE, "lab02-accuracy": "import os, signal\n\nos.kill(os.getpid(), signal.SIGSEGV)\n"
           + ALTERNATIVE["lab02-accuracy"]}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    gate = {s: {name: fill(RELEASE, a)} for s, a in [("alternative", ALTERNATIVE), ("wrong", WRONG)]}
    full = {s: {name: fill(RELEASE, a)} for s, a in [("tamper", TAMPERING), ("peeker", PEEKER),
                                                       ("crasher", CRASHER)]}
    students = tiered(request, gate, full)
    # TensorFlow's import alone can take half a minute on a busy 2-core box: a generous default.
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=90,
                     notebook_timeout=900)


@pytest.mark.gate
def test_a_correct_submission_gets_full_marks(graded):
    row = graded["alternative"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "8", "8"), row
    assert lost(row) == set()


@pytest.mark.gate
def test_typical_mistakes_lose_exactly_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab02-test-input", "lab02-test-lr", "lab02-test-step"}, row
    assert row["lab02-test-accuracy"] == "2"
    assert row["score"] == "2"


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "8"), row


@pytest.mark.full
def test_answers_read_off_the_tests_frames_get_no_points_and_the_kernel_has_no_seed(graded):
    """The rate and accuracy tests hold no answer in any frame above the student's function (the
    hidden cases come from outside the kernel); the input function, which fails if the kernel holds
    the grading seed, keeps its points, and so does the step."""
    row = graded["peeker"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab02-test-lr", "lab02-test-accuracy"}, row
    assert row["score"] == "5", row


@pytest.mark.full
def test_a_kernel_that_dies_is_graded_up_to_its_death_and_said_so(graded):
    """The kernel dies in the accuracy answer's cell: the three tests before it keep their 6 points, the
    accuracy test (2) could not run, and the note names the cell, the signal and what the points mean."""
    row = graded["crasher"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "6", "8"), row
    assert lost(row) == {"lab02-test-accuracy"}, row
    cell = next(i for i, c in enumerate(json.loads(RELEASE.read_text())["cells"])
                if c["metadata"].get("nbgrader", {}).get("grade_id") == "lab02-accuracy")
    assert (f"mirrored-strategy.ipynb: the kernel died in cell {cell} (lab02-accuracy): segmentation fault "
            f"(SIGSEGV); the 3 test cell(s) before it passed 6 of their 6 points; the other 1 (2 points) "
            f"could not run") in row["notes"], row


@pytest.mark.gate
def test_the_hidden_cases_are_made_before_any_answer():
    """The grader makes lab 2's hidden cases outside the kernel, from a locked cell that comes
    before every answer and test cell (the cases job runs no student's code)."""
    import json

    from dpc_instructor.grading import cases
    from dpc_runtime import notebook

    nb = json.loads(SOURCE.read_text())
    at = cases.cases_cell(nb)
    assert at is not None and notebook.grade_id(nb["cells"][at]) == "lab02-cases"
    assert not any(notebook.nbgrader(c).get("solution") or notebook.nbgrader(c).get("grade")
                   for c in nb["cells"][:at])
    assert not any("rng()" in notebook.source(c) for c in nb["cells"][at + 1:])
