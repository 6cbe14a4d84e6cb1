"""The judge outside the kernel (dpc_runtime.judge, dpc_instructor.nbgrader_hooks.Judge): recorded
values go out as data, the verdict is taken against the reference's records, with the reference's
names, tolerances and bounds, and nothing a kernel prints can give a test cell points."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook, new_output
from nbgrader.utils import determine_grade

from dpc_instructor import markers, nbgrader_hooks
from dpc_runtime import judge

pytestmark = pytest.mark.gate  # tests/tiers.py


def item(name: str, value, **spec) -> dict:
    """A record as record() shows it to the grader."""
    return {"name": name, "value": judge.plain(value), "rtol": 1e-5, "atol": 1e-6, "at_least": None,
            "at_most": None, "differs_from": None, **spec}


def test_values_go_out_as_data_and_come_back_exactly():
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    assert judge.verdict([item("x", x)], [item("x", x.astype("float64"))]) is None
    assert judge.verdict([item("t", torch.tensor([1.5, 2.5]))], [item("t", [1.5, 2.5])]) is None
    assert judge.plain(np.int64(3)) == 3 and judge.plain(np.float32(0.5)) == 0.5
    assert judge.plain(float("nan")) == {"float": "nan"}
    assert judge.plain([(12, "/cpu:0")]) == [[12, "/cpu:0"]]
    json.dumps(judge.plain({"a": np.ones(3, bool), "b": [np.arange(2)]}))  # plain JSON, no pickle
    with pytest.raises(TypeError, match="cannot record a value of type"):
        judge.plain(np.array(["text"]))
    with pytest.raises(ValueError, match="over the"):
        judge.plain(np.zeros(judge.ARRAY_LIMIT + 1))


def test_a_value_that_differs_fails_and_says_by_how_much():
    ref = [item("average", np.full((2, 2), 3.0)), item("variables", ["w:0", "b:0"])]
    assert judge.verdict(ref, [item("average", np.full((2, 2), 3.0)), item("variables", ["w:0", "b:0"])]) is None
    why = judge.verdict(ref, [item("average", np.full((2, 2), 9.0)), item("variables", ["w:0", "b:0"])])
    assert why == "'average' differs from the reference (max |difference| 6)"
    assert "shape (2,)" in judge.verdict(ref[:1], [item("average", [3.0, 3.0])])
    assert "not the expected value" in judge.verdict(ref[1:], [item("variables", ["b:0", "w:0"])])
    assert judge.verdict([item("n", 6)], [item("n", 6.0000001)]) is not None  # integers are exact
    assert judge.verdict([item("loss", 1.0)], [item("loss", float("nan"))]) is not None


def test_names_order_tolerances_and_bounds_are_the_references():
    ref = [item("loss", 1.0, atol=1e-3)]
    assert judge.verdict(ref, [item("loss", 1.0005)]) is None
    assert judge.verdict(ref, [item("loss", 1.5, atol=10.0, rtol=10.0)]) is not None  # the student's spec is ignored
    assert judge.verdict(ref, []) == "the cell did not record 'loss'"
    assert judge.verdict(ref, [item("loss", 1.0), item("loss", 1.0)]) is not None  # an extra record
    assert judge.verdict(ref + [item("x", 2)], [item("x", 2), item("loss", 1.0)]) is not None  # order
    bound = [item("in flight", 3, at_least=2)]
    assert judge.verdict(bound, [item("in flight", 8)]) is None  # the reference's value is not used
    assert judge.verdict(bound, [item("in flight", 1)]) == "'in flight' is below 2"
    assert judge.verdict(bound, [item("in flight", "many")]) == "'in flight' is not a number"
    changed = [item("before", [1.0, 2.0]), item("after", [1.5, 2.0], differs_from="before")]
    assert judge.verdict(changed, [item("before", [1.0, 2.0]), item("after", [7.0, 2.0])]) is None
    assert judge.verdict(changed, [item("before", [1.0, 2.0]), item("after", [1.0, 2.0])]) == (
        "'after' is the same as 'before': nothing changed")


def graded_cell(*outputs) -> dict:
    """A 2-point test cell with these outputs."""
    cell = new_code_cell("check()", metadata={"nbgrader": {
        "grade": True, "grade_id": "t", "points": 2, "solution": False, "locked": True}})
    cell.outputs = list(outputs)
    return cell


def shown(rec: dict):
    """The display output record() sends."""
    return new_output("display_data", data={judge.MIME: rec, "text/plain": "(recorded)"})


def run_judge(cell, tmp_path, **config):
    """The Judge preprocessor over a one-cell notebook, as nbgrader calls it; the cell after it."""
    nb, _ = nbgrader_hooks.Judge(**config)(new_notebook(cells=[cell]), {"nbgrader": {"notebook": "lab"}})
    return nb.cells[0]


def test_the_reference_run_writes_records_and_students_are_judged_on_them(tmp_path):
    records = tmp_path / "records.json"
    run_judge(graded_cell(shown(item("average", [3.0, -3.0]))), tmp_path, record_to=str(records))
    saved = json.loads(records.read_text())
    assert [r["name"] for r in saved["lab"]["t"]] == ["average"]
    right = run_judge(graded_cell(shown(item("average", [3.0, -3.0]))), tmp_path, reference=str(records))
    assert determine_grade(right, None) == (2, 2)
    assert judge.MIME not in json.dumps(right.outputs)  # the feedback holds no raw records
    # Wrong values in a cell whose kernel printed no error (its asserts were neutralised): no points.
    wrong = run_judge(graded_cell(shown(item("average", [9.0, -9.0]))), tmp_path, reference=str(records))
    assert determine_grade(wrong, None) == (0, 2)
    assert wrong.outputs[0]["ename"] == "GraderCheck" and wrong.outputs[0]["evalue"].startswith("'average'[0] differs")
    silent = run_judge(graded_cell(), tmp_path, reference=str(records))  # recorded nothing
    assert determine_grade(silent, None) == (0, 2)


def test_an_execute_result_in_a_test_cell_is_never_partial_credit(tmp_path):
    claim = new_output("execute_result", data={"text/plain": "'full marks'"}, execution_count=3)
    error = new_output("error", ename="AssertionError", evalue="wrong", traceback=[])
    assert determine_grade(graded_cell(claim, error), None) == (2, 2)  # nbgrader alone: all the points
    cell = run_judge(graded_cell(claim, error), tmp_path)  # no reference: the kernel's verdict
    assert determine_grade(cell, None) == (0, 2)
    assert cell.outputs[0]["output_type"] == "display_data"  # still shown


def test_records_can_be_judged_against_each_other_and_through_a_statistic():
    ranks = [item("rank 0", [1.0, 2.0], judged=False), item("rank 1", [1.0, 2.0], same_as="rank 0")]
    assert judge.verdict(ranks, [item("rank 0", [5.0, 6.0]), item("rank 1", [5.0, 6.0])]) is None  # not vs the reference
    assert judge.verdict(ranks, [item("rank 0", [5.0, 6.0]), item("rank 1", [5.0, 7.0])]) == (
        "'rank 1' differs from 'rank 0'")
    own = [item("own losses: mean", [1.0, 3.0], stat="mean"),
           item("own losses: spread", [1.0, 3.0], stat="spread", at_least=1e-6)]
    assert judge.verdict(own, [item("own losses: mean", [1.5, 2.5]), item("own losses: spread", [1.5, 2.5])]) is None
    assert judge.verdict(own, [item("own losses: mean", [2.0, 2.0]), item("own losses: spread", [2.0, 2.0])]) == (
        "'own losses: spread' is below 1e-06")  # the mean is right, every rank saw the same data
    assert judge.verdict(own, [item("own losses: mean", [1.0, 1.0]), item("own losses: spread", [0.0, 2.0])]) is not None
    log = [item("own losses by rank", [[1.0, 2.0], [3.0, 4.0]], stat="column_means", judged=False),
           item("logged", [2.0, 3.0], same_as="own losses by rank")]
    assert judge.verdict(log, [item("own losses by rank", [[0.0, 0.0], [4.0, 2.0]]), item("logged", [2.0, 1.0])]) is None
    assert judge.verdict(log, [item("own losses by rank", [[0.0, 0.0], [4.0, 2.0]]), item("logged", [0.0, 0.0])]) is not None
    with pytest.raises(ValueError, match="stat must be one of"):
        judge.record("x", 1, stat="median")


def test_integer_arrays_are_exact_and_a_bound_keeps_the_references_shape():
    big = np.arange(10**6, 10**6 + 4, dtype=np.int64)
    assert judge.verdict([item("ids", big)], [item("ids", big)]) is None
    assert judge.verdict([item("ids", big)], [item("ids", big + np.array([0, 0, 0, 1]))]) == (
        "'ids' is not the expected value")  # allclose would have let 1 in 10**6 through
    bound = [item("held", [94, 93], at_least=1, at_most=94)]
    assert judge.verdict(bound, [item("held", [5, 7])]) is None
    assert judge.verdict(bound, [item("held", [5])]) == "'held' has shape (1,), not (2,)"


def test_a_record_knows_the_line_of_the_cell_that_made_it():
    source = "f(1)\n### BEGIN HIDDEN TESTS\nf(2)\n### END HIDDEN TESTS\nf(3)\n"
    items = [{"name": "a", "line": 1}, {"name": "b", "line": 3}, {"name": "c", "line": 5}, {"name": "d"}]
    assert [r["name"] for r in markers.visible_records(items, source)] == ["a", "c"]  # d: line unknown
    nb = new_notebook(cells=[new_code_cell(
        "from dpc_runtime.judge import record\n"
        "def check(x):\n"
        "    record('x', x)\n"
        "check(1)\n"
        "### BEGIN HIDDEN TESTS\n"
        "check(2)\n"
        "### END HIDDEN TESTS\n")])
    from nbclient import NotebookClient

    NotebookClient(nb, kernel_name="python3").execute()
    got = judge.records(nb.cells[0])
    assert [(r["value"], r["line"]) for r in got] == [(1, 4), (2, 6)]  # where check() was called
    assert [r["value"] for r in markers.visible_records(got, nb.cells[0].source)] == [1]


def test_a_failed_hidden_record_is_not_named_in_the_feedback(tmp_path):
    source = "check(1)\n### BEGIN HIDDEN TESTS\ncheck(2)\n### END HIDDEN TESTS\n"
    records = tmp_path / "records.json"
    cell = graded_cell(shown({**item("3 towers, seed 7: weights", [1.0]), "line": 3}))
    cell.source = source
    cell.outputs.insert(0, shown({**item("2 towers: weights", [2.0]), "line": 1}))
    run_judge(cell, tmp_path, record_to=str(records))
    wrong = graded_cell(shown(item("2 towers: weights", [2.0])), shown(item("3 towers, seed 7: weights", [5.0])))
    wrong.source = source
    graded = run_judge(wrong, tmp_path, reference=str(records))
    assert determine_grade(graded, None) == (0, 2)
    assert "seed 7" not in json.dumps(graded.outputs) and "hidden test" in graded.outputs[0]["evalue"]
    visible_wrong = graded_cell(shown(item("2 towers: weights", [9.0])), shown(item("3 towers, seed 7: weights", [1.0])))
    visible_wrong.source = source
    assert "'2 towers: weights'" in run_judge(visible_wrong, tmp_path, reference=str(records)).outputs[0]["evalue"]
    nothing = graded_cell()  # an unanswered lab: no record at all; only the visible one is named
    nothing.source = source
    why = run_judge(nothing, tmp_path, reference=str(records)).outputs[0]["evalue"]
    assert why == "the cell did not record '2 towers: weights'"


def test_a_record_made_by_hand_fails_and_never_stops_the_judge():
    ref = [item("w", np.ones(3))]
    for value in ({"dtype": "<f8", "shape": [3], "b64": "not base64!"}, {"dtype": "object", "shape": [1], "b64": ""},
                  {"dtype": "<f8", "shape": [10**9], "b64": ""}, [[1, 2], [3]], {"float": "huge"}):
        why = judge.verdict(ref, [{"name": "w", "value": value}])
        assert why is not None, value
    assert judge.verdict(ref, ["w"]) == "the cell's records are malformed"


def test_hidden_cases_come_from_the_runs_seed(monkeypatch):
    """judge.rng() draws from DPC_GRADE_SEED (the grader sets one per run), else from 0; the same
    seed draws the same cases; a value that is no seed is one clear error."""
    monkeypatch.delenv(judge.SEED_VARIABLE, raising=False)
    assert judge.seed() == 0
    unseeded = judge.rng().integers(1 << 30, size=4).tolist()
    monkeypatch.setenv(judge.SEED_VARIABLE, "12345")
    first, again = judge.rng().integers(1 << 30, size=4).tolist(), judge.rng().integers(1 << 30, size=4).tolist()
    assert judge.seed() == 12345 and first == again != unseeded
    monkeypatch.setenv(judge.SEED_VARIABLE, "-3")
    with pytest.raises(ValueError, match="DPC_GRADE_SEED must be a non-negative integer, not '-3'"):
        judge.rng()


def test_a_record_of_a_hidden_case_names_its_case():
    """record(..., case=i): the answer for the grader's hidden case i (dpc_instructor.grading.cases.assign_cases
    decides, outside the kernel, which cell counts it); every other record names none."""
    shown_items = []
    import IPython.display

    original = IPython.display.display
    IPython.display.display = lambda data, raw=False: shown_items.append(data[judge.MIME])
    try:
        judge.record("the grader's job 3", ([1], "hang"), case=3)
        judge.record("a value", 1.0)
    finally:
        IPython.display.display = original
    assert [(r["case"], r["value"]) for r in shown_items] == [(3, [[1], "hang"]), (None, 1.0)]
