"""Lab 4 (manual towers on sharded variables) graded end to end: submissions built from the student
copy in labs/ are autograded by src/dpc_instructor/grade.py; a correct submission gets full marks and
the typical mistakes lose exactly the points of the tests they break.

Five submissions keep it cheap (each grading run starts TensorFlow with 4 logical devices):
  correct  - a correct solution written differently from the reference (heapq for the placement;
             the tower gradients grouped by device with tf.tensordot, the clipping scale from one
             partial sum of squares per device);
  transplanted - chapter 4's recipe with the weights: round-robin placement (replica_device_setter's
             default) and a step that stacks every gradient on one device, weights and clips them
             there (tf.clip_by_global_norm): the numbers are right, so it loses the two placement
             tests and the test that watches where each gradient is combined, and nothing else;
  summing  - sums the tower gradients and the tower losses instead of weighting them, and gives
             every tower the whole batch (forgot to split): loses the split, equal, uneven and loss
             tests, and the clipping test by its hidden case whose clip does not bite (clipping N
             times the gradient to a norm below the gradient's gives the same clipped step: only an
             inactive clip shows the N, issue 59); the gradients are combined on the right devices;
  rescaling - correct, but always scales the gradient to clip_norm (no min(1, ...)): right while the
             clip bites, wrong when the norm is below it: loses the clipping test alone;
  unweighted - breaks the placement's ties towards the highest device index (every variable on the
             mirror device: same balance), plain mean of gradients and losses when the slices are
             uneven, clips every tower's gradient before combining, and keeps a gradient buffer per
             tower as new tf.Variables: loses the place test (not the balance test), the uneven-split
             test, the loss test, the clipping test and the shared-variables test;
  own variables - every tower works on its own copy of the model (clone_model + set_weights) and
             its gradients are applied to the model's variables: the numbers, the slices and the
             devices are right, so it loses the shared-variables test and nothing else;
  tamper   - does no work and fights the tests from inside the kernel (gradekit.TAMPER, plus the
             harness's max_abs_diff made to see no difference): 0 of 14, every test cell's
             recorded values are compared outside the kernel.
  peeker   - no greedy placement (issue 36): the visible placements the test's messages give, every
             other one from the hidden test's own `reference_placement` if the notebook defines it
             (before issue 36 the hidden placement test defined it in the kernel before calling
             place_variables, and the balance test ran after it), else round-robin; its tower step
             is the correct one but fails if the kernel holds the grading seed. The hidden
             placements are now drawn outside the kernel (the source's locked `hidden_cases`,
             dpc_instructor.grading.cases.make_cases) and no reference is in the kernel: it loses the two
             placement tests of exercise 1 and keeps the step's 10 points. The run's seed is one at
             which round-robin is wrong for a drawn placement (grading_seed).

What the judge cannot rule out here: the visible cases are fixed (their answers are in the test's
messages and checks.json); the split and device tests (forward passes per tower, the device of each
gradient) observe objects inside the kernel, which the code they measure could fake (CONTRIBUTING).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from gradekit import ROOT, TAMPER, grade_all, lost, submission as fill, tiered

LAB = "04-manual-towers"
RELEASE = ROOT / "labs" / LAB / "manual-towers.ipynb"
SOURCE = ROOT / "solutions" / LAB / "manual-towers.ipynb"

PLACE = '''def place_variables(shapes, n_devices):
    import heapq
    heap = [(0, d) for d in range(n_devices)]  # (values held, device): the least loaded, lowest index first
    out = {}
    order = sorted(enumerate(shapes), key=lambda item: (-int(np.prod(item[1])), item[0]))
    for i, shape in order:
        held, d = heapq.heappop(heap)
        out[i] = d
        heapq.heappush(heap, (held + int(np.prod(shape)), d))
    return [out[i] for i in range(len(shapes))]'''

STEP = '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    n = len(devices)
    sizes = sizes or [x.shape[0] // n] * n
    shares = tf.constant([s / sum(sizes) for s in sizes], tf.float32)
    xs, ys = tf.split(x, sizes), tf.split(y, sizes)
    variables = model.trainable_variables
    per_tower, losses = [], []
    for i, d in enumerate(devices):
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
        per_tower.append(tape.gradient(loss, variables))
        losses.append(loss)
    by_device = {}
    for k, v in enumerate(variables):
        by_device.setdefault(v.value.device, []).append(k)
    combined, partial = [None] * len(variables), []
    for device, ks in by_device.items():
        with tf.device(device):
            for k in ks:
                combined[k] = tf.tensordot(shares, tf.stack([g[k] for g in per_tower]), axes=1)
            partial.append(tf.add_n([tf.reduce_sum(combined[k] ** 2) for k in ks]))
    if clip_norm:
        scale = tf.minimum(1.0, clip_norm / tf.sqrt(tf.add_n(partial)))
        for device, ks in by_device.items():
            with tf.device(device):
                for k in ks:
                    combined[k] = combined[k] * scale
    optimizer.apply_gradients(list(zip(combined, variables)))
    return tf.tensordot(shares, tf.stack(losses), axes=1)'''

CORRECT = {"lab04-place-variables": PLACE, "lab04-tower-step": STEP}

# Chapter 4's cells 8 and 10 with the weights: right numbers, everything gathered on one device.
TRANSPLANTED = {
    "lab04-place-variables": '''def place_variables(shapes, n_devices):
    return [i % n_devices for i in range(len(shapes))]''',
    "lab04-tower-step": '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    variables = model.trainable_variables
    sizes = sizes or [x.shape[0] // len(devices)] * len(devices)
    shares = [s / sum(sizes) for s in sizes]
    tower_grads, tower_losses = [], []
    for i, (device, x_i, y_i) in enumerate(zip(devices, tf.split(x, sizes), tf.split(y, sizes))):
        with tf.device(device), tf.name_scope(f"tower_{i}"):
            with tf.GradientTape() as tape:
                loss = loss_fn(y_i, model(x_i, training=True))
            tower_grads.append(list(zip(tape.gradient(loss, variables), variables)))
            tower_losses.append(loss)
    with tf.device(devices[0]):
        averaged = []
        for pairs in zip(*tower_grads):
            grads = tf.stack([w * g for w, (g, _) in zip(shares, pairs)])
            averaged.append(tf.reduce_sum(grads, axis=0))
        if clip_norm is not None:
            averaged, _ = tf.clip_by_global_norm(averaged, clip_norm)
        optimizer.apply_gradients(zip(averaged, variables))
        return tf.add_n([w * l for w, l in zip(shares, tower_losses)])''',
}

SUMMING = {
    "lab04-place-variables": PLACE,
    # Every tower gets the whole batch; the tower gradients and losses are summed (on the right devices).
    "lab04-tower-step": '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    variables = model.trainable_variables
    tower_grads, losses = [], []
    for d in devices:
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tower_grads.append(tape.gradient(loss, variables))
        losses.append(loss)
    grads = []
    for k, v in enumerate(variables):
        with tf.device(v.value.device):
            grads.append(tf.add_n([g[k] for g in tower_grads]))
    if clip_norm is not None:
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(g * g) for g in grads]))
        for k, v in enumerate(variables):
            with tf.device(v.value.device):
                grads[k] = grads[k] * tf.minimum(1.0, clip_norm / norm)
    optimizer.apply_gradients(zip(grads, variables))
    return tf.add_n(losses)''',
}

# The greedy rule with ties broken towards the highest device index: every load lands on the mirror
# device (d -> n-1-d), so the indices are wrong (the place test) and the balance is the same (the
# balance test judges the loads busiest first, not their labels: one mistake, one test).
PLACE_MIRRORED = (PLACE.replace("heap = [(0, d) for d in range(n_devices)]", "heap = [(0, -d) for d in range(n_devices - 1, -1, -1)]")
                  .replace("out[i] = d", "out[i] = -d"))  # the heap (sorted) holds -device: ties pop the highest
assert PLACE_MIRRORED.count("-d") == 2, "the mutation must apply"

UNWEIGHTED = {
    "lab04-place-variables": PLACE_MIRRORED,
    # Splits correctly but ignores the shares, clips per tower, and accumulates into new variables.
    "lab04-tower-step": '''def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    n = len(devices)
    sizes = sizes or [x.shape[0] // n] * n
    xs, ys = tf.split(x, sizes), tf.split(y, sizes)
    variables = model.trainable_variables
    tower_grads, losses = [], []
    for i, d in enumerate(devices):
        with tf.device(d):
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
            grads = tape.gradient(loss, variables)
            if clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            buffers = [tf.Variable(g) for g in grads]
        tower_grads.append([b.read_value() for b in buffers])
        losses.append(loss)
    mean = []
    for k, v in enumerate(variables):
        with tf.device(v.value.device):
            mean.append(tf.add_n([g[k] for g in tower_grads]) / n)
    optimizer.apply_gradients(zip(mean, variables))
    return tf.reduce_mean(tf.stack(losses))''',
}

RESCALING = {"lab04-place-variables": PLACE,
             "lab04-tower-step": STEP.replace("tf.minimum(1.0, clip_norm / tf.sqrt(tf.add_n(partial)))",
                                              "clip_norm / tf.sqrt(tf.add_n(partial))")}
assert RESCALING["lab04-tower-step"] != STEP, "the mutation must apply"

OWN_VARIABLES = {
    "lab04-place-variables": PLACE,
    # Right slices, devices, weights, clipping and loss, but every tower builds its own copy of the weights.
    "lab04-tower-step": STEP.replace(
        '''            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], model(xs[i], training=True))
        per_tower.append(tape.gradient(loss, variables))''',
        '''            replica = keras.models.clone_model(model)
            replica.set_weights(model.get_weights())
            with tf.GradientTape() as tape:
                loss = loss_fn(ys[i], replica(xs[i], training=True))
            per_tower.append(tape.gradient(loss, replica.trainable_variables))'''),
}
assert "clone_model" in OWN_VARIABLES["lab04-tower-step"], "the mutation must apply"


TAMPERING = {
    "lab04-place-variables": TAMPER + '''

def place_variables(shapes, n_devices):
    _claim_full_marks()
    return [0] * len(shapes)''',
    "lab04-tower-step": '''max_abs_diff = lambda *a, **k: 0.0  # the harness's comparisons see no difference


def tower_step(model, optimizer, x, y, devices, sizes=None, clip_norm=None):
    _claim_full_marks()
    return tf.constant(0.0)''',
}

# The placements read off (issue 36), else round-robin; the correct step, failing if the kernel has the seed.
PEEKER = {
    "lab04-place-variables": '''def place_variables(shapes, n_devices):
    known = {(((20, 32), (32,), (32, 5), (5,)), 2): [0, 1, 1, 1], (((1,), (), (2, 2)), 2): [1, 1, 0],
             (((3,), (2, 2), (3,)), 4): [1, 0, 2]}  # the visible cases: their answers are in the messages
    key = (tuple(tuple(s) for s in shapes), n_devices)
    if key in known:
        return known[key]
    reference = globals().get("reference_placement")
    if reference is not None:
        return reference(shapes, n_devices)
    return [i % n_devices for i in range(len(shapes))]''',
    "lab04-tower-step": "import os\n\n" + STEP.replace(
        "    n = len(devices)\n",
        '    assert "DPC_GRADE_SEED" not in os.environ, "the kernel holds the grading seed"\n    n = len(devices)\n', 1),
}
assert "DPC_GRADE_SEED" in PEEKER["lab04-tower-step"], "the mutation must apply"


def hidden_placements(seed: int) -> list[tuple[list[tuple], int]]:
    """The (shapes, devices) of the hidden placement cases the grader draws at seed: the lab's own
    hidden_cases (its locked cell lab04-cases) with numpy's generator of seed."""
    import numpy as np

    cell = next("".join(c["source"]) for c in json.loads(SOURCE.read_text())["cells"] if c.get("id") == "lab04-cases")
    space: dict = {"json": json, "Path": Path}
    exec(cell, space)
    return [([tuple(s) for s in case["shapes"]], case["devices"])
            for case, cell_id in space["hidden_cases"](np.random.default_rng(seed)) if cell_id == "lab04-test-place"]


