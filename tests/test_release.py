"""The student release (`make release`, src/dpc_instructor/release.py), built once into a temporary folder.

What students get must hold no answer and no hidden test, none of the instructor's files, and must
work on its own: the git branch and the archive give the same tree as the folder, and the student
Makefile's `make check` fails an unanswered lab and passes a correct one.

The rule for "no answer" is src/dpc_instructor/release.py's `secret_lines`: every non-trivial line between
nbgrader's `### BEGIN SOLUTION` / `### END SOLUTION` and `### BEGIN HIDDEN TESTS` /
`### END HIDDEN TESTS` in solutions/ (trivial: blank, only brackets or punctuation, or one bare
keyword such as `pass` or `return`; lines the labs give students anyway are not secrets). It must
not be a line of any released text file (notebooks decoded: sources, outputs, metadata), except
where src/dpc_instructor/taught.txt lists that exact line for that chapter, helper, example or benchmark.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import test_grading_04_manual_towers as lab4
from gradekit import ROOT, submission

from dpc_instructor import release

pytestmark = pytest.mark.gate  # tests/tiers.py

LAB = "01-input-pipeline"
GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
# The instructor's and maintainers' rooms, and single files in them (release.py keeps its own list).
FORBIDDEN = ["solutions", "tests", "src/dpc_instructor", "src/dpc_maintainer", "src/dpc_instructor/grade.py",
             "src/dpc_maintainer/solutions.py", ".github", "build", "CONTRIBUTING.md", "course/runs"]
TOP_LEVEL = {".git", ".gitignore", "Makefile", "README.md", "benchmarks", "course", "course.yml",
             "environment.yml", "examples", "labs", "nbgrader_config.py", "pyproject.toml", "requirements.txt",
             "requirements-hub.txt", "LICENSE", "LICENSE-CONTENT.md", "CHANGELOG.md",
             "slurm", "src"}


def git(*args: str, cwd: Path) -> str:
    """git's stdout in cwd, without the user's configuration; fails the test on an error."""
    done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def tree(folder: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under folder (.git left out): its bytes and whether it is executable."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR))
            for p in sorted(folder.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(folder).parts}


def colleague_file(rel: str) -> None:
    """Fail with one clear line when a file a colleague is writing has not landed yet."""
    if not (ROOT / rel).is_file():
        pytest.fail(f"{rel} missing (colleague's work)", pytrace=False)


def build_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release, written by src/dpc_instructor/release.py into a temporary folder (the last word of
    output); what the fixture `built` gives, for other test files' fixtures too."""
    out = tmp_path_factory.mktemp("release") / "dp-course-student"
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.release", "--out", str(out),
                           "--allow-missing", "--no-labs-check"],  # labs/ fresh: test_notebook_rules
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.strip().splitlines()[-1].split()[-1]) == out.resolve(), done.stdout
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release, written by src/dpc_instructor/release.py into a temporary folder."""
    return build_release(tmp_path_factory)


def test_the_rule_finds_the_answers_and_hidden_tests() -> None:
    """The rule of secret_lines finds lab 1's answer and hidden tests, and no trivial line."""
    secrets = release.secret_lines()
    kinds = {where.rsplit(": ", 1)[1] for where in secrets.values()}
    assert kinds == {"answer", "hidden test"}
    assert len(secrets) > 150, len(secrets)
    # Lab 1's answer and one of its hidden tests; trivial lines are not secrets.
    assert "ds = ds.map(lambda i: load_tf(source, i), num_parallel_calls=tf.data.AUTOTUNE)" in secrets
    assert "small = helpers.SlowSource(n, image_size=8, latency_ms=0, seed=images)" in secrets
    assert not {"", "pass", "return", ")", "])"} & set(secrets)


