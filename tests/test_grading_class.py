"""Grading a class: submissions written to attack the grader are contained and change nobody's
grade, tampering with test cells is undone, a late batch is added to the one course gradebook
without touching anyone else, the course CSV and the feedback pages come out of it, and the
student's self-check exits non-zero on a failing lab.

All graded exactly as an instructor would (src/dpc_instructor/grade.py, two students at a time, sandboxed).
The attackers know the grader's exact paths (the strongest case: a real one would search).
"""
from __future__ import annotations

import csv
import html
import json
import re
import subprocess
import sys
import uuid

import psutil
import pytest
import test_grading_01_input_pipeline as lab1
from gradekit import ROOT, grade_all, submission as fill

from dpc_instructor import markers
from dpc_runtime import notebook, sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None,
                                reason=f"no sandbox here: {sandbox.unavailable()}")
LAB = lab1.LAB
NB = lab1.RELEASE.name
TOKEN = uuid.uuid4().hex  # names the daemon a hostile submission leaves behind


def cheat(subs, course) -> str:
    """No answer of its own: takes the reference answer from any copy of the source it can read,
    and writes full marks into every gradebook it can reach."""
    return f'''import glob, json, sqlite3
seen = []
for path in glob.glob("{ROOT}/solutions/{LAB}/*.ipynb") + glob.glob("{course}/**/source/{LAB}/*.ipynb", recursive=True):
    seen.append(path)
    for c in json.load(open(path))["cells"]:
        if c["metadata"].get("nbgrader", {{}}).get("grade_id") == "lab01-fast-tf-pipeline":
            exec("".join(c["source"]))
for db in glob.glob("{course}/**/gradebook.db", recursive=True) + glob.glob("../../../*.db"):
    seen.append(db)
    con = sqlite3.connect(db)
    con.execute("UPDATE grade SET auto_score = (SELECT max_score FROM grade_cells WHERE grade_cells.id = grade.cell_id)")
    con.commit()
print("SAW", seen)'''


def vandal(subs, course) -> str:
    """Finds the other submissions (paths from the grader's command lines), rewrites them, makes the
    folders the grader is about to make, and leaves a detached process without the launch marker."""
    return f'''import glob, os, subprocess, sys
done = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        line = open(f"/proc/{{pid}}/cmdline").read()
    except OSError:
        continue
    if "{subs}" in line:
        done.append("saw the grader: " + line.replace(chr(0), " ")[:80])
for path in glob.glob("{subs}/*/{LAB}/*.ipynb") + glob.glob("{course}/**/*.ipynb", recursive=True):
    try:
        open(path, "w").write("{{}}")  # what it reaches, it ruins (its own copy included)
    except OSError:
        pass
for d in ["{course}/autograded/victim/{LAB}", "{course}/submitted/victim/{LAB}", "{course}/jobs/x"]:
    try:
        os.makedirs(d)  # what the grader was about to make
    except OSError:
        pass
env = {{k: v for k, v in os.environ.items() if k != "DPC_LAUNCH_ID"}}
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "{TOKEN}"],
                 start_new_session=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("VANDAL", done)'''


def tampered() -> dict:
    """Correct answers; one test cell lost its nbgrader metadata (one click in JupyterLab), one
    had its points raised, one was emptied, one was deleted."""
    nb = fill(lab1.RELEASE, lab1.CORRECT)
    cells = []
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid == "lab01-test-tf-parallel":
            cell["metadata"].pop("nbgrader")
        elif gid == "lab01-test-torch-pinned":
            cell["metadata"]["nbgrader"]["points"] = 100
        elif gid == "lab01-test-torch-same-batches":
            cell["source"] = "pass"
        elif gid == "lab01-test-tf-prefetch":
            continue
        cells.append(cell)
    nb["cells"] = cells
    return nb


def output_of(course, student: str) -> str:
    """Everything the graded notebook of student printed."""
    nb = json.loads((course / "autograded" / student / LAB / NB).read_text())
    return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


def course_rows(course, tmp) -> list[dict[str, str]]:
    """The course CSV, as `make grades` writes it."""
    out = tmp / "course.csv"
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.gradebook", "export", "--course",
                           str(course), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with out.open() as f:
        return list(csv.DictReader(f))


def totals(rows) -> dict[str, str]:
    """student -> points of the lab, from the course CSV."""
    return {r["student"]: r["points"] for r in rows if r["lab"] == LAB and r["cell"] == "(lab total)"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("class")
    course = work / "course"
    subs = work / "submissions"  # where gradekit writes them
    first = {
        "victim": {NB: fill(lab1.RELEASE, lab1.CORRECT)},
        "cheat": {NB: fill(lab1.RELEASE, {**lab1.CORRECT, "lab01-fast-tf-pipeline": cheat(subs, course)})},
        "vandal": {NB: fill(lab1.RELEASE, {**lab1.CORRECT, "lab01-fast-torch-loader":
                                            lab1.CORRECT["lab01-fast-torch-loader"] + "\n" + vandal(subs, course)})},
        "tamper": {NB: tampered()},
        "wrong": {NB: fill(lab1.RELEASE, lab1.WRONG)},
    }
    rows1 = grade_all(LAB, first, work, course=course)
    daemons = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
               if TOKEN in " ".join(p.info["cmdline"] or [])]
    before = course_rows(course, work)
    late_work = tmp_path_factory.mktemp("late")
    rows2 = grade_all(LAB, {"wrong": {NB: fill(lab1.RELEASE, lab1.CORRECT)},
                            "late": {NB: fill(lab1.RELEASE, lab1.CORRECT)}}, late_work, course=course)
    after = course_rows(course, work)
    return {"rows1": rows1, "rows2": rows2, "daemons": daemons, "before": before, "after": after,
            "course": course, "work": work}


