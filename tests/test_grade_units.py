"""Units of the grader that need no kernel: restoring tampered cells, scrubbing hidden tests from
feedback, the default number of jobs, reading submissions, what the course keeps of a job, and which
failures are tried again (fast)."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gradekit
import pytest

from dpc_instructor import grade, gradebook
from dpc_instructor.grading import cases, failures, intake, job, repair, run, template
from dpc_runtime import cpuwait, notebook, sandbox

pytestmark = pytest.mark.gate  # tests/tiers.py

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
    fixed, notes = repair.repair(nb, RELEASE)
    assert meta(fixed, "lab01-test-tf-parallel") == meta(RELEASE, "lab01-test-tf-parallel")
    assert meta(fixed, "lab01-test-torch-pinned") == meta(RELEASE, "lab01-test-torch-pinned")
    assert sorted(notes) == ["re-added the deleted cell lab01-test-tf-prefetch",
                             "restored the lost metadata of lab01-test-tf-parallel",
                             "restored the metadata of lab01-test-torch-pinned"]
    assert fixed["cells"][-1]["metadata"] == {}, "a student's own cell stays theirs"


def test_repair_copied_cells_get_ids_of_their_own():
    nb = copy.deepcopy(RELEASE)
    cells = notebook.by_grade_id(nb)
    answer, test = cells["lab01-fast-tf-pipeline"], cells["lab01-test-tf-parallel"]
    pasted = [copy.deepcopy(answer), copy.deepcopy(test)]  # JupyterLab's copy and paste
    nb["cells"][nb["cells"].index(answer) + 1:nb["cells"].index(answer) + 1] = pasted
    fixed, notes = repair.repair(nb, RELEASE)
    ids = [c["id"] for c in fixed["cells"]]
    assert len(ids) == len(set(ids))
    gids = [notebook.grade_id(c) for c in fixed["cells"] if notebook.grade_id(c)]
    assert len(gids) == len(set(gids)) == len(notebook.by_grade_id(RELEASE))
    assert f"gave a copied cell (id {answer['id']}) an id of its own" in notes
    assert "a copy of lab01-fast-tf-pipeline became a cell of your own (the first keeps the grade id)" in notes
    assert "a copy of lab01-test-tf-parallel became a cell of your own (the first keeps the grade id)" in notes


def test_repair_puts_moved_and_deleted_locked_cells_back_in_place():
    nb = copy.deepcopy(RELEASE)
    by_id = notebook.by_grade_id(nb)
    imports, baseline = by_id["lab01-imports"], by_id["lab01-tf-baseline"]
    mine = {"cell_type": "code", "id": "mine0001", "metadata": {}, "source": "x = 1",
            "outputs": [], "execution_count": None}
    cells = [c for c in nb["cells"] if c is not baseline]  # deleted
    cells.remove(imports)
    cells.insert(cells.index(by_id["lab01-fast-torch-loader"]), imports)  # dragged far down
    cells.insert(cells.index(by_id["lab01-fast-tf-pipeline"]) + 1, mine)
    nb["cells"] = cells
    fixed, notes = repair.repair(nb, RELEASE)
    want = [notebook.grade_id(c) for c in RELEASE["cells"] if notebook.grade_id(c)]
    assert [notebook.grade_id(c) for c in fixed["cells"] if notebook.grade_id(c)] == want
    got = [notebook.grade_id(c) or c.get("id") for c in fixed["cells"]]
    assert got[got.index("lab01-fast-tf-pipeline") + 1] == "mine0001", "own cells stay where they were"
    assert "re-added the deleted cell lab01-tf-baseline" in notes
    assert any(n.startswith("put the moved cell(s) lab01-imports") for n in notes), notes


def test_repair_leaves_an_untouched_submission_alone():
    fixed, notes = repair.repair(copy.deepcopy(RELEASE), RELEASE)
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
    monkeypatch.setattr(run.os, "cpu_count", lambda: 8)
    assert run.default_jobs("01-input-pipeline", 30) == 8
    assert run.default_jobs("07-ddp-syncbn", 30) == 4
    assert run.default_jobs("07-ddp-syncbn", 3) == 3
    monkeypatch.setattr(run.os, "cpu_count", lambda: 1)
    assert run.default_jobs("07-ddp-syncbn", 30) == 1


def test_find_submissions_statuses(tmp_path):
    (tmp_path / "ok" / "01-input-pipeline").mkdir(parents=True)
    (tmp_path / "ok" / "01-input-pipeline" / "input-pipeline.ipynb").write_text(json.dumps(RELEASE))
    (tmp_path / "ok" / "01-input-pipeline" / "timestamp.txt").write_text("2026-11-20 10:00:00")
    (tmp_path / "ok" / "01-input-pipeline" / "submission_secret.txt").write_text("8f2a")
    (tmp_path / "ok" / "01-input-pipeline" / "notes.txt").write_text("not nbgrader's: not kept")
    (tmp_path / "not a name!.ipynb").write_text("[1, 2]")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code"}, 7]}))
    got = {s.name: s for s in intake.find_submissions(tmp_path, "01-input-pipeline", ["input-pipeline"])}
    assert got["ok"].status == "graded" and got["ok"].kept == {
        "timestamp.txt": b"2026-11-20 10:00:00", "submission_secret.txt": b"8f2a"}
    assert got["ok"].id == "ok"
    assert got["not a name!"].status == "unreadable notebook input-pipeline.ipynb: no cells"
    assert got["empty"].status == "missing notebook(s): input-pipeline.ipynb"
    assert got["odd"].status == "unreadable notebook input-pipeline.ipynb: a cell without cell_type or source"


NAMES = ["李雷", "王芳", "ann lee", "ann_lee", "Ann_lee", "-rf", "--help", ".hidden", "ann.lee",
         "x" * 300, "x" * 301, "Zoë", "Zoe\u0308", "ann lee ", "Ａnn", "a--b", "a-b", "李雷 "]


def test_grader_ids_are_unique_safe_and_never_options():
    ids = [intake.grader_id(n) for n in NAMES]
    assert len(set(ids)) == len(NAMES), dict(zip(NAMES, ids))
    for name, gid in zip(NAMES, ids):
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}", gid), (name, gid)
        assert intake.grader_id(name) == gid  # stable: a regrade finds the same student
    assert intake.grader_id("ann_lee") == "ann_lee" and intake.grader_id("a-b") == "a-b"
    assert intake.grader_id("ann lee").startswith("ann_lee--")
    assert intake.grader_id("李雷").startswith("student--")


def test_intake_reads_only_regular_files(tmp_path):
    lab, nb = "04-manual-towers", "manual-towers"
    subs, course = tmp_path / "subs", tmp_path / "course"
    (course / lab).mkdir(parents=True)
    secret = course / lab / f"{nb}.ipynb"
    secret.write_text(json.dumps(RELEASE))

    def folder(student):
        (subs / student / lab).mkdir(parents=True)
        return subs / student / lab / f"{nb}.ipynb"

    folder("honest").write_text(json.dumps(RELEASE))
    folder("link-to-source").symlink_to(secret)
    folder("link-to-zero").symlink_to("/dev/zero")
    folder("link-to-null").symlink_to("/dev/null")
    os.mkfifo(folder("fifo"))
    os.link(secret, folder("hard-link"))
    folder("huge").write_bytes(b" " * (intake.MAX_NOTEBOOK + 1))
    (subs / "linked-folder").symlink_to(course)
    (subs / "lab-link" / lab).parent.mkdir(parents=True)
    (subs / "lab-link" / lab).symlink_to(course / lab)
    (subs / "top-level-link.ipynb").symlink_to(secret)
    (subs / "stamp" / lab).mkdir(parents=True)
    (subs / "stamp" / lab / f"{nb}.ipynb").write_text(json.dumps(RELEASE))
    (subs / "stamp" / lab / "timestamp.txt").symlink_to("/dev/zero")
    zero, null = os.stat("/dev/zero"), os.stat("/dev/null")
    got = {s.name: s.status for s in intake.find_submissions(subs, lab, [nb])}
    assert got == {
        "honest": "graded",
        "link-to-source": f"not graded: link-to-source/{lab}/{nb}.ipynb is a symbolic link: only regular files and folders are read",
        "link-to-zero": f"not graded: link-to-zero/{lab}/{nb}.ipynb is a symbolic link: only regular files and folders are read",
        "link-to-null": f"not graded: link-to-null/{lab}/{nb}.ipynb is a symbolic link: only regular files and folders are read",
        "fifo": f"not graded: fifo/{lab}/{nb}.ipynb is a named pipe, not a regular file",
        "hard-link": f"not graded: hard-link/{lab}/{nb}.ipynb is a hard link (one more name of a file elsewhere): hand in a copy",
        "huge": f"not graded: huge/{lab}/{nb}.ipynb is over the {intake.MAX_NOTEBOOK >> 20} MiB a notebook may have",
        "linked-folder": "not graded: linked-folder is a symbolic link: only regular files and folders are read",
        "lab-link": f"not graded: lab-link/{lab} is a symbolic link: only regular files and folders are read",
        "top-level-link": "not graded: top-level-link.ipynb is a symbolic link: only regular files and folders are read",
        "stamp": f"not graded: stamp/{lab}/timestamp.txt is a symbolic link: only regular files and folders are read",
    }, got
    assert (os.stat("/dev/zero"), os.stat("/dev/null")) == (zero, null)
    assert json.loads(secret.read_text()) == RELEASE


def test_one_student_handed_in_twice_is_not_guessed(tmp_path):
    (tmp_path / "ann" / "04-manual-towers").mkdir(parents=True)
    (tmp_path / "ann" / "04-manual-towers" / "manual-towers.ipynb").write_text(json.dumps(RELEASE))
    (tmp_path / "ann.ipynb").write_text(json.dumps(RELEASE))
    got = intake.find_submissions(tmp_path, "04-manual-towers", ["manual-towers"])
    assert [(s.name, s.status) for s in got] == [
        ("ann", "not graded: handed in twice (a folder and a notebook named ann): keep one")]


def test_stderr_of_a_test_cell_is_output_not_failure():
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    from nbgrader.converters.autograde import Autograde
    from nbgrader.utils import determine_grade

    from dpc_instructor import nbgrader_hooks

    # nbgrader's default steps, ours after Execute (an nbgrader upgrade must not drop a step silently)
    assert Autograde().autograde_preprocessors == nbgrader_hooks.NBGRADER_AUTOGRADE
    cell = new_code_cell("warnings.warn('x')", metadata={"nbgrader": {
        "grade": True, "grade_id": "t", "points": 2, "solution": False, "locked": True}})
    cell.outputs = [new_output("stream", name="stderr", text="UserWarning: x\n")]
    assert determine_grade(cell, None) == (0, 2)  # nbgrader alone: a warning costs the points
    nb, _ = nbgrader_hooks.StderrIsOutput()(new_notebook(cells=[cell]), {})  # as nbgrader calls it
    cell = nb.cells[0]
    assert determine_grade(cell, None) == (2, 2) and cell.outputs[0]["text"] == "UserWarning: x\n"
    cell.outputs.append(new_output("error", ename="AssertionError", evalue="wrong", traceback=[]))
    assert determine_grade(cell, None) == (0, 2)  # an error still does


def test_set_parameters_adds_the_values_to_the_parameters_cell(tmp_path):
    path = tmp_path / "lab.ipynb"
    path.write_text(json.dumps(RELEASE))
    template.set_parameters(path, {"N_SAMPLES": 256, "KERAS_WORKERS": [1, 2], "LATENCY_MS": 4.0})
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict = {}
    exec(notebook.source(cell), values)  # the cell as the kernel runs it
    assert (values["N_SAMPLES"], values["KERAS_WORKERS"], values["LATENCY_MS"]) == (256, [1, 2], 4.0)
    assert values["BATCH_SIZE"] == 32  # the others keep their defaults
    assert notebook.grade_id(cell) == "lab01-parameters"


def test_every_job_of_a_run_gets_its_seed(tmp_path):
    """The reference and every student of one run see the same hidden cases: the run's seed is in
    each job's environment (and so the kernel's)."""
    assert job.job_env(tmp_path, None, 4242)["DPC_GRADE_SEED"] == "4242"
    assert job.job_env(tmp_path, 30, 0)["DPC_GRADE_SEED"] == "0"


def test_a_kernel_whose_hidden_cases_are_made_outside_gets_no_seed(tmp_path, monkeypatch):
    """Lab 10 (hidden_cases in a locked cell): the kernels get no seed, not even the grader's own
    DPC_GRADE_SEED, which sandbox.clean_env passes on; the cases are made in a job of their own."""
    monkeypatch.setenv("DPC_GRADE_SEED", "4242")
    assert "DPC_GRADE_SEED" not in job.job_env(tmp_path, None, None)
    lab10 = json.loads((ROOT / "solutions" / "10-failure-diagnosis" / "failure-diagnosis.ipynb").read_text())
    at = cases.cases_cell(lab10)
    assert at is not None and notebook.grade_id(lab10["cells"][at]) == "lab10-draw"
    # everything the cases job runs comes before the first test cell: no student's answer is in it
    first_test = min(i for i, c in enumerate(lab10["cells"]) if notebook.nbgrader(c).get("grade"))
    assert at < first_test and not any(notebook.nbgrader(c).get("solution") for c in lab10["cells"][:at])
    assert notebook.grade_id(RELEASE["cells"][cases.cases_cell(RELEASE)]) == "lab01-cases"  # lab 1's too
    horovod = json.loads((ROOT / "labs" / "06-horovod" / "horovod.ipynb").read_text())
    assert cases.cases_cell(horovod) is None  # lab 6: a training run, no cases to draw


def test_each_hidden_case_counts_only_in_its_own_cell_and_the_reference_must_get_it_right():
    """assign_cases: every test cell records the student's answer for every case; the grader's
    truth (never in a kernel) makes each record count only in the cell its case belongs to."""
    def rec(name, value, case):
        return {"name": name, "value": value, "rtol": 1e-5, "atol": 1e-6, "judged": True, "case": case}

    truth = [{"cell": "t-hang", "expect": [[1], "hang"]}, {"cell": "t-died", "expect": [[0], "died"]}]
    records = {gid: [rec("visible", 3, None), rec("job 0", [[1], "hang"], 0), rec("job 1", [[0], "died"], 1)]
               for gid in ("t-hang", "t-died")}
    cases.assign_cases(records, truth)
    assert [[r["judged"] for r in records[g]] for g in ("t-hang", "t-died")] == [[True, True, False],
                                                                                   [True, False, True]]
    wrong = {"t-hang": [rec("job 0", [[0], "hang"], 0)], "t-died": [rec("job 1", [[0], "died"], 1)]}
    with pytest.raises(ValueError, match="t-hang got the hidden case 0 wrong"):
        cases.assign_cases(wrong, truth)
    with pytest.raises(ValueError, match=r"no test cell recorded the hidden case\(s\) \[1\]"):
        cases.assign_cases({"t-hang": [rec("job 0", [[1], "hang"], 0)]}, truth)


def test_a_seed_that_is_no_number_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    monkeypatch.setenv("DPC_GRADE_SEED", "abc")
    with pytest.raises(SystemExit) as stop:
        grade.main([str(tmp_path / "subs"), "--lab", "04-manual-towers", "--course", str(tmp_path / "c")])
    assert str(stop.value.code) == "grade: DPC_GRADE_SEED must be a non-negative integer, not 'abc'"


def _gradebook(db: Path, lab: str, student: str | None = None) -> None:
    """An nbgrader gradebook with lab (one notebook, one test cell of 2 points), and student's
    submission of it with full marks (a job's gradebook after autograde)."""
    import warnings

    from nbgrader.api import Gradebook

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{db}") as gb:
        warnings.simplefilter("ignore")  # SQLAlchemy's SAWarning in add_submission (as Course.record)
        gb.add_assignment(lab)
        gb.add_notebook("nb", lab)
        gb.add_grade_cell("lab99-test", "nb", lab, max_score=2, cell_type="code")
        if student:
            gb.add_student(student)
            gb.add_submission(lab, student)
            grade = gb.find_grade("lab99-test", "nb", lab, student)
            grade.auto_score, grade.needs_manual_grade = 2, False
            gb.db.commit()


def test_the_course_keeps_regular_files_of_a_job_and_follows_no_link(tmp_path, monkeypatch):
    """What the student's code left in its graded folder (the kernel writes there) is copied into
    the course by root: a relative link into the job's own folder (the reference answers, the job's
    gradebook with the hidden tests) or a link to a folder elsewhere must not bring anything in."""
    lab, sid, secret = "99-unit", "ann", "SECRET-8c1f"
    monkeypatch.setenv("PATH", f"{gradebook.BIN}{os.pathsep}{os.environ['PATH']}")  # nbgrader's alembic
    course = gradebook.Course(tmp_path / "course")
    _gradebook(course.root / "gradebook.db", lab)
    (course.root / "source" / lab).mkdir(parents=True)
    nb = {"cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "source": "my_answer = 1", "outputs": [],
                     "execution_count": 1}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (course.root / "source" / lab / "nb.ipynb").write_text(json.dumps(nb))
    scratch = course.jobs / f"{lab}-{sid}-job"
    scratch.mkdir()
    _gradebook(scratch / "gradebook.db", lab, sid)
    (scratch / "source" / lab).mkdir(parents=True)
    (scratch / "source" / lab / "nb.ipynb").write_text("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\n")
    elsewhere = tmp_path / "elsewhere"  # a folder the sandbox's user can read, outside the job
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "notes.txt").write_text(secret)
    submitted, graded = (scratch / kind / sid / lab for kind in ("submitted", "autograded"))
    for folder in (submitted, graded):
        (folder / "data").mkdir(parents=True)
        (folder / "nb.ipynb").write_text(json.dumps(nb))
        (folder / "data" / "mine.txt").write_text("my own file")
    (submitted / "timestamp.txt").write_text("2026-11-20 10:00:00")
    (graded / "answers.ipynb").symlink_to(f"../../../source/{lab}/nb.ipynb")  # relative, into the job
    (graded / "data" / "gradebook.db").symlink_to("../../../../gradebook.db")
    (graded / "elsewhere").symlink_to(elsewhere)
    os.mkfifo(graded / "pipe")  # never opened (a read of it would block)
    notes: list[str] = []
    result = course.record(lab, sid, scratch, "graded", notes, 1.0, "Ann", 7)
    assert result == (2.0, 2.0, {"lab99-test": 2.0}, [])
    kept = course.root / "autograded" / sid / lab
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*")) == ["data", "data/mine.txt", "nb.ipynb"]
    assert (kept / "data" / "mine.txt").read_text() == "my own file"
    assert sorted(str(p.relative_to(course.root / "submitted")) for p in (course.root / "submitted").rglob("*")) == [
        "ann", f"ann/{lab}", f"ann/{lab}/data", f"ann/{lab}/data/mine.txt", f"ann/{lab}/nb.ipynb",
        f"ann/{lab}/timestamp.txt"]
    outside_job = [p for p in course.root.rglob("*") if "jobs" not in p.relative_to(course.root).parts]
    assert not [p for p in outside_job if p.is_symlink()]
    assert [p for p in outside_job if p.name == "gradebook.db"] == [course.root / "gradebook.db"]
    leaked = [p for p in outside_job if p.is_file() and p.name != "gradebook.db"
              and ("BEGIN SOLUTION" in p.read_text() or secret in p.read_text())]
    assert not leaked, leaked
    link = "is a symbolic link: only regular files and folders are read"
    line = (f"not kept in the course (only folders and regular files are): autograded/answers.ipynb {link}; "
            f"autograded/data/gradebook.db {link}; autograded/elsewhere {link}; "
            f"autograded/pipe is a named pipe, not a regular file")
    assert notes == [line]
    assert course.statuses()[sid][lab]["notes"] == [line]
    pages = course.feedback(tmp_path / "feedback")  # feedback copies and reads the same way
    assert pages == [tmp_path / "feedback" / sid / lab / "nb.html"]
    assert (tmp_path / "feedback" / sid / lab / "timestamp.txt").read_text() == "2026-11-20 10:00:00"
    assert "my_answer" in pages[0].read_text() and secret not in pages[0].read_text()