def test_the_scan_catches_a_planted_answer(tmp_path: Path) -> None:
    """A solution notebook, or one answer line re-indented in a .py file, is reported as a leak."""
    # The solution notebook itself, and one answer line re-indented with a comment, in a .py file.
    (tmp_path / "labs").mkdir()
    shutil.copy(ROOT / "solutions" / LAB / "input-pipeline.ipynb", tmp_path / "labs" / "lab.ipynb")
    (tmp_path / "notes.py").write_text("if True:\n      ds = ds.map(lambda i: load_tf(source, i), "
                                       "num_parallel_calls=tf.data.AUTOTUNE)  # !\n")
    leaks = release.find_leaks(tmp_path)
    assert any("from 01-input-pipeline/input-pipeline.ipynb [lab01-fast-tf-pipeline]: answer" in x
               and x.startswith("labs/lab.ipynb") for x in leaks), leaks
    assert any("hidden test" in x and x.startswith("labs/lab.ipynb") for x in leaks), leaks
    assert any(x.startswith("notes.py: 'ds = ds.map(lambda i") for x in leaks), leaks


def test_no_answer_and_no_hidden_test_is_released(built: Path) -> None:
    """(1) No answer or hidden-test line in any released file, beyond taught.txt's chapter lines."""
    leaks = release.find_leaks(built, release.secret_lines(), release.taught())
    assert not leaks, "answer or hidden-test lines in the release:\n" + "\n".join(leaks)
    # Nowhere but in course material may a line be allowed: labs, config, README, tools hold none.
    strict = [o for o in release.overlaps(built, release.secret_lines())
              if not release.under(o[0], release.COURSE_MATERIAL)]
    assert not strict, strict
    # Nor any nbgrader delimiter (a solution or source notebook copied by mistake).
    for rel, (data, _) in tree(built).items():
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
            assert marker.encode() not in data, f"{rel} holds {marker!r}"


def test_nothing_of_the_instructors_side_is_released(built: Path) -> None:
    """(2) No forbidden path, and a .git of the release's own (nothing of this repository's)."""
    assert not [p for p in FORBIDDEN + release.FORBIDDEN if (built / p).exists()]
    assert {p.name for p in built.iterdir()} <= TOP_LEVEL, sorted(p.name for p in built.iterdir())
    assert not any(p.name in {"solutions", "tests", "runs", "__pycache__", ".ipynb_checkpoints"}
                   for p in built.rglob("*") if ".git" not in p.relative_to(built).parts)
    # The release's .git is its own: no link to this repository's objects, none of its commits.
    assert not (built / ".git" / "objects" / "info" / "alternates").exists()
    head = git("rev-parse", "HEAD", cwd=ROOT).strip()
    assert subprocess.run(["git", "cat-file", "-e", head], cwd=built, env=GIT_ENV).returncode != 0
    listed = git("rev-list", "--objects", "--all", cwd=built).splitlines()
    reachable = {line.split()[0] for line in listed}
    stored = {line.split()[0] for line in
              git("cat-file", "--batch-all-objects", "--batch-check", cwd=built).splitlines()}
    assert stored <= reachable, "objects in the release's .git that its branch does not hold"


def test_the_self_check_tools_are_released(built: Path) -> None:
    """src/dpc_runtime/check.py and src/dpc_runtime/sandbox.py ship as they are here, with nbgrader_config.py's
    limits, and so do both licences (issue 56: the code's BSD-3-Clause, the text's CC BY 4.0)."""
    assert {"LICENSE", "LICENSE-CONTENT.md"} <= set(release.REQUIRED)
    assert "BSD 3-Clause" in (built / "LICENSE").read_text() and "CC BY 4.0" in (built / "LICENSE-CONTENT.md").read_text()
    for rel in release.REQUIRED:
        colleague_file(rel)
        assert (built / rel).read_bytes() == (ROOT / rel).read_bytes()
    config = (built / "nbgrader_config.py").read_text()
    assert "timeout_func" in config and "slow_cells:" in (built / "course.yml").read_text()  # its limits


def test_paths_the_notebooks_and_readme_name_are_released(built: Path) -> None:
    """Every file a chapter, lab, the README or the Makefile names is in the release."""
    named = set()
    pattern = re.compile(r"\b((?:benchmarks|examples|slurm|tools|src|labs|course)/[\w./-]*"
                         r"\.(?:py|sh|sbatch|ipynb|patch|yml|txt|toml))\b")
    for path in [*built.glob("course/*.ipynb"), *built.glob("labs/*/*.ipynb"), built / "README.md",
                 built / "Makefile"]:
        named |= set(pattern.findall(path.read_text()))
    missing = sorted(p for p in named if not (built / p).exists() and not p.startswith("course/runs")
                     and p not in release.REQUIRED)
    assert not missing, f"named by a chapter, lab, README or Makefile but not released: {missing}"
    assert {"examples/scaling/ddp_worker.py", "slurm/torchrun.sbatch", "src/dpc_setup/setup.sh"} <= named