def test_the_sandbox_hides_the_answers_and_the_gradebooks(graded):
    row = graded["rows1"]["cheat"]
    assert (row["status"], row["score"]) == ("graded", "5"), row  # its own torch answers only
    assert "SAW []" in output_of(graded["course"], "cheat")


def test_other_students_are_out_of_reach(graded):
    # It saw none of the grader's processes; what it wrote or made landed in its sandbox only (the
    # submissions are unchanged: grade_all checks that), and its neighbours were graded as usual.
    assert "VANDAL []" in output_of(graded["course"], "vandal")
    assert not (graded["course"] / "jobs" / "x").exists()
    assert json.loads((graded["course"] / "submitted" / "victim" / LAB / NB).read_text())["cells"]
    assert (graded["rows1"]["vandal"]["status"], graded["rows1"]["vandal"]["score"]) == ("graded", "10")
    victim = graded["rows1"]["victim"]
    assert (victim["status"], victim["score"], victim["max_score"]) == ("graded", "10", "10")


def test_nothing_outlives_grading(graded):
    assert graded["daemons"] == [], "a detached process of a submission survived its grading"


def test_tampered_test_cells_are_restored(graded):
    row = graded["rows1"]["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "10", "10"), row
    assert "restored the lost metadata of lab01-test-tf-parallel" in row["notes"]
    assert "restored the metadata of lab01-test-torch-pinned" in row["notes"]
    assert "re-added the deleted cell lab01-test-tf-prefetch" in row["notes"]
    assert graded["rows1"]["wrong"]["score"] == "5"


def test_a_late_batch_changes_only_its_own_students(graded):
    before, after = totals(graded["before"]), totals(graded["after"])
    assert before == {"victim": "10", "cheat": "5", "vandal": "10", "tamper": "10", "wrong": "5"}
    assert after == {**before, "wrong": "10", "late": "10"}
    # every test cell of every student, one row each, and a course total per student
    cells = {r["cell"] for r in graded["after"] if r["lab"] == LAB} - {"(lab total)"}
    assert cells == {"lab01-test-tf-same-batches", "lab01-test-tf-parallel", "lab01-test-tf-prefetch",
                     "lab01-test-torch-same-batches", "lab01-test-torch-workers", "lab01-test-torch-pinned"}
    course = {r["student"]: (r["points"], r["max_points"]) for r in graded["after"] if r["lab"] == "(course)"}
    assert course["late"][0] == "10" and float(course["late"][1]) >= 10


def test_feedback_shows_results_without_hidden_tests(graded, tmp_path):
    out = tmp_path / "feedback"
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.gradebook", "feedback", "--course",
                           str(graded["course"]), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pages = {p.parts[-3]: p.read_text() for p in out.rglob("feedback.html")}
    assert set(pages) == {"victim", "cheat", "vandal", "tamper", "wrong", "late"}
    source = json.loads((ROOT / "solutions" / LAB / NB).read_text())
    hidden = [line.strip() for c in source["cells"] for block in markers.hidden_tests(notebook.source(c))
              for line in block.splitlines() if len(line.strip()) > 12]
    student_copy = lab1.RELEASE.read_text()
    hidden = [line for line in hidden if json.dumps(line)[1:-1] not in student_copy]  # hidden only
    assert len(hidden) >= 5, "lab 1 has hidden tests to hide"
    for student, page in pages.items():
        text = html.unescape(re.sub(r"<[^>]+>", "", page))
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"feedback of {student} shows hidden tests: {leaked}"
    assert "failed" in pages["cheat"] and "Score:</b> 5 / 10" in pages["cheat"]
    assert "Score:</b> 10 / 10" in pages["late"]


def test_self_check_exit_code(tmp_path):
    lab = tmp_path / LAB
    lab.mkdir()
    (lab / NB).write_text(json.dumps(fill(lab1.RELEASE, lab1.WRONG)))
    done = subprocess.run([sys.executable, "-m", "dpc_runtime.check", str(lab)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    table = dict(re.findall(r"^(lab\d+-test-[\w-]+)\s+\S+\s+(passed|FAILED)", done.stdout, re.M))
    assert table == {"lab01-test-tf-same-batches": "passed", "lab01-test-tf-parallel": "FAILED",
                     "lab01-test-tf-prefetch": "passed", "lab01-test-torch-same-batches": "FAILED",
                     "lab01-test-torch-workers": "passed", "lab01-test-torch-pinned": "FAILED"}, done.stdout
    assert f"{NB}: 5 / 10 visible points, 3 test cell(s) failed" in done.stdout
