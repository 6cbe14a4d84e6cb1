"""Every command the student text names works where the student is (issue 37).

The commands come from the release itself (built as tests/test_release.py builds it): the fenced
shell blocks of the student README and of the notebooks' markdown, and their inline `make ...`,
`python ...` and launcher commands. Each runs from a copy of the release, as a user who is not root
(`nobody`, when the tests run as root and nobody can run a Python of the course's version), in the
two places students work:

* own: the copy's own `.venv`, `make` as typed, and `python` as in a terminal of `make lab`'s
  JupyterLab (the PATH and PYTHONPATH the Makefile exports);
* hub: a class environment, with DPC_PYTHON and PATH as src/dpc_instructor/hub/jupyterhub_config.py
  sets them and the copy's src/ on PYTHONPATH.

Both environments are stand-ins for what `make setup` and `make class-env` build (minutes and a
network): virtual environments of a Python the student can run that see the course's installed
packages, with the course's console scripts (torchrun, horovodrun, ...) pointed at them; the
student's .venv has the copy's src/ installed (as setup.sh's editable install) and an up-to-date
stamp, while the class environment, like the real one, has no course package (src/ comes from
PYTHONPATH only).

How each command runs: a `make` command that only prints or removes (help, clean) as it is;
`make bench` with BENCH_ARGS=--help (every benchmark it would run, started); any other `make` command
as `make -n`; a Python script or module and a launcher with `--help`. None may fail or say "No rule
to make target", "No such file" or "command not found", and every file of the release a command or
its dry run names must exist. Commands that are not for running here (a script of your own, other
machines, sbatch, git, which the README test below runs) are listed with the reason.

Also here: the README's way to get the course on a shared machine (git's "dubious ownership"), a
real benchmark in both places, the self-check's whole failure messages, and the class environment's
JupyterLab settings for students (what the hub's browser then shows is only checked by
`make classroom-test`, not here).
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_release
from gradekit import ROOT
from traitlets.config import Config

from dpc_maintainer.classroom import port_open
from dpc_runtime import check
from dpc_runtime.launch import free_port

pytestmark = pytest.mark.gate  # tests/tiers.py

LAB = "01-input-pipeline"
BENCH = "ring_allreduce"
# The programs a student command starts with (after VAR=value assignments).
PYTHONS = {"python", "python3", ".venv/bin/python", "${DPC_PYTHON:-.venv/bin/python}"}
LAUNCHERS = {"torchrun", "horovodrun"}
OTHERS = {"make", "git", "sbatch", "bash", "conda", "pip", "tar", "jupyter", "nbgrader"}
ASSIGNMENT = re.compile(r"[A-Z_]+=\S*")
# Files of the release a command names (checked to exist; `<name>` stands for any).
RELEASE_PATH = re.compile(r"(?<![\w./-])((?:benchmarks|examples|slurm|src|labs|course)/[\w./<>*-]*[\w>*]"
                          r"|environment\.yml|requirements\.txt|course\.yml|nbgrader_config\.py)(?![\w/-])")
FAILURES = ("No rule to make target", "No such file", "command not found")
# Named by the student text, but not a student's command; the notebook's text should say so.
NOT_FOR_STUDENTS = {
    "make solutions": "chapter 7 names the maintainers' run of every notebook (src/dpc_maintainer, never "
                      "released) as what sets its GPU flag",
}


# --- the commands of the text --------------------------------------------------------------------

def fenced_and_inline(markdown: str) -> Iterator[str]:
    """Command lines of a markdown text: each line of its shell code blocks (comments dropped), then
    its inline code spans that start with a known program and have an argument."""
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", markdown, re.M | re.S):
        if lang in {"", "bash", "sh", "shell"}:
            for line in body.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                if line and not line.startswith("#") and program(line) is not None:
                    yield line
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if " " in span.strip() and program(span) is not None:
            yield span.strip()


def program(command: str) -> str | None:
    """The program a command starts (after VAR=value words), when it is one a student runs."""
    words = [w for w in command.split() if not ASSIGNMENT.fullmatch(w)]
    known = PYTHONS | LAUNCHERS | OTHERS
    return words[0] if words and words[0] in known else None


def student_commands(release: Path) -> dict[str, str]:
    """Every command the release's README and notebooks (markdown cells) name -> where, first place."""
    found: dict[str, str] = {}
    texts = [("README.md", (release / "README.md").read_text())]
    for nb in sorted([*release.glob("course/*.ipynb"), *release.glob("labs/*/*.ipynb")]):
        cells = json.loads(nb.read_text())["cells"]
        texts += [(f"{nb.relative_to(release)} cell {i}", "".join(c["source"]))
                  for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    for where, text in texts:
        for command in fenced_and_inline(text):
            found.setdefault(command, where)
    return found


def fill(command: str, folder: str = "") -> str:
    """The command with the text's placeholders filled in (a lab, a benchmark, the instructor's folder)."""
    for placeholder, value in {"<lab>": LAB, "LAB=...": f"LAB={LAB}", "benchmarks/<name>": f"benchmarks/{BENCH}",
                               "BENCH=<name>": f"BENCH={BENCH}", "<folder>": folder, "<url>": folder}.items():
        command = command.replace(placeholder, value)
    return command


def how(command: str) -> tuple[str | None, str]:
    """(the shell command to run for a student's command, or None; how it is run, or why not)."""
    if command in NOT_FOR_STUDENTS:
        return None, NOT_FOR_STUDENTS[command]
    words = shlex.split(command)
    start = next(i for i, w in enumerate(words) if not ASSIGNMENT.fullmatch(w))
    env, prog, args = words[:start], words[start], words[start + 1:]
    head = " ".join([*env, "${DPC_PYTHON:-.venv/bin/python}" if prog.startswith("${") else prog])
    if prog == "make":
        targets = [a for a in args if "=" not in a and not a.startswith("-")]
        if set(targets) <= {"help", "clean"}:
            return command, "as it is"
        if targets == ["bench"]:
            return f"{command} BENCH_ARGS=--help", "every benchmark it runs, with --help"
        return re.sub(r"\bmake\b", "make -n", command, count=1), "dry run (make -n)"
    if prog in PYTHONS:
        if args[:1] == ["-m"]:
            return f"{head} -m {args[1]} --help", "the module, with --help"
        if args and args[0].startswith("runs/"):
            return None, "a script the notebook writes when it runs"
        if not args or "/" not in args[0]:
            return None, "an example: a script of your own"
        return f"{head} {args[0]} --help", "the script, with --help"
    if prog in LAUNCHERS:
        return f"{prog} --help", "the launcher is there, with --help"
    if prog == "git":
        return None, "git: test_the_readme_gets_the_course_on_a_shared_machine runs the README's git steps"
    if prog == "tar":
        return None, "the archive beside a release: test_release checks that it unpacks to the same tree"
    return None, f"{prog}: for a cluster, another machine or another tool (the files it names are checked)"


def named_files(text: str) -> set[str]:
    """The release files a command (or a dry run's output) names."""
    return set(RELEASE_PATH.findall(text))


def missing_files(folder: Path, text: str) -> list[str]:
    """The files text names that folder lacks (`<name>` matches any name)."""
    return sorted(p for p in named_files(text)
                  if not (list(folder.glob(re.sub(r"<[^>]*>", "*", p))) if "<" in p or "*" in p
                          else (folder / p).exists()))


# --- where students are --------------------------------------------------------------------------

class Place:
    """A copy of the release as one student has it: its folder, the environment of their terminal
    (`python` commands), and the environment `make` starts in."""

    def __init__(self, name: str, folder: Path, terminal: dict[str, str], make: dict[str, str]) -> None:
        self.name, self.folder, self.terminal, self.make = name, folder, terminal, make

    def run(self, command: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """command (bash) in cwd (default: the copy), as the student: another user when we are root."""
        return as_student(["bash", "-c", command], env or self.make, cwd or self.folder, timeout)


def setpriv(user: pwd.struct_passwd | None) -> list[str]:
    """The words that run a command as user (nothing for ourselves)."""
    return [] if user is None else ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


@functools.cache
def python_and_user() -> tuple[str, pwd.struct_passwd | None]:
    """A base Python of the course's version and the user commands run as: `nobody` when the tests run
    as root and nobody can run that Python (the .venv's own base may lie in root's private home, as
    here: the class environment refuses such a Python too), else ourselves."""
    want = sys.version_info[:2]
    candidates = [getattr(sys, "_base_executable", sys.executable), f"/usr/bin/python{want[0]}.{want[1]}",
                  "/usr/bin/python3"]
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        for python in candidates:
            probe = subprocess.run([*setpriv(nobody), "env", "-i", python, "-c",
                                    f"import sys, venv; sys.exit(sys.version_info[:2] != {want})"],
                                   cwd="/", capture_output=True)
            if probe.returncode == 0:
                return python, nobody
    return candidates[0], None


def student() -> pwd.struct_passwd | None:
    """The user commands run as: nobody when the tests run as root (None: as ourselves)."""
    return python_and_user()[1]


def as_student(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """argv in cwd with exactly env, as student() (setpriv), stdout and stderr together."""
    return subprocess.run([*setpriv(student()), "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def hand_over(*paths: Path) -> None:
    """Make paths (and everything under them, links themselves) the student's."""
    user = student()
    if user is None:
        return
    for top in paths:
        for path in [top, *top.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


def stand_in_env(env: Path, own_src: Path | None = None) -> Path:
    """An environment like the ones `make setup` and `make class-env` build, cheaply: a venv of
    python_and_user()'s Python that imports the course's installed packages (a path entry: the
    course's own editable install, a .pth in there, is not read) and has the course's console scripts
    (torchrun, horovodrun, ...) pointed at it. With own_src, a student's .venv: that copy's src/
    installed as setup.sh installs it (editable: a path entry) and setup.sh's stamp. Its python."""
    subprocess.run([python_and_user()[0], "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "course-packages.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    if own_src is not None:
        (site / "__editable__.dp_course_helpers.pth").write_text(f"{own_src}\n")
        shutil.copy(ROOT / ".venv" / ".dpc-setup", env / ".dpc-setup")  # up to date: setup.sh installs nothing
    for script in sorted((ROOT / ".venv" / "bin").iterdir()):
        target = env / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        first, _, rest = script.read_bytes().partition(b"\n")
        if first.startswith(b"#!") and first.rstrip().endswith(b"/python"):
            target.write_bytes(f"#!{env / 'bin' / 'python'}\n".encode() + rest)
            target.chmod(0o755)
    return env / "bin" / "python"


def hub_environment(class_env: Path) -> dict[str, str]:
    """PATH and DPC_PYTHON of a user's server, as the hub's config sets them for this class environment."""
    config = ROOT / "src/dpc_instructor/hub/jupyterhub_config.py"
    cfg = Config()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPC_CLASS_ENV", str(class_env))
        exec(compile(config.read_text(), str(config), "exec"), {"get_config": lambda: cfg, "__file__": str(config)})
    env = cfg.Spawner.environment
    return {"PATH": env["PATH"], "DPC_PYTHON": env["DPC_PYTHON"]}


def make_environment(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment `make` gives its commands in folder (what `make lab` gives JupyterLab and so its
    terminals): env with the Makefile's PATH and PYTHONPATH."""
    extra = 'dpc-test-env:\n\t@echo "$$PATH"; echo "$$PYTHONPATH"\n'
    done = subprocess.run([*setpriv(student()), "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                           "make", "-s", "-f", "Makefile", "-f", "-", "dpc-test-env"], input=extra, cwd=folder,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    path, pythonpath = done.stdout.splitlines()[:2]
    return {**env, "PATH": path, "PYTHONPATH": pythonpath}


def test_the_self_check_says_where_the_kernel_died(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that dies (a cell ends its own process with SIGSEGV, as lab 1's did with PyPI's CUDA
    torch) is said as such: the cell by index and grade id, the signal, the points of the test cells
    before it and what could not run; the command fails (issue 59)."""
    def cell(source: str, gid: str | None = None, points: int = 0) -> dict:
        meta = {"nbgrader": {"grade_id": gid, "grade": bool(points), "points": points, "solution": False,
                             "locked": True, "schema_version": 3}} if gid else {}
        return {"cell_type": "code", "execution_count": None, "metadata": meta, "outputs": [], "source": source}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                                          "display_name": "Python 3"}},
          "cells": [cell("x = 1"), cell("assert x == 1", "t-before", 2), cell("assert x == 2", "t-wrong", 1),
                    {"cell_type": "markdown", "metadata": {}, "source": "The crash:"},
                    cell("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "crash"),
                    cell("assert x == 1", "t-after", 3)]}
    lab = tmp_path / "crash"
    lab.mkdir()
    (lab / "crash.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("COLUMNS", "200")  # the table wraps its messages to the terminal: none here
    assert check.main([str(lab / "crash.ipynb"), "--timeout", "300"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^t-before\s+2/2\s+passed$", out, re.M), out
    assert re.search(r"^t-after\s+0/3\s+FAILED$", out, re.M), out
    died = "the kernel died in cell 4 (crash): segmentation fault (SIGSEGV)"
    assert f"    could not run: {died}" in out, out
    assert (f"crash.ipynb: {died}.\nThe 2 test cell(s) before it passed 2 of their 3 points; the other 1 "
            f"(worth 3 of the 6 visible points) could not run.") in out, out
    assert "0 / 0" not in out and "0/0" not in out, out


def test_a_kernels_end_in_words() -> None:
    """How a kernel ended, from its exit code: a signal whether Popen (negative) or bubblewrap and a shell
    (128 + n) report it, a real-time signal by number, an exit code as a number, none as silence."""
    assert check.death_words(-11) == check.death_words(139) == "segmentation fault (SIGSEGV)"
    assert check.death_words(-9) == "killed (SIGKILL)" and check.death_words(134) == "aborted (SIGABRT)"
    assert check.death_words(-40).endswith("(signal 40)")
    assert check.death_words(1) == "it exited with code 1" and check.death_words(None) == "it stopped answering"


def test_the_self_check_runs_the_python_it_is_given(tmp_path: Path) -> None:
    """`make check PY=...` (and DPC_PYTHON): the notebook's kernel runs with the interpreter running the
    check, even where the copy has a .venv of its own (issue 59: .venv's won before)."""
    other = stand_in_env(tmp_path / "other")
    done = subprocess.run([str(other), "-c", "from dpc_runtime import sandbox; print(sandbox.PYTHON)"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(other), done.stdout
    assert (ROOT / ".venv").exists()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The student release (tests/test_release.py's build)."""
    return test_release.build_release(tmp_path_factory)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A folder under /tmp that another user can reach (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="dpc-student-commands-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def places(built: Path, scratch: Path) -> dict[str, Place]:
    """The release where students have it: with its own .venv, and on a class environment (a hub)."""
    home = scratch / "home"
    home.mkdir()
    base = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    own = scratch / "own" / built.name
    shutil.copytree(built, own, symlinks=True)
    stand_in_env(own / ".venv", own_src=own / "src")
    hub = scratch / "hub" / built.name
    shutil.copytree(built, hub, symlinks=True)
    class_env = stand_in_env(scratch / "class-env")
    hand_over(home, own.parent, hub.parent)
    terminal = {**base, **hub_environment(class_env.parent.parent), "PYTHONPATH": str(hub / "src")}
    assert terminal["DPC_PYTHON"] == str(class_env)
    return {"own": Place("own", own, make_environment(own, base), base),
            "hub": Place("hub", hub, terminal, terminal)}


# --- the tests -----------------------------------------------------------------------------------

def test_the_text_names_the_commands_this_test_runs(built: Path) -> None:
    """The extraction finds the commands issue 37 was about (it reads the text, so it can miss)."""
    found = student_commands(built)
    assert {"make bench", "make check LAB=01-input-pipeline", "make lab"} <= set(found), sorted(found)
    assert any(c.startswith("python benchmarks/") for c in found), sorted(found)
    assert any(c.startswith("git clone") for c in found) and any(".venv/bin/python" in c for c in found)
    assert not [c for c in found if c.startswith(".venv/bin/python")], "a command that works only with .venv"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["own", "hub"])
def test_every_command_the_student_text_names_works(built: Path, places: dict[str, Place], where: str) -> None:
    """Each command of the README and notebooks, run (or dry-run) from the release as a student."""
    place = places[where]
    ran, skipped, failed = [], [], []
    runs: dict[tuple[str, str], subprocess.CompletedProcess[str]] = {}  # a launcher's --help once
    for command, source in student_commands(built).items():
        filled = fill(command)
        absent = missing_files(place.folder, filled)
        if absent:
            failed.append(f"{source}: `{command}` names files the release lacks: {absent}")
        shell, why = how(filled)
        if shell is None:
            skipped.append(f"{source}: `{command}`: {why}")
            continue
        env = place.make if program(filled) == "make" else place.terminal
        done = runs.get((shell, str(env))) or runs.setdefault((shell, str(env)), place.run(shell, env))
        out = done.stdout
        bad = [f for f in FAILURES if f in out]
        if "make -n" in shell:
            bad += [f"the dry run names {p}, not in the release" for p in missing_files(place.folder, out)]
            bad += [f"{py} is not there" for py in re.findall(r"^(\S*/bin/python\S*) ", out, re.M)
                    if not os.access(place.folder / py, os.X_OK)]
        if done.returncode != 0 or bad:
            failed.append(f"{source}: `{command}` as `{shell}` ({why}): exit {done.returncode} {bad}\n"
                          + "\n".join(out.splitlines()[-15:]))
        else:
            ran.append(f"`{command}` ({why})")
    print(f"{where}: ran {len(ran)}:\n  " + "\n  ".join(ran) + f"\nnot run, {len(skipped)}:\n  " + "\n  ".join(skipped))
    assert not failed, f"{where}: {len(failed)} command(s) of the student text fail:\n" + "\n\n".join(failed)
    assert any("make bench" in r for r in ran) and any("python benchmarks/" in r for r in ran), ran


def test_make_bench_names_its_benchmarks_and_refuses_another(places: dict[str, Place]) -> None:
    """`make bench BENCH=<name>` runs that one; an unknown name is refused with the list, before any set-up."""
    place = places["own"]
    done = place.run("make bench BENCH=nosuch")
    assert done.returncode == 2 and "no benchmark benchmarks/nosuch.py" in done.stdout, done.stdout
    assert BENCH in done.stdout and "setup" not in done.stdout, done.stdout
    dry = place.run(f"make -n bench BENCH={BENCH}").stdout
    assert "for b in ring_allreduce;" in dry and "bash src/dpc_setup/setup.sh" in dry, dry
    dry = place.run("make -n bench", places["hub"].make, cwd=places["hub"].folder).stdout
    benches = sorted(p.stem for p in (place.folder / "benchmarks").glob("*.py"))
    assert f"for b in {' '.join(benches)};" in dry and "setup.sh" not in dry, dry
    assert f"{places['hub'].make['DPC_PYTHON']} benchmarks/$b.py --json build/bench/$b.json" in dry, dry
    help_ = place.run("make help").stdout
    assert "make bench" in help_ and "make cluster-test" in help_ and f"benchmarks: {' '.join(benches)}" in help_


@pytest.mark.slow
@pytest.mark.parametrize("where", ["own", "hub"])
def test_a_benchmark_runs_from_the_release(places: dict[str, Place], where: str) -> None:
    """`make bench BENCH=ring_allreduce` really runs (torchrun's ranks import the helpers of the copy:
    on the class environment only PYTHONPATH brings them), short, and writes its results."""
    place = places[where]
    done = place.run(f'make bench BENCH={BENCH} BENCH_ARGS="--quick --nprocs 2 --repeat 1"', timeout=600)
    assert done.returncode == 0 and "RATIO ring/gloo" in done.stdout, done.stdout[-3000:]
    assert (place.folder / "build" / "bench" / f"{BENCH}.json").is_file()


def test_the_readme_gets_the_course_on_a_shared_machine(built: Path, scratch: Path) -> None:
    """As another user, a clone of the instructor's folder fails with "dubious ownership"; the README's
    steps work: a clone over a URL (git daemon, as the instructor README serves it), and the folder
    once trusted; then its "Getting updates" steps (commit your work, pull) work in the clone."""
    if student() is None:
        pytest.skip("needs root: the instructor's folder and the student are two users")
    shared = scratch / "instructor" / built.name  # the instructor's (root's) folder, readable by all
    shutil.copytree(built, shared, symlinks=True)
    home = scratch / "git-home"
    home.mkdir()
    hand_over(home)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    refused = as_student(["git", "clone", "-q", "-b", "student", str(shared), "plain"], env, home, 60)
    if refused.returncode == 0:
        pytest.skip(f"this git ({subprocess.run(['git', '--version'], capture_output=True, text=True).stdout.strip()}) "
                    "clones another user's folder: nothing to work around")
    assert "dubious ownership" in refused.stdout, refused.stdout

    readme = (built / "README.md").read_text()
    blocks = [b for lang, b in re.findall(r"^```(\w*)\n(.*?)^```", readme, re.M | re.S)
              if lang == "bash" and re.search(r"^git ", b, re.M)]
    assert len(blocks) == 3, blocks  # clone over a URL, trust the folder, getting updates
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={shared.parent}",
                               "--listen=127.0.0.1", f"--port={port}", str(shared.parent)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        url = f"git://127.0.0.1:{port}/{built.name}"
        clones = []
        for i, block in enumerate(blocks[:2]):
            here = home / f"try{i}"
            here.mkdir()
            hand_over(here)
            done = as_student(["bash", "-ec", fill(block, url if "<url>" in block else str(shared))], env, here, 120)
            assert done.returncode == 0, f"{block}\n{done.stdout}"
            clones.append(here / built.name)
            assert (clones[-1] / "labs" / LAB).is_dir()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    work = clones[1]  # the folder's clone: `git pull` reads the instructor's folder again
    notebook = next((work / "labs" / LAB).glob("*.ipynb"))
    as_student(["bash", "-c", f"echo ' ' >> {shlex.quote(str(notebook))}"], env, work, 30)
    done = as_student(["bash", "-ec", blocks[2]], env, work, 120)
    assert done.returncode == 0, f"{blocks[2]}\n{done.stdout}"
    assert "my lab 1" in as_student(["git", "log", "-1", "--format=%s"], env, work, 30).stdout


def test_the_self_check_prints_a_failure_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`make check` prints every word of a long failure message (the hint is at its end), wrapped to
    the terminal's width, not cut."""
    head = "AssertionError: the weights differ from the single-device step by 0.0028."
    tail = "Weight each tower's gradient by its share of the batch."
    middle = [f"w{i:03d}" for i in range((400 - len(head) - len(tail) - 1) // 5)]
    middle[0] += "-" * (400 - len(" ".join([head, *middle, tail])))
    message = " ".join([head, *middle, tail])
    assert len(message) == 400, len(message)
    rows = [{"cell": "lab04-test-weights", "points": 3.0, "passed": False, "why": message},
            {"cell": "lab04-test-ok", "points": 1.0, "passed": True, "why": ""}]
    notebook = tmp_path / "lab.ipynb"
    notebook.write_text("{}")
    monkeypatch.setattr(check, "check", lambda nb, timeout: (rows, ""))
    monkeypatch.setenv("COLUMNS", "80")
    assert check.main([str(notebook)]) == 1
    out = capsys.readouterr().out
    printed = out.split()
    assert all(w in printed for w in message.split()), out
    assert "Weight each tower's gradient by its share of the batch." in " ".join(printed)
    table = out.split("test cell", 1)[1].split("lab.ipynb:", 1)[0]
    assert max(len(line) for line in table.splitlines()) <= 80, out
    assert re.search(r"^lab04-test-weights\s+0/3\s+FAILED$", out, re.M), out
    assert re.search(r"^lab04-test-ok\s+1/1\s+passed$", out, re.M), out
    # a word longer than the line stays whole; a message of several lines keeps them
    lines = check.table([{"cell": "c", "points": 1.0, "passed": False, "why": "x" * 120 + " end\nsecond"}], 60)
    assert lines[2:] == ["    " + "x" * 120, "    end", "    second"], lines


def test_the_class_environment_hides_the_instructors_panels_and_the_news(tmp_path: Path) -> None:
    """class_env.sh's student JupyterLab config, as JupyterLab itself reads it: nbgrader's Create
    Assignment and formgrader, and the news pop-up's plugin, disabled and locked for every user; news
    never fetched; the Assignments tab kept; a second run changes nothing. The ids are those of the
    installed nbgrader and JupyterLab. (What the hub's browser shows: `make classroom-test` only.)"""
    env = tmp_path / "env"
    script = ROOT / "src" / "dpc_setup" / "class_env.sh"
    done = subprocess.run(["bash", str(script), "--student-lab-config", str(env)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    labconfig = env / "etc" / "jupyter" / "labconfig"
    first = {p.name: p.read_text() for p in labconfig.iterdir()}
    subprocess.run(["bash", str(script), "--student-lab-config", str(env)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert {p.name: p.read_text() for p in labconfig.iterdir()} == first

    off = {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
           "@jupyterlab/apputils-extension:announcements"}
    share = Path(sys.prefix) / "share" / "jupyter"
    nbgrader_js = "".join(p.read_text(errors="replace")
                          for p in share.glob("labextensions/@jupyter/nbgrader/static/*.js"))
    lab_js = "".join(p.read_text(errors="replace") for p in share.glob("lab/static/*.js"))
    for plugin in off | {"@jupyter/nbgrader:assignment-list"}:
        assert f'"{plugin}"' in (nbgrader_js if plugin.startswith("@jupyter/") else lab_js), \
            f"{plugin}: no such plugin in the installed nbgrader / JupyterLab"

    jenv = {**os.environ, "JUPYTER_CONFIG_PATH": str(env / "etc" / "jupyter"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "user-config")}
    listed = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "labextension", "list"],
                            capture_output=True, text=True, env=jenv, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    disabled = set(re.findall(r"^\s+(\S+)$", text.split("Disabled extensions:")[-1], re.M))
    assert off <= disabled and "@jupyter/nbgrader:assignment-list" not in disabled, text
    read = subprocess.run([sys.executable, "-c", """if True:
        import json, os
        from jupyter_core.paths import jupyter_path
        from jupyterlab.commands import get_app_dir
        from jupyterlab_server.config import get_page_config
        from jupyterlab_server.settings_utils import _get_overrides
        settings = os.path.join(get_app_dir(), "settings")
        page = get_page_config(jupyter_path("labextensions"), settings)
        print(json.dumps({"disabled": sorted(page["disabledExtensions"]), "locked": sorted(page["lockedExtensions"]),
                          "overrides": _get_overrides(settings)[0]}))
        """], capture_output=True, text=True, env=jenv, timeout=120)
    assert read.returncode == 0, read.stderr
    seen = json.loads(read.stdout.splitlines()[-1])
    assert off <= set(seen["disabled"]) and off <= set(seen["locked"]), seen
    assert seen["overrides"]["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false",
                                                                               "checkForUpdates": False}
    assert "student_lab_config \"$PREFIX/env\"" in script.read_text()  # part of every `make class-env`
