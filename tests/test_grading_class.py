"""Grading a class: submissions written to attack the grader are contained and change nobody's
grade, tampering with test cells is undone, a late batch is added to the one course gradebook
without touching anyone else, the course CSV and the feedback pages come out of it, and the
student's self-check exits non-zero on a failing lab.

All graded exactly as an instructor would (src/dpc_instructor/grade.py, two students at a time, sandboxed),
on lab 4 (the cheapest lab to run: the attacks do not depend on the lab). The attackers know the
grader's exact paths (the strongest case: a real one would search).
"""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import psutil
import pytest
import test_grading_04_manual_towers as lab4
import tiers
from gradekit import HOST_FILES, ROOT, grade_all, host_state, submission as fill

from dpc_instructor import markers
from dpc_runtime import notebook, sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None,
                                reason=f"no sandbox here: {sandbox.unavailable()}")
LAB = lab4.LAB
NB = lab4.RELEASE.name
TOKEN = uuid.uuid4().hex  # names the daemon a hostile submission leaves behind


def cheat(subs, course) -> str:
    """No answer of its own: takes the reference answer from any copy of the source it can read,
    and writes full marks into every gradebook it can reach."""
    return f'''import glob, json, sqlite3
seen = []
for path in glob.glob("{ROOT}/solutions/{LAB}/*.ipynb") + glob.glob("{course}/**/source/{LAB}/*.ipynb", recursive=True):
    seen.append(path)
    for c in json.load(open(path))["cells"]:
        if c["metadata"].get("nbgrader", {{}}).get("grade_id") == "lab04-tower-step":
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
for path in {HOST_FILES!r} + glob.glob("{course}/*.db"):
    try:
        os.chmod(path, 0o444)  # through a bind mount, a change would reach the host
        done.append("changed " + path)
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
    nb = fill(lab4.RELEASE, lab4.CORRECT)
    cells = []
    for cell in nb["cells"]:
        gid = notebook.grade_id(cell)
        if gid == "lab04-test-equal":
            cell["metadata"].pop("nbgrader")
        elif gid == "lab04-test-shared":
            cell["metadata"]["nbgrader"]["points"] = 100
        elif gid == "lab04-test-split":
            cell["source"] = "pass"
        elif gid == "lab04-test-loss":
            continue
        cells.append(cell)
    nb["cells"] = cells
    return nb


def lab4_tests() -> list[str]:
    """The grade ids of lab 4's test cells."""
    cells = json.loads(lab4.RELEASE.read_text())["cells"]
    return [notebook.grade_id(c) for c in cells if notebook.nbgrader(c).get("grade")]


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


LATE_SEED = str(int(os.environ["DPC_GRADE_SEED"]) + 1)  # the late batch's hidden cases: another draw
# nbgrader's files beside the late student's notebook (as `nbgrader collect` leaves them)
HANDED_IN = {"timestamp.txt": "2026-11-24 09:00:00.000000 UTC", "submission_secret.txt": "3f9c2b7d"}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("class")
    course = work / "course"
    subs = work / "submissions"  # where gradekit writes them
    host = host_state()
    first = {  # the gate's: the answers reader, the vandal with its daemon, and their victim
        "victim": {NB: fill(lab4.RELEASE, lab4.CORRECT)},
        "cheat": {NB: fill(lab4.RELEASE, {**lab4.CORRECT, "lab04-tower-step": cheat(subs, course)})},
        "vandal": {NB: fill(lab4.RELEASE, {**lab4.CORRECT, "lab04-tower-step":
                                            lab4.CORRECT["lab04-tower-step"] + "\n" + vandal(subs, course)})},
    }
    full = tiers.runs(request, "full")  # its tests read the whole class's gradebook: every student then
    if full:
        first |= {"tamper": {NB: tampered()}, "wrong": {NB: fill(lab4.RELEASE, lab4.SUMMING)}}
    rows1 = grade_all(LAB, first, work, course=course, parameters="defaults")  # what students run
    daemons = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
               if TOKEN in " ".join(p.info["cmdline"] or [])]
    if not full:
        return {"rows1": rows1, "daemons": daemons, "course": course, "work": work, "host": (host, host_state())}
    before = course_rows(course, work)
    late_work = tmp_path_factory.mktemp("late")
    rows2 = grade_all(LAB, {"wrong": {NB: fill(lab4.RELEASE, lab4.CORRECT)},
                            "late": {NB: fill(lab4.RELEASE, lab4.CORRECT), **HANDED_IN}}, late_work, course=course,
                      args=("--seed", LATE_SEED))  # its own hidden cases (its own reference run anyway: ci values)
    after = course_rows(course, work)
    return {"rows1": rows1, "rows2": rows2, "daemons": daemons, "before": before, "after": after,
            "course": course, "work": work, "host": (host, host_state())}


@pytest.mark.gate
def test_the_sandbox_hides_the_answers_and_the_gradebooks(graded):
    row = graded["rows1"]["cheat"]
    assert (row["status"], row["score"]) == ("graded", "4"), row  # its own place_variables only
    assert "SAW []" in output_of(graded["course"], "cheat")


@pytest.mark.gate
def test_other_students_are_out_of_reach(graded):
    # It saw none of the grader's processes; what it wrote or made landed in its sandbox only (the
    # submissions are unchanged: grade_all checks that), and its neighbours were graded as usual.
    assert "VANDAL []" in output_of(graded["course"], "vandal")
    assert not (graded["course"] / "jobs" / "x").exists()
    assert json.loads((graded["course"] / "submitted" / "victim" / LAB / NB).read_text())["cells"]
    assert (graded["rows1"]["vandal"]["status"], graded["rows1"]["vandal"]["score"]) == ("graded", "14")
    victim = graded["rows1"]["victim"]
    assert (victim["status"], victim["score"], victim["max_score"]) == ("graded", "14", "14")


@pytest.mark.gate
def test_nothing_outlives_grading(graded):
    assert graded["daemons"] == [], "a detached process of a submission survived its grading"


@pytest.mark.gate
def test_the_host_is_untouched(graded):
    before, after = graded["host"]
    assert after == before, "a submission changed a device node or file of the grading host"


@pytest.mark.full
def test_tampered_test_cells_are_restored(graded):
    row = graded["rows1"]["tamper"]
    assert (row["status"], row["score"], row["max_score"]) == ("graded", "14", "14"), row
    assert "restored the lost metadata of lab04-test-equal" in row["notes"]
    assert "restored the metadata of lab04-test-shared" in row["notes"]
    assert "re-added the deleted cell lab04-test-loss" in row["notes"]
    assert graded["rows1"]["wrong"]["score"] == lab4.SCORES["summing"]


@pytest.mark.full
def test_a_late_batch_changes_only_its_own_students(graded):
    before, after = totals(graded["before"]), totals(graded["after"])
    assert before == {"victim": "14", "cheat": "4", "vandal": "14", "tamper": "14", "wrong": lab4.SCORES["summing"]}
    assert after == {**before, "wrong": "14", "late": "14"}
    # every test cell of every student, one row each, and a course total per student
    cells = {r["cell"] for r in graded["after"] if r["lab"] == LAB} - {"(lab total)"}
    assert cells == set(lab4_tests())
    course = {r["student"]: (r["points"], r["max_points"]) for r in graded["after"] if r["lab"] == "(course)"}
    assert course["late"][0] == "14" and float(course["late"][1]) >= 14
    # each grade keeps the seed its hidden cases were drawn with (to grade the same cases again)
    seeds = {r["student"]: r["seed"] for r in graded["after"] if r["cell"] == "(lab total)"}
    first = os.environ["DPC_GRADE_SEED"]
    assert seeds == {"victim": first, "cheat": first, "vandal": first, "tamper": first,
                     "wrong": LATE_SEED, "late": LATE_SEED}


@pytest.mark.full
def test_feedback_shows_results_without_hidden_tests(graded, tmp_path):
    """One page per student and notebook, in nbgrader's feedback layout (with the submission's
    timestamp and secret beside it, for `nbgrader release_feedback`); no hidden test on any page."""
    out = tmp_path / "feedback"
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.gradebook", "feedback", "--course",
                           str(graded["course"]), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pages = {p.parts[-3]: p.read_text() for p in out.glob(f"*/{LAB}/*.html")}
    assert set(pages) == {"victim", "cheat", "vandal", "tamper", "wrong", "late"}
    assert {p.name for p in out.rglob("*.html")} == {NB.replace(".ipynb", ".html")}
    for name, text in HANDED_IN.items():  # kept from the submission for nbgrader
        assert (out / "late" / LAB / name).read_text() == text
    assert not (out / "victim" / LAB / "submission_secret.txt").exists()
    source = json.loads((ROOT / "solutions" / LAB / NB).read_text())
    hidden = [line.strip() for c in source["cells"] for block in markers.hidden_tests(notebook.source(c))
              for line in block.splitlines() if len(line.strip()) > 12]
    student_copy = lab4.RELEASE.read_text()
    hidden = [line for line in hidden if json.dumps(line)[1:-1] not in student_copy]  # hidden only
    assert len(hidden) >= 5, "lab 4 has hidden tests to hide"
    for student, page in pages.items():
        text = html.unescape(re.sub(r"<[^>]+>", "", page))
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"feedback of {student} shows hidden tests: {leaked}"
    assert "<span class='score'>4 / 14</span>" in pages["cheat"]
    failed, passed = pages["cheat"].find("badge failed"), pages["cheat"].find("badge passed")
    assert 0 < failed < passed, "failed tests come first"
    assert "<span class='score'>14 / 14</span>" in pages["late"] and "badge failed" not in pages["late"]


@pytest.mark.gate
def test_self_check_exit_code(tmp_path):
    lab = tmp_path / LAB
    lab.mkdir()
    (lab / NB).write_text(json.dumps(fill(lab4.RELEASE, lab4.SUMMING)))
    done = subprocess.run([sys.executable, "-m", "dpc_runtime.check", str(lab)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    table = dict(re.findall(r"^(lab\d+-test-[\w-]+)\s+\S+\s+(passed|FAILED)", done.stdout, re.M))
    failed = {"lab04-test-split", "lab04-test-equal", "lab04-test-uneven", "lab04-test-loss"}
    assert table == {t: "FAILED" if t in failed else "passed" for t in lab4_tests()}, done.stdout
    assert f"{NB}: 8 / 14 visible points, 4 test cell(s) failed" in done.stdout


@pytest.mark.gate
def test_the_self_check_judges_outside_the_kernel_as_the_grader_does(tmp_path):
    lab = tmp_path / LAB
    lab.mkdir()
    (lab / NB).write_text(json.dumps(fill(lab4.RELEASE, lab4.TAMPERING)))
    checks = lab4.RELEASE.with_name(lab4.RELEASE.stem + ".checks.json")
    shutil.copy(checks, lab)  # what the release ships beside the notebook
    done = subprocess.run([sys.executable, "-m", "dpc_runtime.check", str(lab)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    table = dict(re.findall(r"^(lab\d+-test-[\w-]+)\s+\S+\s+(passed|FAILED)", done.stdout, re.M))
    assert table == {t: "FAILED" for t in lab4_tests()}, done.stdout  # no kernel error shown, no points
    assert "the grader's own check" in done.stdout
    assert f"{NB}: 0 / 14 visible points" in done.stdout