def outcome(code: int, output: str = "", out_of_memory: bool = False, disk_full: bool = False):
    return sandbox.Outcome(code, output, out_of_memory, disk_full)


def test_only_the_grading_machines_failures_are_tried_again():
    """host_failure: a sandbox or kernel that did not start, or a job killed from outside, is the
    machine's (tried again); what the submission did (its limits, its errors) is not."""
    proc = "bwrap: open /proc/9/ns/ns failed: No such file or directory"
    kernel_log = (f"[AutogradeApp | INFO] Autograding ann/04-manual-towers/manual-towers.ipynb\n{proc}\n"
                  "[AutogradeApp | ERROR] There was an error processing assignment: ...\nTraceback ...\n"
                  "RuntimeError: Kernel died before replying to kernel_info\n")
    assert failures.host_failure(outcome(1, kernel_log)) == f"the kernel did not start ({proc})"
    assert failures.host_failure(outcome(1, "RuntimeError: Kernel didn't respond in 60 seconds\n")) == (
        "the kernel did not start (RuntimeError: Kernel didn't respond in 60 seconds)")
    outer = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
    assert failures.host_failure(outcome(1, f"\n{outer}\n")) == f"its sandbox did not start ({outer})"
    assert failures.host_failure(outcome(137)) == "the job was killed from outside (SIGKILL), not by a limit"
    assert failures.host_failure(outcome(-15)) == "the job was killed from outside (SIGTERM), not by a limit"
    for own in [outcome(0, kernel_log), outcome(-1), outcome(137, out_of_memory=True),
                outcome(-9, disk_full=True), outcome(153), outcome(-25),
                outcome(1, "nbclient.exceptions.DeadKernelError: Kernel died\n"),
                outcome(1, "CellTimeoutError: A cell timed out\n"), outcome(1, f"print('x')\n{proc}\n")]:
        assert failures.host_failure(own) is None, own


