"""The graded-lab pipeline end to end: submissions built from the student copy in labs/ are
autograded by src/dpc_instructor/grade.py (nbgrader, per-cell timeouts, a wall-clock limit per student).

A correct submission gets full marks (the reference and one written differently), typical mistakes lose exactly the points of the tests they
break, an infinite loop is cut at its cell timeout while the rest is still graded, a notebook that
survives interrupts is reported 'not graded' without blocking the others, and no process is left.
"""
from __future__ import annotations

import pytest
from gradekit import ROOT, grade_all, lost, submission as fill

LAB = "01-input-pipeline"
RELEASE = ROOT / "labs" / LAB / "input-pipeline.ipynb"

CORRECT = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    ds = tf.data.Dataset.range(len(source))
    ds = ds.map(lambda i: load_tf(source, i), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    return DataLoader(dataset, batch_size=batch_size, num_workers=3,
                      pin_memory=device.type == "cuda")''',
}
# Correct in another shape: a fixed number of parallel calls, a prefetch of 2 batches, positional
# batch size, two workers, prefetch_factor, pinning written as a conditional expression.
OTHER = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    indices = tf.data.Dataset.range(len(source))
    loaded = indices.map(lambda i: load_tf(source, i), num_parallel_calls=8, deterministic=True)
    return loaded.batch(batch_size, drop_remainder=False).prefetch(2)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    pin = True if device.type == "cuda" else False
    return DataLoader(dataset, batch_size, shuffle=False, num_workers=2, prefetch_factor=4,
                      pin_memory=pin)''',
}
# Typical mistakes: a prefetch but no parallel map; workers but shuffled and always pinned.
WRONG = {
    "lab01-fast-tf-pipeline": '''def fast_tf_pipeline(source, batch_size):
    return slow_tf_pipeline(source, batch_size).prefetch(tf.data.AUTOTUNE)''',
    "lab01-fast-torch-loader": '''def fast_torch_loader(dataset, batch_size, device):
    return DataLoader(dataset, batch_size=batch_size, num_workers=2, shuffle=True,
                      pin_memory=True)''',
}
# A debugging loop left in a cell (waiting for something that never comes): interrupted at the cell
# timeout, the rest is graded. It sleeps rather than spins, so that it does not slow its neighbours.
LOOPING = {**CORRECT, "lab01-fast-tf-pipeline": "import time\nwhile True:\n    time.sleep(0.1)"}
# A loop that swallows the interrupt itself: only the wall-clock limit per student stops it.
SURVIVOR = {**CORRECT, "lab01-fast-tf-pipeline": '''import time
while True:
    try:
        time.sleep(0.1)
    except BaseException:
        pass'''}


def submission(answers: dict[str, str]) -> dict:
    """The student copy with the answer cells filled in."""
    return fill(RELEASE, answers)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {s: {name: submission(a)} for s, a in [
        ("correct", CORRECT), ("other", OTHER), ("wrong", WRONG), ("looping", LOOPING), ("survivor", SURVIVOR)]}
    students["empty"] = {}
    students["garbled"] = {name: "{ not a notebook"}
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"))


def test_correct_submission_gets_full_marks(graded):
    row = graded["correct"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "10", "10")


def test_correct_answer_in_another_shape_gets_full_marks(graded):
    row = graded["other"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "10", "10"), row


def test_typical_mistakes_lose_the_right_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded"
    assert lost(row) == {"lab01-test-tf-parallel", "lab01-test-torch-same-batches", "lab01-test-torch-pinned"}
    assert row["score"] == "5"


def test_infinite_loop_is_cut_and_the_rest_graded(graded):
    row = graded["looping"]
    assert row["status"] == "graded"
    assert row["lab01-test-tf-same-batches"] == row["lab01-test-tf-parallel"] == row["lab01-test-tf-prefetch"] == "0"
    assert (row["lab01-test-torch-same-batches"], row["lab01-test-torch-workers"], row["lab01-test-torch-pinned"]) == ("2", "2", "1")
    assert row["score"] == "5"


def test_interrupt_survivor_is_reported_not_graded(graded):
    row = graded["survivor"]
    # nbgrader gives up on such a notebook: the status says why, the others are still graded.
    assert row["status"].startswith("not graded: a cell ('import time' ...) kept running after its "
                                    "time limit and an interrupt"), row["status"]
    assert row["score"] == "0"


def test_bad_submissions_get_one_clear_status(graded):
    assert graded["empty"]["status"] == "missing notebook(s): input-pipeline.ipynb"
    assert graded["garbled"]["status"].startswith("unreadable notebook input-pipeline.ipynb")
