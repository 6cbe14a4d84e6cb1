"""Lab 4 (manual towers) graded end to end: submissions built from the student copy in labs/ are
autograded by src/dpc_instructor/grade.py; a correct submission gets full marks and the typical mistakes lose
exactly the points of the tests they break.

Four submissions keep it cheap (each grading run starts TensorFlow with 4 logical devices):
  correct  - a correct solution written differently from the reference (an index loop and
             tf.tensordot for the average; the clipping scale computed by hand from the global norm);
  summing  - sums the tower gradients instead of averaging them, and gives every tower the whole
             batch (forgot to split): loses the plain-average test, the equality test (N times
             too large a step) and the split test — and nothing else: with the whole batch on
             every tower the weighted average and the loss happen to stay right, and clipping N
             times the gradient to a norm below the gradient's gives the same clipped step;
  unweighted - averages gradients and losses without the shares when the slices are uneven, clips
             every tower's gradient before averaging, and keeps a gradient buffer per tower as new
             tf.Variables: loses the uneven-split test, the loss test, the clipping test and the
             shared-variables test;
  own variables - every tower works on its own copy of the model (clone_model + set_weights) and
             its gradients are applied to the model's variables: the numbers and the slices are
             right, so it loses the shared-variables test and nothing else (the test that watches
             the slices records inside the model, so it sees the copies' forward passes too);
  tamper   - does no work and fights the tests from inside the kernel (gradekit.TAMPER, plus the
             harness's max_abs_diff made to see no difference): got 14/14 before the judge, 0 now —
             every test cell's recorded values are compared outside the kernel.
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, submission as fill

LAB = "04-manual-towers"
RELEASE = ROOT / "labs" / LAB / "manual-towers.ipynb"

AVERAGE = '''def average_gradients(tower_grads, weights=None):
    n = len(tower_grads)
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights)
    out = []
    for k in range(len(tower_grads[0])):
        stacked = tf.stack([tower[k][0] for tower in tower_grads])
        out.append((tf.tensordot(tf.constant(w, stacked.dtype), stacked, axes=1), tower_grads[0][k][1]))
    return out'''

STEP = '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    n = len(devices)
    sizes = sizes or [x.shape[0] // n] * n
    shares = [s / sum(sizes) for s in sizes]
    xs, ys = tf.split(x, sizes), tf.split(y, sizes)
    tower_grads, losses = [], []
    for i, d in enumerate(devices):
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
        tower_grads.append(list(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables)))
        losses.append(loss)
    avg = average_gradients(tower_grads, shares)
    if clip_norm:
        scale = tf.minimum(1.0, clip_norm / tf.linalg.global_norm([g for g, _ in avg]))
        avg = [(g * scale, v) for g, v in avg]
    optimizer.apply_gradients(avg)
    return sum(s * l for s, l in zip(shares, losses))'''

CORRECT = {"lab04-average-gradients": AVERAGE, "lab04-tower-step": STEP}

SUMMING = {
    # The plain path sums; the weighted path is right.
    "lab04-average-gradients": '''def average_gradients(tower_grads, weights=None):
    out = []
    for pairs in zip(*tower_grads):
        grads = [g for g, _ in pairs]
        if weights is None:
            out.append((tf.add_n(grads), pairs[0][1]))
        else:
            out.append((tf.add_n([w * g for w, g in zip(weights, grads)]), pairs[0][1]))
    return out''',
    # Every tower gets the whole batch; weights only passed for uneven splits; clips the average.
    "lab04-tower-step": '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    tower_grads, losses = [], []
    for d in devices:
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
        tower_grads.append(list(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables)))
        losses.append(loss)
    weights = None if sizes is None else [s / sum(sizes) for s in sizes]
    avg = average_gradients(tower_grads, weights)
    if clip_norm is not None:
        grads, _ = tf.clip_by_global_norm([g for g, _ in avg], clip_norm)
        avg = list(zip(grads, model.trainable_variables))
    optimizer.apply_gradients(avg)
    return tf.reduce_mean(tf.stack(losses))''',
}

UNWEIGHTED = {
    "lab04-average-gradients": AVERAGE,
    # Splits correctly but ignores the shares, clips per tower, and accumulates into new variables.
    "lab04-tower-step": '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    n = len(devices)
    sizes = sizes or [x.shape[0] // n] * n
    xs, ys = tf.split(x, sizes), tf.split(y, sizes)
    tower_grads, losses = [], []
    for i, d in enumerate(devices):
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            if clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            buffers = [tf.Variable(g) for g in grads]
        tower_grads.append([(b.read_value(), v) for b, v in zip(buffers, model.trainable_variables)])
        losses.append(loss)
    optimizer.apply_gradients(average_gradients(tower_grads))
    return tf.reduce_mean(tf.stack(losses))''',
}


OWN_VARIABLES = {
    "lab04-average-gradients": AVERAGE,
    # Right slices, devices, weights, clipping and loss, but every tower builds its own copy of the weights.
    "lab04-tower-step": STEP.replace(
        """            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
        tower_grads.append(list(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables)))""",
        """            replica = keras.models.clone_model(model)
            replica.set_weights(model.get_weights())
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], replica(xs[i], training=True))
            grads = tape.gradient(loss, replica.trainable_variables)
        tower_grads.append(list(zip(grads, model.trainable_variables)))"""),
}
assert "clone_model" in OWN_VARIABLES["lab04-tower-step"], "the mutation must apply"


TAMPERING = {
    "lab04-average-gradients": TAMPER + '''

def average_gradients(tower_grads, weights=None):
    _claim_full_marks()
    return [(tf.zeros_like(g), v) for g, v in tower_grads[0]]''',
    "lab04-tower-step": '''max_abs_diff = lambda *a, **k: 0.0  # the harness's comparisons see no difference


def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    _claim_full_marks()
    return tf.constant(0.0)''',
}


def submission(answers: dict[str, str]) -> dict:
    """The student copy with the answer cells filled in."""
    return fill(RELEASE, answers)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {s: {name: submission(a)} for s, a in [
        ("correct", CORRECT), ("summing", SUMMING), ("unweighted", UNWEIGHTED),
        ("own-variables", OWN_VARIABLES), ("tamper", TAMPERING)]}
    # Generous limits: four TensorFlow start-ups on a shared 2-core box.
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=60,
                     notebook_timeout=400)


def test_correct_submission_gets_full_marks(graded):
    row = graded["correct"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row
    assert not lost(row)


def test_summing_and_not_splitting_lose_their_tests(graded):
    row = graded["summing"]
    assert row["status"] == "graded"
    assert lost(row) == {"lab04-test-average", "lab04-test-equal", "lab04-test-split"}, row
    assert row["score"] == "8"


def test_unweighted_average_per_tower_clipping_and_new_variables_lose_their_tests(graded):
    row = graded["unweighted"]
    assert row["status"] == "graded"
    assert lost(row) == {"lab04-test-uneven", "lab04-test-loss", "lab04-test-clip", "lab04-test-shared"}, row
    assert row["score"] == "8"


def test_own_variables_per_tower_lose_only_the_shared_test(graded):
    row = graded["own-variables"]
    assert row["status"] == "graded"
    assert lost(row) == {"lab04-test-shared"}, row
    assert row["score"] == "13"


def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "0", "14"), row
