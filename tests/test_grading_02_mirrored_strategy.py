"""Lab 2 (MirroredStrategy) graded end to end: a correct submission gets full marks, and each typical
mistake loses exactly the points of the test that catches it.

Mistakes, one per test cell so that one "wrong" submission shows all three:
  * the per-replica batch used as the global batch        -> ms-test-global-batch (2 points)
  * the learning rate not scaled with the number of replicas -> ms-test-lr (1 point)
  * each replica's loss averaged over its own slice (tensorflow#45923) -> ms-test-step (3 points)
It also edits the locked parameters cell (to a line that would fail every later cell): grading
restores locked cells from the source, so that edit costs nothing.
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, grade_all, lost, submission as fill

LAB = "02-mirrored-strategy"
RELEASE = ROOT / "labs" / LAB / "mirrored-strategy.ipynb"

BATCH_LR = '''def global_batch_size(per_replica, strategy):
    return {batch}


def scaled_learning_rate(base_lr, strategy):
    return {lr}'''
BUILD = '''def build_and_compile(strategy, base_lr, image_size, classes):
    with strategy.scope():
        model = small_cnn(image_size, classes)
        model.compile(optimizer=tf.keras.optimizers.Adam(scaled_learning_rate(base_lr, strategy)),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model'''
STEP = '''def distributed_train_step(strategy, model, optimizer, batch, global_batch):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = per_example_loss(y, model(x, training=True))
            loss = {loss}
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    per_replica = strategy.run(replica_step, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)'''

CORRECT = {
    "lab02-batch-lr": BATCH_LR.format(batch="per_replica * strategy.num_replicas_in_sync",
                                   lr="base_lr * strategy.num_replicas_in_sync"),
    "lab02-build": BUILD,
    "lab02-train-step": STEP.format(
        loss="tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)"),
}
WRONG = {
    # the locked parameters cell edited: restored from the source when graded
    "lab02-parameters": "raise RuntimeError('a student edited the locked parameters cell')\n",
    "lab02-batch-lr": BATCH_LR.format(batch="per_replica", lr="base_lr"),
    "lab02-build": BUILD,
    "lab02-train-step": STEP.format(loss="tf.reduce_mean(per_example)"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {s: {name: fill(RELEASE, a)} for s, a in [("correct", CORRECT), ("wrong", WRONG)]}
    # TensorFlow's import alone can take half a minute on a busy 2-core box: a generous default.
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), cell_timeout=90,
                     notebook_timeout=900)


def test_correct_submission_gets_full_marks(graded):
    row = graded["correct"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "8", "8"), row
    assert lost(row) == set()


def test_typical_mistakes_lose_exactly_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row
    assert lost(row) == {"lab02-test-global-batch", "lab02-test-lr", "lab02-test-step"}, row
    assert row["lab02-test-build"] == "2"
    assert row["score"] == "2"
