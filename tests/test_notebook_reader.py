"""dpc_runtime.notebook (nbgrader's cell metadata) and dpc_instructor.markers (its answer / hidden-test
markers, as nbgrader reads them: a marker anywhere in a line; a solution cell without markers is
one answer)."""
from __future__ import annotations

import pytest

from dpc_instructor import markers
from dpc_runtime import notebook

pytestmark = pytest.mark.gate  # tests/tiers.py


def cell(source: str | list[str], **nbgrader: object) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {"nbgrader": nbgrader} if nbgrader else {}}


def test_metadata_and_grade_ids():
    graded = cell("x = 1", grade_id="lab01-test-x", grade=True, points=2)
    plain = cell(["y = 2\n", "z = 3"])
    broken = {"cell_type": "code", "source": "", "metadata": {"nbgrader": "not a dict"}}
    assert notebook.grade_id(graded) == "lab01-test-x" and notebook.nbgrader(graded)["points"] == 2
    assert notebook.grade_id(plain) is None and notebook.nbgrader(plain) == {}
    assert notebook.nbgrader(broken) == {} and notebook.source(plain) == "y = 2\nz = 3"
    assert notebook.by_grade_id({"cells": [graded, plain]}) == {"lab01-test-x": graded}


def test_blocks_split_answers_and_hidden_tests_markers_excluded():
    text = ("setup = 1\n### BEGIN SOLUTION\nanswer = 2\n### END SOLUTION\n"
            "assert answer\n    ### BEGIN HIDDEN TESTS\nassert secret\n### END HIDDEN TESTS\n")
    assert markers.blocks(cell(text)) == [(None, ["setup = 1"]), ("answer", ["answer = 2"]),
                                           (None, ["assert answer"]), ("hidden test", ["assert secret"])]
    # nbgrader replaces a solution cell without markers whole: all of it is the answer
    assert markers.blocks(cell("a = 1\nb = 2", solution=True)) == [("answer", ["a = 1", "b = 2"])]


def test_answer_markers_removed_and_hidden_tests_hidden():
    answer = cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n")
    assert markers.without_answer_markers(answer) == "def f():\n    return 1\n"
    text = "assert visible\n### BEGIN HIDDEN TESTS\nassert secret\n### END HIDDEN TESTS\nassert after\n"
    assert markers.hide_hidden_tests(text) == "assert visible\n# (hidden tests run here)\nassert after\n"
    assert markers.hidden_tests(text) == ["\nassert secret\n"]
