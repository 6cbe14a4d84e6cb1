"""Lab 6 (Horovod) graded end to end: submissions built from the student copy in labs/ are launched
with horovodrun and autograded by tools/grade.py.

A correct conversion gets full marks. The typical mistakes lose exactly the points of the tests
they break: without the broadcast the PyTorch ranks drift apart (and away from the single-process
run), every rank writing checkpoints shows in the checkpoint log, and an unscaled Keras learning
rate no longer matches one process on the global batch. Two submissions only: each one costs four
launches (two single-process references, two horovodrun jobs).
"""
from __future__ import annotations

import json

import pytest
from gradekit import ROOT, grade_all, lost, submission as fill

LAB = "06-horovod"
RELEASE = ROOT / "labs" / LAB / "horovod.ipynb"
SOURCE = ROOT / "solutions" / LAB / "horovod.ipynb"
ANSWERS = ("lab06-torch-script", "lab06-keras-script")


def solution(grade_id: str) -> str:
    """The instructor's answer cell, without nbgrader's solution markers."""
    for cell in json.loads(SOURCE.read_text())["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            lines = "".join(cell["source"]).split("\n")
            return "\n".join(ln for ln in lines if "### BEGIN SOLUTION" not in ln
                             and "### END SOLUTION" not in ln)
    raise KeyError(grade_id)


def edit(text: str, old: str, new: str) -> str:
    """text with old replaced by new (old must be there: the mistake must really be made)."""
    assert old in text, f"{old!r} not in the solution: update the mistakes of this test"
    return text.replace(old, new)


CORRECT = {g: solution(g) for g in ANSWERS}

# PyTorch: no broadcast of rank 0's state, and every rank writes the checkpoints.
_torch = edit(CORRECT["lab06-torch-script"],
              "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", "")
_torch = edit(_torch, "    hvd.broadcast_optimizer_state(opt, root_rank=0)\n", "")
_torch = edit(_torch, "if step % CKPT_EVERY == 0 and hvd.rank() == 0:", "if step % CKPT_EVERY == 0:")
# Keras: the learning rate is not scaled by the number of ranks.
_keras = edit(CORRECT["lab06-keras-script"], "SGD(BASE_LR * hvd.size())", "SGD(BASE_LR)")
WRONG = {"lab06-torch-script": _torch, "lab06-keras-script": _keras}

TESTS = {  # test cell -> points
    "lab06-test-torch-consistent": 2, "lab06-test-torch-matches": 2, "lab06-test-torch-lr": 1,
    "lab06-test-torch-checkpoints": 2, "lab06-test-keras-consistent": 2, "lab06-test-keras-matches": 2,
    "lab06-test-keras-lr": 1, "lab06-test-keras-checkpoints": 1,
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, dict[str, str]]:
    name = RELEASE.name
    students = {"correct": {name: fill(RELEASE, CORRECT)}, "wrong": {name: fill(RELEASE, WRONG)}}
    return grade_all(LAB, students, tmp_path_factory.mktemp("grading"), notebook_timeout=900)


def test_every_test_cell_is_in_the_csv(graded):
    assert set(TESTS) <= set(graded["correct"]), sorted(graded["correct"])


def test_correct_conversion_gets_full_marks(graded):
    row = graded["correct"]
    assert row["status"] == "graded", row["status"]
    assert {k: float(row[k]) for k in TESTS} == {k: float(v) for k, v in TESTS.items()}
    assert (float(row["score"]), float(row["max_score"])) == (sum(TESTS.values()),) * 2


def test_typical_mistakes_lose_exactly_their_points(graded):
    row = graded["wrong"]
    assert row["status"] == "graded", row["status"]
    # No broadcast: ranks disagree, and rank 0 no longer matches one process on the global batch;
    # every rank checkpointing: the log names rank 1 too. The PyTorch lr is right: kept.
    # Unscaled Keras lr: the lr test and the match with the single-process run fail; the ranks
    # still agree with each other and only rank 0 checkpoints: kept.
    assert lost(row) == {"lab06-test-torch-consistent", "lab06-test-torch-matches",
                         "lab06-test-torch-checkpoints", "lab06-test-keras-matches", "lab06-test-keras-lr"}
    assert float(row["score"]) == 1 + 2 + 1  # torch-lr, keras-consistent, keras-checkpoints