def greedy(shapes: list[tuple], n: int) -> list[int]:
    """Largest first, each on the least loaded device (the lowest index on a tie)."""
    sizes = [math.prod(s) for s in shapes]
    load, out = [0] * n, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: -sizes[i]):
        d = load.index(min(load))
        out[i], load[d] = d, load[d] + sizes[i]
    return out


def grading_seed() -> int:
    """The session's seed of the hidden cases, or the next one at which round-robin is wrong for one
    of the drawn placements (so that the peeker's score says only whether it found a reference)."""
    seed = int(os.environ["DPC_GRADE_SEED"])
    while all(greedy(shapes, n) == [i % n for i in range(len(shapes))] for shapes, n in hidden_placements(seed)):
        seed += 1
    return seed


def submission(answers: dict[str, str]) -> dict:
    """The student copy with the answer cells filled in."""
    return fill(RELEASE, answers)

# What each submission loses at grading_seed() (status 'graded' for all): test_grading_spread holds the
# cluster's run to the same.
LOSES = {
    "correct": set(),
    "transplanted": {"lab04-test-place", "lab04-test-balance", "lab04-test-placement"},
    "summing": {"lab04-test-split", "lab04-test-equal", "lab04-test-uneven", "lab04-test-loss", "lab04-test-clip"},
    "rescaling": {"lab04-test-clip"},
    # the mirrored ties cost the place test, not the balance
    "unweighted": {"lab04-test-place", "lab04-test-uneven", "lab04-test-loss", "lab04-test-clip", "lab04-test-shared"},
    "own-variables": {"lab04-test-shared"},
    "peeker": {"lab04-test-place", "lab04-test-balance"},
}
SCORES = {"correct": "14", "transplanted": "8", "summing": "7", "rescaling": "13", "unweighted": "7", "own-variables": "13",
          "peeker": "10", "tamper": "0"}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    # the gate: the reference, a correct answer and the chapter's recipe (a plausible mistake)
    gate = {s: {name: submission(a)} for s, a in [("correct", CORRECT), ("transplanted", TRANSPLANTED)]}
    full = {s: {name: submission(a)} for s, a in [
        ("summing", SUMMING), ("rescaling", RESCALING), ("unweighted", UNWEIGHTED), ("own-variables", OWN_VARIABLES), ("tamper", TAMPERING),
        ("peeker", PEEKER)]}
    students = tiered(request, gate, full)
    # Generous limits: five TensorFlow start-ups on a shared 2-core box.
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=60,
                     notebook_timeout=400, args=("--seed", str(grading_seed())))