def test_the_student_readme_lists_what_the_chapters_cite(built: Path) -> None:
    """The chapters cite R1-R5 by number: the student README lists them (README.md's References,
    the one text of them), and every placeholder of the template is filled."""
    readme = (built / "README.md").read_text()
    cited = set()
    for nb in built.glob("course/*.ipynb"):  # the text, not the pictures' base64
        text = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
        cited |= set(re.findall(r"\bR[1-9]\b", text))
    assert cited, "the chapters cite their sources"
    assert all(f"| {r} |" in readme for r in cited), sorted(cited)
    assert "## References" in readme and "@" not in re.sub(r"\S+@\S+", "", readme)


def test_the_branch_clones_to_the_same_tree(built: Path, tmp_path: Path) -> None:
    """(3) Branch `student`: one commit by the release author naming HEAD; a clone: the same tree."""
    assert git("branch", "--format=%(refname:short)", cwd=built).split() == ["student"]
    assert git("status", "--porcelain", "--untracked-files=all", "--ignored", cwd=built) == ""
    log = git("log", "--format=%an|%s", "student", cwd=built).splitlines()
    source = git("rev-parse", "--short", "HEAD", cwd=ROOT).strip()
    assert log == [f"dp-course release|Student release of dp-course {release.version()} ({source})"], log
    top = re.search(r"^## (\S+)", (built / "CHANGELOG.md").read_text(), re.M)
    assert top is not None and top.group(1) == release.version()  # the release names the version it ships
    git("clone", "-q", "--branch", "student", str(built), str(tmp_path / "clone"), cwd=tmp_path)
    assert tree(tmp_path / "clone") == tree(built)


def test_the_archive_unpacks_to_the_same_tree(built: Path, tmp_path: Path) -> None:
    """(4) The .tar.gz beside the folder unpacks to one folder with the same tree."""
    archive = built.parent / f"{built.name}.tar.gz"
    with tarfile.open(archive) as tar:
        assert {m.name.split("/")[0] for m in tar.getmembers()} == {built.name}
        tar.extractall(tmp_path, filter="data")
    assert tree(tmp_path / built.name) == tree(built)


def test_a_second_release_continues_the_branch(built: Path, tmp_path: Path) -> None:
    """A release into a previous one adds one commit on top of it (pushes fast-forward)."""
    # Built again into a copy of the first: one more commit on top, so a push fast-forwards.
    again = tmp_path / built.name
    shutil.copytree(built, again, symlinks=True)
    first = git("rev-parse", "student", cwd=again).strip()
    release.build(again, allow_missing=True, check_labs=False)
    assert git("rev-parse", "student~1", cwd=again).strip() == first
    assert git("rev-list", "--count", "student", cwd=again).strip() == "2"
    assert git("status", "--porcelain", "--untracked-files=all", cwd=again) == ""


def test_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A foreign OUT folder, one inside the course's folders, or stale labs/ are refused."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("not a release")
    with pytest.raises(release.ReleaseError, match="not a previous release"):
        release.build(tmp_path / "mine", allow_missing=True, check_labs=False)
    with pytest.raises(release.ReleaseError, match="under build/ or outside"):
        release.build(ROOT / "labs", allow_missing=True, check_labs=False)

    class StaleLabs:
        """src/dpc_instructor/labs.py as it answers when labs/ is out of date."""

        def generate(self, release_dir: Path, db_dir: Path) -> None:
            """Generate nothing."""

        def stale(self, release_dir: Path) -> list[str]:
            """One stale notebook."""
            return [f"{LAB}/input-pipeline.ipynb"]

    monkeypatch.setattr(release, "labs_module", StaleLabs)
    with pytest.raises(release.ReleaseError, match=r"labs/ is out of date .*make labs"):
        release.check_labs_fresh()


