"""Units of the grader that need no kernel: restoring tampered cells, scrubbing hidden tests from
feedback, the default number of jobs, and reading submissions (fast)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from dpc_instructor import grade, gradebook
from dpc_runtime import notebook

ROOT = Path(__file__).resolve().parents[1]

RELEASE = json.loads((ROOT / "labs" / "01-input-pipeline" / "input-pipeline.ipynb").read_text())


def meta(nb: dict, gid: str) -> dict:
    """The nbgrader metadata of the cell with grade id gid."""
    return notebook.nbgrader(notebook.by_grade_id(nb)[gid])


def test_repair_restores_lost_and_changed_metadata_and_names_deleted_cells():
    nb = copy.deepcopy(RELEASE)
    cells = []
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid == "lab01-test-tf-parallel":
            del cell["metadata"]["nbgrader"]
            cell["source"] = "".join(cell["source"]) + "\n# my note"  # still recognisable
        elif gid == "lab01-test-torch-pinned":
            cell["metadata"]["nbgrader"].update(points=100, grade=False)
        elif gid == "lab01-test-tf-prefetch":
            continue
        cells.append(cell)
    nb["cells"] = cells + [{"cell_type": "code", "metadata": {}, "source": "print('scratch')",
                            "outputs": [], "execution_count": None}]
    fixed, notes = grade.repair(nb, RELEASE)
    assert meta(fixed, "lab01-test-tf-parallel") == meta(RELEASE, "lab01-test-tf-parallel")
    assert meta(fixed, "lab01-test-torch-pinned") == meta(RELEASE, "lab01-test-torch-pinned")
    assert sorted(notes) == ["re-added the deleted cell lab01-test-tf-prefetch",
                             "restored the lost metadata of lab01-test-tf-parallel",
                             "restored the metadata of lab01-test-torch-pinned"]
    assert fixed["cells"][-1]["metadata"] == {}, "a student's own cell stays theirs"


def test_repair_leaves_an_untouched_submission_alone():
    fixed, notes = grade.repair(copy.deepcopy(RELEASE), RELEASE)
    assert notes == [] and fixed == RELEASE


def test_scrub_cuts_hidden_tests_and_tracebacks():
    cell = {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": "t", "grade": True}},
            "source": "assert visible\n### BEGIN HIDDEN TESTS\nassert secret_check(1)\n"
                      "### END HIDDEN TESTS\nprint('ok')\n",
            "outputs": [{"output_type": "error", "ename": "AssertionError", "evalue": "too slow",
                         "traceback": ["assert secret_check(1)"]}]}
    nb = gradebook.scrub({"cells": [cell]}, {"t"})
    out = nb["cells"][0]
    assert out["source"] == "assert visible\n# (hidden tests run here)\nprint('ok')\n"
    assert out["outputs"] == [{"output_type": "stream", "name": "stderr",
                               "text": "AssertionError: too slow\n"}]


def test_default_jobs_follow_cores_and_ranks(monkeypatch):
    monkeypatch.setattr(grade.os, "cpu_count", lambda: 8)
    assert grade.default_jobs("01-input-pipeline", 30) == 8
    assert grade.default_jobs("07-ddp-syncbn", 30) == 4
    assert grade.default_jobs("07-ddp-syncbn", 3) == 3
    monkeypatch.setattr(grade.os, "cpu_count", lambda: 1)
    assert grade.default_jobs("07-ddp-syncbn", 30) == 1


def test_find_submissions_statuses(tmp_path):
    (tmp_path / "ok" / "01-input-pipeline").mkdir(parents=True)
    (tmp_path / "ok" / "01-input-pipeline" / "input-pipeline.ipynb").write_text(json.dumps(RELEASE))
    (tmp_path / "ok" / "01-input-pipeline" / "timestamp.txt").write_text("2026-11-20 10:00:00")
    (tmp_path / "not a name!.ipynb").write_text("[1, 2]")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code"}, 7]}))
    got = {s.id: s for s in grade.find_submissions(tmp_path, "01-input-pipeline", ["input-pipeline"])}
    assert got["ok"].status == "graded" and got["ok"].timestamp.name == "timestamp.txt"
    assert got["not_a_name_"].status == "unreadable notebook input-pipeline.ipynb: no cells"
    assert got["empty"].status == "missing notebook(s): input-pipeline.ipynb"
    assert got["odd"].status == "unreadable notebook input-pipeline.ipynb: a cell without cell_type or source"
