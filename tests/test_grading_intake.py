"""What a class hands in, read the way an instructor needs it (issue: grades a submission cannot
fake): lab 4 graded end to end with the real grader, two at a time.

- intake reads regular files only: a link (to the instructor's source, to a classmate, to
  /dev/zero or /dev/null), a named pipe or a hard link is that student's status, and nothing of
  its target is read or copied anywhere in the course;
- student code never runs as root: it cannot change the host's device nodes or the course;
- a student's total disk use is limited (the status says so);
- any name is a student: other scripts, spaces vs '_', case, a leading dash, each graded apart,
  shown as handed in;
- honest mistakes: a copied answer and test cell (duplicate ids), a locked cell deleted and
  another dragged elsewhere, are repaired with a note and graded on the answers;
- the grading machine's failures are not the student's: a kernel whose sandbox failed to start is
  tried again in the same run.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import test_grading_04_manual_towers as lab4
from gradekit import HOST_FILES, ROOT, grade_all, host_state, lost, tiered

from dpc_instructor import grade
from dpc_runtime import notebook, sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None,
                                reason=f"no sandbox here: {sandbox.unavailable()}")
LAB, NB = lab4.LAB, lab4.RELEASE.name
SOURCE = ROOT / "solutions" / LAB / NB

HOSTILE = lab4.CORRECT["lab04-place-variables"] + f'''
import os
print("UID", os.getuid(), os.geteuid())
for path in {HOST_FILES!r}:
    for change in (lambda p: os.chmod(p, 0o444), lambda p: os.chown(p, os.getuid(), -1)):
        try:
            change(path)
            print("CHANGED", path)
        except OSError:
            pass
'''
FILLER = lab4.CORRECT["lab04-place-variables"] + '''
import itertools
for k in itertools.count():  # files under the per-file limit, until stopped
    open(f"filler-{k}.bin", "wb").write(b"1" * (16 << 20))
'''


def copied_cells() -> dict:
    """Correct, with the answer cell and the test after it copied and pasted (same ids)."""
    nb = lab4.submission(lab4.CORRECT)
    cells = notebook.by_grade_id(nb)
    first = nb["cells"].index(cells["lab04-place-variables"])
    nb["cells"][first + 2:first + 2] = [json.loads(json.dumps(c)) for c in nb["cells"][first:first + 2]]
    return nb


def moved_cells() -> dict:
    """Correct; the harness cell deleted, the imports dragged below the first answer."""
    nb = lab4.submission(lab4.CORRECT)
    cells = notebook.by_grade_id(nb)
    nb["cells"].remove(cells["lab04-harness"])
    nb["cells"].remove(cells["lab04-imports"])
    nb["cells"].insert(nb["cells"].index(cells["lab04-place-variables"]) + 1, cells["lab04-imports"])
    return nb


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("intake")
    correct = lab4.submission(lab4.CORRECT)
    full = {
        "李雷": {NB: copied_cells()},
        "王芳": {NB: lab4.submission(lab4.SUMMING)},
        "ann lee": {NB: moved_cells()},
        "ann_lee": {NB: lab4.submission(lab4.SUMMING)},
        "-rf": {NB: lab4.submission({**lab4.CORRECT, "lab04-place-variables": HOSTILE})},
        "Ann_lee": {},  # differs from ann_lee in case only: a student of their own
    }
    # the gate: the disk filler alone
    students = tiered(request, {"filler": {NB: lab4.submission({**lab4.CORRECT, "lab04-place-variables": FILLER})}},
                      full)

    def links(subs: Path) -> None:
        if "Ann_lee" not in students:  # the odd files are the full tier's
            return
        for student, target in [("link-to-source", SOURCE), ("link-to-classmate", subs / "ann_lee" / LAB / NB),
                                ("link-to-zero", Path("/dev/zero")), ("link-to-null", Path("/dev/null"))]:
            (subs / student / LAB).mkdir(parents=True)
            (subs / student / LAB / NB).symlink_to(target)
        (subs / "pipe" / LAB).mkdir(parents=True)
        os.mkfifo(subs / "pipe" / LAB / NB)
        (subs / "hard-link" / LAB).mkdir(parents=True)
        (subs / "classmate-copy").mkdir()
        (subs / "classmate-copy" / NB).write_text(json.dumps(correct))
        os.link(subs / "classmate-copy" / NB, subs / "hard-link" / LAB / NB)
        (subs / "folder-link").symlink_to(subs / "ann_lee")

    before = host_state()
    rows = grade_all(LAB, students, work, cell_timeout=60, notebook_timeout=400, also=links,
                     args=("--disk-mb", "200", "--seed", str(lab4.grading_seed())))  # lab 4's file's seed: its reference run serves
    return {"rows": rows, "before": before, "after": host_state(), "course": work / "course"}


def output_of(course: Path, grader_id: str) -> str:
    nb = json.loads((course / "autograded" / grader_id / LAB / NB).read_text())
    return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


@pytest.mark.full
def test_links_pipes_and_hard_links_are_refused_and_nothing_of_them_is_copied(graded):
    rows, course = graded["rows"], graded["course"]
    link = "is a symbolic link: only regular files and folders are read"
    for student in ["link-to-source", "link-to-classmate", "link-to-zero", "link-to-null"]:
        assert rows[student]["status"] == f"not graded: {student}/{LAB}/{NB} {link}", rows[student]
    assert rows["folder-link"]["status"] == f"not graded: folder-link {link}"
    assert rows["pipe"]["status"] == f"not graded: pipe/{LAB}/{NB} is a named pipe, not a regular file"
    assert rows["hard-link"]["status"].startswith(f"not graded: hard-link/{LAB}/{NB} is a hard link")
    for student in ["link-to-source", "link-to-classmate", "link-to-zero", "link-to-null", "pipe",
                    "hard-link", "folder-link"]:
        assert rows[student]["score"] == "0"
        assert not any(course.glob(f"*/{student}")), f"something of {student} was copied"
    leaked = [p for p in course.rglob("*.ipynb") if "source" not in p.parts and "release" not in p.parts
              and "### BEGIN SOLUTION" in p.read_text()]
    assert not leaked, f"reference answers copied into {leaked}"


@pytest.mark.full
def test_student_code_runs_unprivileged_and_the_host_is_untouched(graded):
    assert graded["after"] == graded["before"]
    row = graded["rows"]["-rf"]
    assert (row["status"], row["score"]) == ("graded", "14"), row
    out = output_of(graded["course"], row["grader_id"])
    uid = out.split("UID", 1)[1].split()[:2]
    assert "0" not in uid and "CHANGED" not in out, out


@pytest.mark.gate
def test_disk_use_is_limited(graded):
    row = graded["rows"]["filler"]
    assert row["status"] == ("not graded: wrote more than 200 MiB of files in all (the limit for "
                             "one student's files); stopped there"), row
    assert not list((graded["course"] / "jobs").iterdir()), "the job folder is removed"


@pytest.mark.full
def test_every_name_is_its_own_student(graded):
    rows = graded["rows"]
    ids = {name: row["grader_id"] for name, row in rows.items()}
    assert len(set(ids.values())) == len(ids)
    assert all(not i.startswith("-") for i in ids.values())
    summing = lab4.SCORES["summing"]  # lab 4's grading test says what the summing mistake scores
    assert (rows["李雷"]["score"], rows["王芳"]["score"]) == ("14", summing)
    assert (rows["ann lee"]["score"], rows["ann_lee"]["score"]) == ("14", summing)
    assert rows["Ann_lee"]["status"] == f"missing notebook(s): {NB}"
    names = json.loads((graded["course"] / "names.json").read_text(encoding="utf-8"))
    assert {names[ids[n]] for n in ["李雷", "王芳", "ann lee", "ann_lee", "-rf", "Ann_lee"]} == {
        "李雷", "王芳", "ann lee", "ann_lee", "-rf", "Ann_lee"}


@pytest.mark.full
def test_copied_moved_and_deleted_cells_are_repaired_with_a_note(graded):
    copied, moved = graded["rows"]["李雷"], graded["rows"]["ann lee"]
    assert (copied["status"], copied["score"]) == ("graded", "14"), copied
    assert "a copy of lab04-place-variables became a cell of your own" in copied["notes"]
    assert "an id of its own" in copied["notes"]
    assert (moved["status"], moved["score"]) == ("graded", "14"), moved
    assert "re-added the deleted cell lab04-harness" in moved["notes"]
    assert "put the moved cell(s) lab04-imports back in their place" in moved["notes"]
    assert not lost(moved)


@pytest.mark.full
def test_a_kernel_sandbox_that_fails_to_start_is_tried_again_in_the_same_run(tmp_path, monkeypatch, capsys):
    """Two students' kernels once never started (their nested bwrap failed: `bwrap: open
    /proc/9/ns/ns failed`) and were reported "not graded" until regraded by hand. The machine's
    failure, not theirs: the grader tries again in the same run. Here the kernel's sandbox of the
    student's first try fails to start the way bwrap does (its own error, exit 1, before the
    kernel runs); the second try grades the correct answer right, the retry in its notes and in
    the run's summary."""
    subs, out = tmp_path / "subs", tmp_path / "grades.csv"
    (subs / "ann" / LAB).mkdir(parents=True)
    (subs / "ann" / LAB / NB).write_text(json.dumps(lab4.submission(lab4.CORRECT)))
    real, failed = sandbox.kernel_spec, []

    def kernel_spec(folder: Path, writable: list[Path], *args, **kwargs) -> Path:
        spec = real(folder, writable, *args, **kwargs)
        if writable[0].parent.name == "ann" and not failed:  # ann's first try (not the reference's)
            kernel = json.loads((spec / "kernel.json").read_text())
            kernel["argv"][1:1] = ["--ro-bind", str(tmp_path / "not-there"), "/not-there"]
            (spec / "kernel.json").write_text(json.dumps(kernel))
            failed.append(folder)
        return spec

    monkeypatch.setattr(sandbox, "kernel_spec", kernel_spec)
    assert grade.main([str(subs), "--lab", LAB, "--out", str(out), "--course", str(tmp_path / "course"),
                       "--cell-timeout", "60", "--notebook-timeout", "400", "--jobs", "1",
                       "--parameters", "ci"]) == 0
    printed = capsys.readouterr().out
    with out.open(encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    assert len(failed) == 1
    assert (row["student"], row["status"], row["score"]) == ("ann", "graded", "14"), row
    assert row["notes"] == (f"graded again after a failure of the grading machine, not of this submission: "
                            f"try 1: the kernel did not start (bwrap: Can't find source path "
                            f"{tmp_path / 'not-there'}: No such file or directory)"), row
    assert "ann: 14 / 14  graded (" in printed and ", graded again 1x)" in printed, printed
    assert "; 1 graded again after a failure of the grading machine, 0 not graded;" in printed, printed
    status = json.loads((tmp_path / "course" / "status.json").read_text())["ann"][LAB]
    assert status["graded"] and status["notes"] == [row["notes"]]
    assert not list((tmp_path / "course" / "jobs").iterdir()), "every try's job folder is removed"