def waits(*series: tuple[float, float, float]) -> cpuwait.CpuWaits:
    return cpuwait.CpuWaits(root=0, series=list(series))


def test_a_cell_past_its_limit_is_the_machines_only_when_it_waited_for_a_cpu():
    """busy_timeout: a cell past its limit is tried again when, while it ran, the job's threads waited
    for a CPU longer than they ran and for a quarter of its limit; a sleeping cell (neither) or a spinning one (ran) is the
    submission's, and the note says what was measured."""
    line = "[AutogradeApp | ERROR] dpc-timeout lab01-fast-tf-pipeline 45 s at 1000.000\n"
    assert failures.cell_timeouts("x\n" + line) == [("lab01-fast-tf-pipeline", 45, 1000.0)]
    starved = sandbox.Outcome(0, line, False, cpu=waits((900.0, 0, 0), (955.0, 1.0, 0.5), (1000.25, 15.0, 70.5)))
    assert failures.busy_timeout(starved) == ("cell lab01-fast-tf-pipeline ran past its 45 s limit while the job's "
                                           "processes waited 70 s for a CPU and ran 14 s: the machine was busy")
    slept = sandbox.Outcome(0, line, False, cpu=waits((900.0, 0, 0), (955.0, 1.0, 0.5), (1000.25, 1.2, 0.6)))
    spun = sandbox.Outcome(-1, line, False, cpu=waits((900.0, 0, 0), (955.0, 1.0, 0.5), (1000.25, 45.5, 3.0)))
    # A sleeping loop beside other work: it waited a few seconds in all, more than it ran, but the
    # wait is not what kept it past its limit (the interrupt survivor of lab 1's grading, in CI)
    slept_busy = sandbox.Outcome(0, line.replace(" 45 s ", " 180 s "), False,
                                 cpu=waits((800.0, 0, 0), (820.0, 1.0, 0.5), (1000.25, 1.3, 3.6)))
    for own in (slept, spun, slept_busy, outcome(0), outcome(0, line)):
        assert failures.busy_timeout(own) is None, own
    assert failures.measured(slept) == ("cell lab01-fast-tf-pipeline: in its 45 s the job's processes ran 0.2 s and "
                                     "waited 0.1 s for a CPU")
    assert failures.measured(outcome(0, "no time-out\n")) == ""