@pytest.mark.gate
def test_correct_submission_gets_full_marks(graded):
    row = graded["correct"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row
    assert not lost(row)


@pytest.mark.gate
def test_the_chapters_recipe_with_weights_loses_the_placement_tests(graded):
    row = graded["transplanted"]
    assert row["status"] == "graded"
    assert lost(row) == LOSES["transplanted"], row
    assert row["score"] == SCORES["transplanted"]


@pytest.mark.full
def test_summing_and_not_splitting_lose_their_tests(graded):
    row = graded["summing"]
    assert row["status"] == "graded"
    assert lost(row) == LOSES["summing"], row
    assert row["score"] == SCORES["summing"]


@pytest.mark.full
def test_a_clip_that_always_rescales_loses_the_clipping_test_alone(graded):
    """Right while the clip bites; the hidden case whose gradient's norm is below clip_norm tells it."""
    row = graded["rescaling"]
    assert row["status"] == "graded"
    assert lost(row) == LOSES["rescaling"], row
    assert row["score"] == SCORES["rescaling"]


@pytest.mark.full
def test_unweighted_average_per_tower_clipping_and_new_variables_lose_their_tests(graded):
    row = graded["unweighted"]
    assert row["status"] == "graded"
    assert lost(row) == LOSES["unweighted"], row
    assert row["score"] == SCORES["unweighted"]


@pytest.mark.full
def test_own_variables_per_tower_lose_only_the_shared_test(graded):
    row = graded["own-variables"]
    assert row["status"] == "graded"
    assert lost(row) == LOSES["own-variables"], row
    assert row["score"] == SCORES["own-variables"]


@pytest.mark.full
def test_fighting_the_tests_from_the_kernel_gets_nothing(graded):
    row = graded["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", SCORES["tamper"], "14"), row


@pytest.mark.full
def test_placements_read_off_the_tests_get_no_points_and_the_kernel_has_no_seed(graded):
    """No reference placement is in the kernel any more (the hidden cases come from outside it): the
    peeker loses both placement tests; its step, which fails if the kernel holds the grading seed,
    keeps its points."""
    row = graded["peeker"]
    assert row["status"] == "graded", row
    assert lost(row) == LOSES["peeker"], row
    assert row["score"] == SCORES["peeker"], row


@pytest.mark.gate
def test_the_hidden_cases_are_made_before_any_answer():
    """The grader makes lab 4's hidden placements outside the kernel, from a locked cell that comes
    before every answer and test cell; the seed chosen for the grading run makes round-robin wrong."""
    from dpc_instructor.grading import cases
    from dpc_runtime import notebook

    nb = json.loads(SOURCE.read_text())
    at = cases.cases_cell(nb)
    assert at is not None and notebook.grade_id(nb["cells"][at]) == "lab04-cases"
    assert not any(notebook.nbgrader(c).get("solution") or notebook.nbgrader(c).get("grade")
                   for c in nb["cells"][:at])
    assert not any("rng()" in notebook.source(c) or "reference_placement" in notebook.source(c)
                   for c in nb["cells"][at + 1:])
    assert any(greedy(shapes, n) != [i % n for i in range(len(shapes))] for shapes, n in hidden_placements(grading_seed()))