def test_the_student_makefile(built: Path) -> None:
    """The student Makefile: usage, help, PY= skips set-up and runs python -m dpc_runtime.check; make release OUT=."""
    # Without LAB: the usage and the labs, before any set-up (none would start: the default .venv).
    done = subprocess.run(["make", "-s", "-C", str(built), "check"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "usage: make check LAB=" in done.stdout and LAB in done.stdout
    assert not (built / ".venv").exists()
    done = subprocess.run(["make", "-s", "-C", str(built), "help"], capture_output=True, text=True)
    assert done.returncode == 0 and "make check LAB=01-input-pipeline" in done.stdout
    dry = subprocess.run(["make", "-n", "-C", str(built), "check", f"LAB={LAB}",
                          "PY=/opt/py/bin/python"], capture_output=True, text=True).stdout
    assert f'/opt/py/bin/python -m dpc_runtime.check "labs/{LAB}"' in dry and "setup.sh" not in dry
    dry = subprocess.run(["make", "-n", "-C", str(built), "check", f"LAB={LAB}"], capture_output=True,
                         text=True).stdout
    assert "bash src/dpc_setup/setup.sh" in dry and f'.venv/bin/python -m dpc_runtime.check "labs/{LAB}"' in dry
    main = subprocess.run(["make", "-n", "-C", str(ROOT), "release", "OUT=/tmp/x"], capture_output=True,
                          text=True).stdout
    assert '-m dpc_instructor.release --out "/tmp/x"' in main


@pytest.mark.slow
def test_the_release_alone_checks_a_lab(built: Path, tmp_path: Path) -> None:
    """(5) `make check` in the release fails the unanswered lab 4 and passes the correct answers (the
    cheapest lab to run: what is checked is the release, not the lab)."""
    colleague_file("src/dpc_runtime/check.py")
    work = tmp_path / built.name
    shutil.copytree(built, work, symlinks=True)
    (work / ".venv").symlink_to(ROOT / ".venv")  # the course's packages, not a second install
    env = {**os.environ, "PYTHONPATH": str(work / "src")}  # the release's helpers, not this tree's
    cmd = ["make", "-C", str(work), "check", f"LAB={lab4.LAB}", f"PY={work / '.venv' / 'bin' / 'python'}"]
    unanswered = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    out = unanswered.stdout + unanswered.stderr
    assert "-m dpc_runtime.check" in out and unanswered.returncode != 0, out
    assert "NotImplementedError" in out and "0 / 14 visible points" in out, out  # answers missing

    notebook = work / "labs" / lab4.LAB / lab4.RELEASE.name
    notebook.write_text(json.dumps(submission(notebook, lab4.CORRECT)))
    answered = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert "14 / 14 visible points" in answered.stdout, answered.stdout


@pytest.mark.slow
def test_another_user_checks_a_lab_from_the_class_environment(built: Path) -> None:
    """(6) The class environment (`make class-env`, one per node) serves a user who is not root and
    builds nothing: the release's `make check`, with DPC_PYTHON set as a hub sets it, fails the
    unanswered lab 4 and passes the correct answers, the helpers taken from the user's own copy."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the class environment goes under /opt and the check runs as another user")
    prefix = Path(os.environ.get("DPC_CLASS_PREFIX", "/opt/dp-course"))
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "class-env", f"PREFIX={prefix}"],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"DPC_PYTHON={prefix}/env/bin/python" in done.stdout, done.stdout
    home = Path(tempfile.mkdtemp(prefix="dpc-class-user-", dir="/tmp"))  # pytest's tmp is root's alone
    try:
        home.chmod(0o755)
        work = home / built.name
        shutil.copytree(built, work, symlinks=True)
        notebook = work / "labs" / lab4.LAB / lab4.RELEASE.name
        user = pwd.getpwnam("nobody")
        for path in [home, *home.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", f"DPC_PYTHON={prefix}/env/bin/python",
               "make", "-C", str(work), "check", f"LAB={lab4.LAB}"]
        unanswered = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
        out = unanswered.stdout + unanswered.stderr
        assert f"{prefix}/env/bin/python -m dpc_runtime.check" in out and "setup.sh" not in out, out
        assert unanswered.returncode != 0 and "0 / 14 visible points" in out, out
        notebook.write_text(json.dumps(submission(notebook, lab4.CORRECT)))
        answered = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
        assert answered.returncode == 0 and "14 / 14 visible points" in answered.stdout, \
            answered.stdout + answered.stderr
        assert not (work / ".venv").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)