def test_a_starved_thread_is_seen_waiting_and_a_sleeping_one_is_not():
    """dpc_runtime.cpuwait on real processes: a child that spins on a core beside two others that
    spin there (each in a session of its own) waits longer than it runs; one that sleeps does neither."""
    with gradekit.hogs_on_one_core(2) as core:
        spinner = subprocess.Popen(gradekit.spin_argv(core, 0.6))
        sampled = cpuwait.CpuWaits(spinner.pid)
        while spinner.poll() is None:
            sampled.sample()
        ran, waited = sampled.series[-1][1:]
        assert ran >= 0.3 and waited > ran, (ran, waited)
    # It says when its interpreter has started: what it ran and waited before that (more than 0.05 s
    # on a loaded machine) is no part of its sleep.
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; print('asleep', flush=True); sys.stdin.read()"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert sleeper.stdout is not None and sleeper.stdout.readline() == b"asleep\n"
    sampled = cpuwait.CpuWaits(sleeper.pid)
    sampled.sample()
    before = sampled.series[-1][1:]
    for _ in range(5):
        sampled.sample()
    sleeper.communicate(b"")
    assert sampled.between(0, time.time()) == pytest.approx(before, abs=0.05)


def test_the_seed_probe_finds_the_seed_in_the_environment_or_a_file(tmp_path, monkeypatch):
    """The probe is a real one: it raises on the seed in the environment or in a file, else not."""
    code = gradekit.SEED_PROBE.format(seed=987654321)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPC_GRADE_SEED", raising=False)
    exec(code, {})
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.json").write_text('{"x": 987654321}')
    with pytest.raises(RuntimeError, match="notes.json"):
        exec(code, {})
    (tmp_path / "sub" / "notes.json").unlink()
    monkeypatch.setenv("DPC_GRADE_SEED", "1")
    with pytest.raises(RuntimeError, match="environment"):
        exec(code, {})


def test_make_clean_keeps_every_gradebook(tmp_path):
    """`make clean` removes what runs wrote and never a gradebook (issue 56: the default one was
    build/course, which it removed): the default lives in gradebook/, and a gradebook that an earlier
    COURSE= put under build/ stops the clean with one line that says where, nothing removed."""
    assert not gradebook.DEFAULT.is_relative_to(gradekit.ROOT / "build"), gradebook.DEFAULT
    shutil.copy(gradekit.ROOT / "Makefile", tmp_path / "Makefile")
    term = tmp_path / gradebook.DEFAULT.relative_to(gradekit.ROOT) / "gradebook.db"
    wrote = [tmp_path / "build" / "nbtest" / "x.ipynb", tmp_path / "course" / "runs" / "10" / "train.py"]
    for path in [term, *wrote]:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"grades of the term")
    done = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(p.exists() for p in wrote) and term.read_bytes() == b"grades of the term"
    old = tmp_path / "build" / "course" / "gradebook.db"  # the default before issue 56
    old.parent.mkdir(parents=True)
    old.write_bytes(b"last term")
    done = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "clean: build/ holds a gradebook (build/course ): nothing removed" in done.stdout, (
        done.stdout + done.stderr)
    assert old.read_bytes() == b"last term" and term.exists()
