"""A real class on a real JupyterHub on this machine, used in a browser, graded, torn down (`make classroom-test`).

    python -m dpc_maintainer.classroom [--lab 05-ring-allreduce|all] [--students N] [--keep] [--parameters ci]
                                       [--no-labs-check]

As root, with apt (chromium) and npm: src/dpc_setup/hub.sh (chromium, the proxy, the hub's own
environment), the class environment (`make class-env`), N student accounts and an instructor with
random passwords, the student release served by `git daemon` on loopback, a JupyterHub with
PAM logins and per-user cgroups (src/dpc_instructor/hub/jupyterhub_config.py) on free loopback ports.
The course's website is built with this hub's link (dpc_maintainer.book). Then, per lab: the instructor
releases the assignment into an nbgrader exchange; every student logs in in Chromium (Playwright driving
/usr/bin/chromium), first follows chapter 5's "Open on your class hub" on the website (the first lab only:
nbgitpuller clones the release into their home, JupyterLab opens the chapter), clicks the lab's nbgitpuller link, gets the lab's
answer cells from the reference solution through their own Jupyter server (odd students; even ones
hand in the lab unfilled), all press Run All at the same time and save; they submit with nbgrader,
the instructor collects, the course's grader grades (sandboxed; with the notebooks' own parameters, or
course.yml's ci values with --parameters ci, as the suite's grading tests do, so that the session's
reference run of the lab is shared) and the CSV must give full marks to
the filled notebook and 0 to the unfilled one; feedback goes back through nbgrader
(release_feedback, fetch_feedback) and each student opens their own page in the browser (HTTP 200)
and is refused a classmate's. Tear-down (also on failure or Ctrl-C, unless --keep) stops the hub,
proxy, servers and git daemon, removes the users, homes, cgroups and exchange, and checks that no
process of those users is left and every port is closed. SIGTERM and Ctrl-C end the run through the
same tear-down; a run killed outright (SIGKILL, a hard timeout) is cleaned by its guardian
(dpc_runtime.reaper: everything the run starts carries DPC_CLASSROOM_RUN=<tag>), and every start (or
`--clean` alone) removes what an earlier run left if both were killed (accounts dpc-*-<tag>).

It prints a timeline (seconds per step) and exits 1 on the first failed step (2 when the machine
cannot run it: not root, no apt or npm). Logs and screenshots: build/classroom/<run>/.
The browser part runs in the hub's environment (Playwright is not in the course's): this module is
started there again as `... classroom --browser work|feedback --plan FILE`.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Only the standard library and the stdlib-only reaper at the top: the browser phase runs this module in the
# hub's environment (Playwright, no psutil or torch); the harness takes the launcher's names where it uses them.
from dpc_runtime.reaper import Guard, Plan, clean, marked, owned_by

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "classroom"
COURSE_ID = "dp-course"
FOLDER = "dp-course-student"  # the release's folder name: what nbgitpuller clones into each home
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DEFAULT_LAB = "05-ring-allreduce"
CHAPTER = "course/05-ring-allreduce.ipynb"  # the chapter students open from the course's website, by its hub link
FAIRNESS_LAB = "06-horovod"  # a heavy lab: Horovod ranks (horovodrun itself imports TensorFlow)
# Deadlines (seconds) of the waits: generous, for a loaded 2-core machine; every wait ends on an event.
SPAWN_S = 300
RUN_ALL_S = 900
COMMAND_S = 900
SAVE_S = 120  # File > Save Notebook until the saved notebook shows the run
PRESS_S = 15  # a menu press that starts no save within this is pressed again


class StepFailed(RuntimeError):
    """A step of the run failed; the message says which and why."""


RUN_MARKER = "DPC_CLASSROOM_RUN"  # in the environment of the harness and all it starts: <tag> of the run
ACCOUNT = re.compile(r"^dpc-(student\d+|instructor)-([0-9a-f]{4})$")  # the accounts a run makes


def unavailable() -> str:
    """Why a classroom cannot run on this machine ('' when it can): root, apt or chromium, npm, git."""
    if os.geteuid() != 0:
        return "not root (users, cgroups and PAM logins need root)"
    if not Path(CHROMIUM).exists() and not shutil.which("apt-get"):
        return "no chromium and no apt-get to install it"
    if not shutil.which("npm") and not (Path.home() / ".cache/dp-course/hub/npm/node_modules/.bin").is_dir():
        return "no npm (configurable-http-proxy is an npm package)"
    for tool in ("git", "useradd", "node"):
        if not shutil.which(tool):
            return f"no {tool}"
    return ""


def pull_link(hub: str, repo: str, path: str, branch: str = "student") -> str:
    """The nbgitpuller link that clones (or pulls) repo's branch into the user's home and opens path in JupyterLab.

    hub: the hub's address (without /hub); repo: the release's git URL; path: a file or folder of the release.
    nbgitpuller clones into a folder named like the URL's last part, so that is the folder JupyterLab opens.
    """
    folder = repo.rstrip("/").split("/")[-1]
    query = urllib.parse.urlencode({"repo": repo.rstrip("/"), "branch": branch, "urlpath": f"lab/tree/{folder}/{path}"},
                                   safe="/")
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"


# ---------------------------------------------------------------- the timeline


@dataclass
class Timeline:
    """Steps with their seconds, printed as they end."""

    steps: list[tuple[str, float, str]] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time one step; a failure is recorded, printed and raised as StepFailed."""
        t0 = time.monotonic()
        print(f"classroom: {name} ...", flush=True)
        try:
            yield
        except BaseException as e:
            dt = time.monotonic() - t0
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else f"FAILED: {e}"
            self.steps.append((name, dt, why))
            print(f"classroom: [{dt:7.1f} s] {name}: {why}", flush=True)
            if isinstance(e, (StepFailed, KeyboardInterrupt)):
                raise
            raise StepFailed(f"{name}: {e}") from e
        dt = time.monotonic() - t0
        self.steps.append((name, dt, "ok"))
        print(f"classroom: [{dt:7.1f} s] {name}: ok", flush=True)

    def report(self) -> str:
        """The timeline as a table with the total."""
        lines = ["", "classroom timeline:"]
        lines += [f"  {dt:7.1f} s  {name}{'' if how == 'ok' else '  (' + how + ')'}" for name, dt, how in self.steps]
        lines.append(f"  {time.monotonic() - self.start:7.1f} s  total")
        return "\n".join(lines)


# ---------------------------------------------------------------- small tools


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(what: str, ready: Any, timeout: float, alive: Any = None) -> None:
    """Poll ready() until it is true; StepFailed after timeout or when alive() says the server died."""
    deadline = time.monotonic() + timeout
    while not ready():
        if alive is not None and not alive():
            raise StepFailed(f"{what}: the process ended")
        if time.monotonic() > deadline:
            raise StepFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)  # polling an event (a port, a URL) with a deadline, not a fixed wait


def http_status(url: str) -> int:
    """The HTTP status of GET url (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def run(cmd: list[str], what: str, log: Path, timeout: float = COMMAND_S, **kw: Any) -> str:
    """Run a command, its output appended to log; StepFailed with the output's tail when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise StepFailed(f"{what}: no result within {timeout:.0f} s") from e
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise StepFailed(f"{what}: exit {p.returncode}\n{tail}")
    return p.stdout


@dataclass
class Account:
    """A Linux account of the class."""

    name: str
    password: str
    home: str
    uid: int = 0
    gid: int = 0
    filled: bool = True  # a student who fills the answers (the other hands in the lab unfilled)


# ---------------------------------------------------------------- the class


class Classroom:
    """One run: what it brought up (to tear down) and the steps."""

    def __init__(self, labs: list[str], students: int, keep: bool, cpu: str, mem: str,
                 fairness_only: bool = False, parameters: str = "defaults", labs_check: bool = True) -> None:
        """Names, ports and folders of this run (nothing is started yet)."""
        self.labs = labs
        self.parameters = parameters  # the grader's --parameters
        self.labs_check = labs_check  # the release checks that labs/ is generated from solutions/
        self.fairness_only = fairness_only
        self.tag = secrets.token_hex(2)
        self.keep = keep
        self.cpu, self.mem = cpu, mem
        self.dir = BUILD / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{self.tag}"
        self.dir.mkdir(parents=True)
        (self.dir / "screens").mkdir()
        self.log = self.dir / "commands.log"
        self.timeline = Timeline()
        self.students = [Account(f"dpc-student{i}-{self.tag}", secrets.token_urlsafe(12),
                                 f"/home/dpc-student{i}-{self.tag}", filled=i % 2 == 1)
                         for i in range(1, students + 1)]
        self.instructor = Account(f"dpc-instructor-{self.tag}", secrets.token_urlsafe(12),
                                  f"/home/dpc-instructor-{self.tag}")
        from dpc_runtime.launch import free_port  # the course's environment only (psutil): see the imports

        self.ports = {"hub": free_port(), "hub-api": free_port(), "proxy-api": free_port(), "git": free_port()}
        self.cgroup = f"dp-course-hub-{self.tag}"
        self.exchange = Path(tempfile.mkdtemp(prefix=f"dpc-exchange-{self.tag}-"))
        self.course = self.dir / "course"  # the grader's course folder (gradebook, feedback)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.made_users: list[Account] = []
        self.cache = Path()
        self.class_env = Path(os.environ.get("DPC_CLASS_PREFIX", "/opt/dp-course")) / "env"
        # Everything this run starts carries its tag (the hub passes it on to the proxy); a guardian
        # removes what the run made if the run dies before its tear-down (SIGKILL, a hard timeout).
        os.environ[RUN_MARKER] = self.tag
        self.guard = Guard(marker=(RUN_MARKER, self.tag), folders=[str(self.exchange)],
                           cgroups=[str(m / self.cgroup) for m in cgroup_roots()])

    # ---- set-up steps

    def install(self) -> None:
        """src/dpc_setup/hub.sh: chromium, the proxy, the hub's environment (only what is missing)."""
        out = run(["bash", str(ROOT / "src/dpc_setup/hub.sh")], "hub.sh", self.log)
        self.cache = Path(out.strip().splitlines()[-1].split(" in ", 1)[1])

    def ensure_class_env(self) -> None:
        """The class environment every user runs (`make class-env`; returns at once when built)."""
        prefix = self.class_env.parent
        run(["make", "-s", "class-env", f"PREFIX={prefix}"], "make class-env", self.log, cwd=ROOT, timeout=3600)
        if not (self.class_env / "bin" / "jupyterhub-singleuser").exists():
            raise StepFailed(f"{self.class_env} has no jupyterhub-singleuser (requirements-hub.txt)")

    def make_accounts(self) -> None:
        """The students and the instructor: Linux accounts with private homes and random passwords."""
        for a in [*self.students, self.instructor]:
            self.guard.add(users=[a.name])  # before it exists: a kill right after useradd is covered too
            run(["useradd", "--create-home", "--shell", "/bin/bash", "-K", "HOME_MODE=0700", a.name],
                f"useradd {a.name}", self.log)
            self.made_users.append(a)
            run(["chpasswd"], f"chpasswd {a.name}", self.log, input=f"{a.name}:{a.password}\n")
            pw = pwd.getpwnam(a.name)
            a.uid, a.gid, a.home = pw.pw_uid, pw.pw_gid, pw.pw_dir

    def serve_release(self) -> None:
        """The student release (`python -m dpc_instructor.release`) served by git daemon on loopback."""
        out = self.dir / "release" / FOLDER
        check = [] if self.labs_check else ["--no-labs-check"]
        run([sys.executable, "-m", "dpc_instructor.release", "--out", str(out), *check], "release", self.log, cwd=ROOT)
        port = self.ports["git"]
        with (self.dir / "git-daemon.log").open("wb") as log:
            self.procs["git daemon"] = subprocess.Popen(
                ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
                 "--informative-errors", f"--base-path={out.parent}", str(out.parent)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"git://127.0.0.1:{port}/{FOLDER}"

        def listed() -> bool:
            p = subprocess.run(["git", "ls-remote", url, "student"], capture_output=True, text=True, timeout=30)
            return p.returncode == 0 and "refs/heads/student" in p.stdout

        wait_for("git daemon", lambda: port_open(port) and listed(), 60,
                 alive=lambda: self.procs["git daemon"].poll() is None)
        self.repo = url

    def start_hub(self) -> None:
        """JupyterHub (PAM, per-user cgroups, the class environment) and its proxy on loopback ports."""
        state = self.dir / "hub"
        state.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
        env.update({
            "PATH": f"{self.cache / 'venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "DPC_CLASS_ENV": str(self.class_env), "DPC_COURSE_FOLDER": FOLDER, "DPC_HUB_STATE": str(state),
            "DPC_HUB_PORT": str(self.ports["hub"]), "DPC_HUB_API_PORT": str(self.ports["hub-api"]),
            "DPC_PROXY_API_PORT": str(self.ports["proxy-api"]),
            "DPC_CHP": str(self.cache / "npm/node_modules/.bin/configurable-http-proxy"),
            "DPC_HUB_USERS": ",".join(a.name for a in [*self.students, self.instructor]),
            "DPC_HUB_ADMINS": self.instructor.name, "DPC_HUB_CGROUP": self.cgroup,
            "DPC_HUB_CPU": self.cpu, "DPC_HUB_MEM": self.mem, "DPC_HUB_PIDS": "2048",
            "PYTHONPATH": str(ROOT / "src"),  # the config names its spawner, dpc_instructor.hub.spawner
        })
        with (self.dir / "hub.log").open("wb") as log:
            self.procs["hub"] = subprocess.Popen(
                [str(self.cache / "venv/bin/jupyterhub"), "-f", str(ROOT / "src/dpc_instructor/hub/jupyterhub_config.py")],
                cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{self.ports['hub']}"
        try:
            wait_for("the hub", lambda: http_status(f"{base}/hub/api/") == 200, 120,
                     alive=lambda: self.procs["hub"].poll() is None)
        except StepFailed as e:
            tail = "\n".join((self.dir / "hub.log").read_text(errors="replace").splitlines()[-15:])
            raise StepFailed(f"{e}\n{tail}") from None
        self.base = base

    def build_book(self) -> None:
        """The course's website (dpc_maintainer.book, its own environment) whose hub links lead to this hub."""
        run(["make", "-s", "book-env"], "make book-env", self.log, cwd=ROOT)
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env["PYTHONPATH"] = str(ROOT / "src")
        run([str(ROOT / "build/book-env/bin/python"), "-m", "dpc_maintainer.book", "--out", str(self.dir / "book"),
             "--src", str(self.dir / "book-src"), "--hub-url", self.base, "--repo", self.repo],
            "make book", self.log, cwd=ROOT, env=env)
        self.book = self.dir / "book"

    def make_exchange(self) -> None:
        """nbgrader's exchange (mode 1777) and the instructor's course folder."""
        self.exchange.chmod(0o1777)

    # ---- per lab

    def as_user(self, a: Account, cmd: list[str], cwd: str, what: str) -> str:
        """Run a command of the class environment as that user (their home, no root rights)."""
        env = {"HOME": a.home, "USER": a.name, "LOGNAME": a.name, "LANG": "C.UTF-8",
               "PATH": f"{self.class_env / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
        return run(cmd, what, self.log, cwd=cwd, user=a.uid, group=a.gid, extra_groups=[], env=env)

    def nbgrader(self, a: Account, args: list[str], cwd: str) -> str:
        """`nbgrader ARGS --course dp-course` with this run's exchange, as user a."""
        return self.as_user(a, [str(self.class_env / "bin/nbgrader"), *args, f"--course={COURSE_ID}",
                                f"--Exchange.root={self.exchange}"], cwd, f"nbgrader {args[0]} as {a.name}")

    def release_assignment(self, lab: str) -> None:
        """The instructor puts the student lab in their course's release/ and releases it to the exchange."""
        course = Path(self.instructor.home) / "course"
        dest = course / "release" / lab
        dest.mkdir(parents=True, exist_ok=True)
        for nb in sorted((ROOT / "labs" / lab).glob("*.ipynb")):
            shutil.copyfile(nb, dest / nb.name)
        run(["chown", "-R", f"{self.instructor.uid}:{self.instructor.gid}", str(course)], "chown", self.log)
        self.nbgrader(self.instructor, ["release_assignment", lab, f"--CourseDirectory.root={course}"], str(course))

    def browser(self, phase: str, lab: str) -> dict[str, Any]:
        """Run a browser phase (work or feedback) for every student at once in the hub's environment."""
        plan = {"base": self.base, "repo": self.repo, "lab": lab, "folder": FOLDER,
                "screens": str(self.dir / "screens"), "profiles": str(self.dir / "profiles"),
                "students": [asdict(s) for s in self.students],
                "answers": answers(lab) if phase in ("work", "fairness") else {},
                "mem": self.mem,
                "book": str(getattr(self, "book", "")), "chapter": CHAPTER if lab == self.labs[0] else "",
                "chapter_title": chapter_title(),
                "feedback": self.feedback_pages(lab) if phase == "feedback" else {}}
        plan_file = self.dir / f"plan-{phase}-{lab}.json"
        plan_file.write_text(json.dumps(plan))
        plan_file.chmod(0o600)
        result = self.dir / f"result-{phase}-{lab}.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("VIRTUAL_ENV", None)
        run([str(self.cache / "venv/bin/python"), "-m", "dpc_maintainer.classroom", "--browser", phase,
             "--plan", str(plan_file), "--result", str(result)], f"browser {phase}", self.log,
            timeout=SPAWN_S + RUN_ALL_S + 300, env=env, cwd=ROOT)
        out: dict[str, Any] = json.loads(result.read_text())
        return out

    def hand_in(self, lab: str) -> None:
        """Every student submits the notebook they worked on (nbgrader submit, as that student)."""
        for s in self.students:
            self.nbgrader(s, ["submit", lab], f"{s.home}/{FOLDER}/labs")

    def collect(self, lab: str) -> Path:
        """The instructor collects (nbgrader collect); returns their course's submitted/ folder."""
        course = Path(self.instructor.home) / "course"
        self.nbgrader(self.instructor, ["collect", lab, f"--CourseDirectory.root={course}"], str(course))
        submitted = course / "submitted"
        missing = [s.name for s in self.students if not list((submitted / s.name / lab).glob("*.ipynb"))]
        if missing:
            raise StepFailed(f"collect: nothing collected for {', '.join(missing)}")
        return submitted

    def grade(self, lab: str, submitted: Path) -> None:
        """The course's grader (sandboxed) on what was collected; filled: full marks, unfilled: 0."""
        out = self.dir / f"grades-{lab}.csv"
        run([sys.executable, "-m", "dpc_instructor.grade", str(submitted), "--lab", lab,
             "--course", str(self.course), "--out", str(out), "--parameters", self.parameters],
            f"grade {lab}", self.log, cwd=ROOT, timeout=3600)
        rows = {r["student"]: r for r in csv.DictReader(out.open())}
        wrong = []
        for s in self.students:
            r = rows.get(s.name)
            if r is None:
                wrong.append(f"{s.name}: no row")
                continue
            score, top = float(r["score"]), float(r["max_score"])
            print(f"classroom:   {s.name} ({'filled' if s.filled else 'unfilled'}): {score:g}/{top:g} {r['status']}")
            if top <= 0 or (score != top if s.filled else score != 0):
                wrong.append(f"{s.name} ({'filled' if s.filled else 'unfilled'}): {score:g}/{top:g} "
                             f"{r['status']} {r['notes']}")
        if wrong:
            raise StepFailed("grades: " + "; ".join(wrong))

    def give_feedback(self, lab: str) -> None:
        """`gradebook feedback` (nbgrader's layout), release_feedback, then each student's fetch_feedback."""
        run([sys.executable, "-m", "dpc_instructor.gradebook", "feedback", "--course", str(self.course)],
            "gradebook feedback", self.log, cwd=ROOT)
        for s in self.students:
            folder = self.course / "feedback" / s.name / lab
            have = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
            if not any(n.endswith(".html") for n in have) or "submission_secret.txt" not in have:
                raise StepFailed(f"feedback for {s.name}: {folder} holds {have or 'nothing'} "
                                 "(nbgrader's layout needs <notebook>.html, timestamp.txt, submission_secret.txt)")
        run([str(ROOT / ".venv/bin/nbgrader"), "release_feedback", lab, f"--course={COURSE_ID}",
             f"--Exchange.root={self.exchange}", f"--CourseDirectory.root={self.course}"],
            "nbgrader release_feedback", self.log, cwd=self.course)
        for s in self.students:
            self.nbgrader(s, ["fetch_feedback", lab], f"{s.home}/{FOLDER}/labs")

    def feedback_pages(self, lab: str) -> dict[str, list[str]]:
        """Per student, the paths (under their home) of the feedback pages fetch_feedback wrote."""
        pages = {}
        for s in self.students:
            found = sorted(Path(s.home, FOLDER, "labs", lab, "feedback").glob("*/*.html"))
            if not found:
                raise StepFailed(f"fetch_feedback wrote no page for {s.name}")
            pages[s.name] = [str(p.relative_to(s.home)) for p in found]
        return pages

    # ---- the run

    def run_lab(self, lab: str) -> None:
        """One lab, from the instructor's release to the feedback each student opens."""
        t = self.timeline
        with t.step(f"{lab}: instructor releases the assignment (nbgrader exchange)"):
            self.release_assignment(lab)
        with t.step(f"{lab}: students log in, click the nbgitpuller link, fill, Run All at once, save"):
            self.students_do("work", lab)
        with t.step(f"{lab}: students hand in (nbgrader submit)"):
            self.hand_in(lab)
        with t.step(f"{lab}: instructor collects (nbgrader collect)"):
            submitted = self.collect(lab)
        with t.step(f"{lab}: grade (dpc_instructor.grade, sandboxed)"):
            self.grade(lab, submitted)
        with t.step(f"{lab}: feedback (gradebook, release_feedback, fetch_feedback)"):
            self.give_feedback(lab)
        with t.step(f"{lab}: students open their feedback, are refused a classmate's"):
            self.students_do("feedback", lab)

    def students_do(self, phase: str, lab: str) -> None:
        """A browser phase for every student; print what each did, StepFailed naming those that failed."""
        res = self.browser(phase, lab)
        for name, r in sorted(res.items()):
            print(f"classroom:   {name}: {json.dumps(r, sort_keys=True)}")
        bad = [f"{n}: {r['error']}" for n, r in res.items() if r.get("error")]
        if bad:
            raise StepFailed("; ".join(bad))

    def fairness(self, lab: str) -> dict[str, Any]:
        """Student 1 runs a heavy lab while student 2's kernel is timed, then goes past its memory limit."""
        t = self.timeline
        with t.step(f"fairness: {self.students[0].name} runs {lab}, {self.students[1].name}'s kernel timed"):
            res = self.browser("fairness", lab)
            r = res.get("fairness", {})
            for line in fairness_lines(r, lab, self.mem):
                print(f"classroom: {line}", flush=True)
            bad = [f"{n}: {x['error']}" for n, x in res.items() if isinstance(x, dict) and x.get("error")]
            if bad:
                raise StepFailed("; ".join(bad))
            (self.dir / "fairness.json").write_text(json.dumps(r, indent=1))
        return r

    def up_and_run(self) -> None:
        """Every step in order."""
        t = self.timeline
        with t.step("hub.sh (chromium, configurable-http-proxy, the hub's environment)"):
            self.install()
        with t.step(f"class environment (make class-env PREFIX={self.class_env.parent})"):
            self.ensure_class_env()
        with t.step(f"accounts: {len(self.students)} students and an instructor"):
            self.make_accounts()
            self.make_exchange()
        with t.step("student release, served by git daemon on loopback"):
            self.serve_release()
        with t.step("JupyterHub and its proxy up"):
            self.start_hub()
        if not self.fairness_only:
            with t.step("the course's website with this hub's link (make book)"):
                self.build_book()
        for lab in self.labs:
            if os.environ.get("DPC_CLASSROOM_UP_ONLY"):  # debugging: the class up, nothing run
                return
            if self.fairness_only:
                self.fairness(lab)
            else:
                self.run_lab(lab)

    # ---- tear-down

    def tear_down(self) -> list[str]:
        """Stop and remove all this run made; what could not be cleaned (empty when clean)."""
        problems: list[str] = []
        hub = self.procs.get("hub")
        if hub is not None and hub.poll() is None:
            hub.send_signal(signal.SIGTERM)  # the hub stops the users' servers and the proxy
            try:
                hub.wait(timeout=90)
            except subprocess.TimeoutExpired:
                problems.append("the hub did not stop on SIGTERM: killed")
                os.killpg(hub.pid, signal.SIGKILL)
                hub.wait()
        pid_file = self.dir / "hub" / "jupyterhub-proxy.pid"
        if pid_file.exists():  # a proxy the hub did not stop
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        git = self.procs.get("git daemon")
        if git is not None and git.poll() is None:
            os.killpg(git.pid, signal.SIGTERM)
            try:
                git.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(git.pid, signal.SIGKILL)
                git.wait()
        uids = {a.uid for a in self.made_users if a.uid}
        left = owned_by(uids)
        if left:
            problems.append(f"processes of the class still running after the hub stopped: {left} (killed)")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while owned_by(uids) and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel reaping what was killed (a deadline)
        if owned_by(uids):
            problems.append(f"processes of the class survive SIGKILL: {owned_by(uids)}")
        for a in self.made_users:
            p = subprocess.run(["userdel", "--remove", a.name], capture_output=True, text=True)
            if p.returncode not in (0, 12):  # 12: mail spool missing, the rest is removed
                problems.append(f"userdel {a.name}: {p.stderr.strip()}")
            if Path(a.home).exists():
                shutil.rmtree(a.home, ignore_errors=True)
                problems.append(f"{a.home} was left by userdel (removed)")
        for mount in cgroup_roots():
            d = mount / self.cgroup
            if d.exists():
                for child in sorted(d.iterdir()):
                    if child.is_dir():
                        problems.append(f"cgroup {child} was left by the spawner")
                        with contextlib.suppress(OSError):
                            child.rmdir()
                with contextlib.suppress(OSError):
                    d.rmdir()
                if d.exists():
                    problems.append(f"cannot remove cgroup {d}")
        shutil.rmtree(self.exchange, ignore_errors=True)
        for name, port in self.ports.items():
            if port_open(port):
                problems.append(f"port {port} ({name}) still open")
        for a in self.made_users:
            with contextlib.suppress(KeyError):
                pwd.getpwnam(a.name)
                problems.append(f"user {a.name} still exists")
        if not problems:
            self.guard.dismiss()  # else the guardian tries again when this process ends
        return problems


EXCHANGE = re.compile(r"^dpc-exchange-([0-9a-f]{4})-")  # a run's nbgrader exchange, in the temporary folder


def leftovers() -> dict[str, list[str]]:
    """tag -> the accounts of an earlier run whose harness is gone (killed before its tear-down and its
    guardian's; a run whose accounts are gone but whose exchange folder is left has none): what
    `--clean`, and every start, removes."""
    runs: dict[str, list[str]] = {}
    for entry in pwd.getpwall():
        m = ACCOUNT.match(entry.pw_name)
        if m:
            runs.setdefault(m.group(2), []).append(entry.pw_name)
    for folder in Path(tempfile.gettempdir()).iterdir():
        m = EXCHANGE.match(folder.name)
        if m:
            runs.setdefault(m.group(1), [])
    return {tag: sorted(users) for tag, users in runs.items() if not _harness_alive(tag)}


def _harness_alive(tag: str) -> bool:
    """True while the harness of run <tag> runs (its hub and servers may outlive a killed harness)."""
    for pid in marked(RUN_MARKER, tag):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dpc_maintainer.classroom" in argv and b"--browser" not in argv:
            return True
    return False


def clean_leftovers() -> list[str]:
    """Remove what earlier, killed runs left (processes, accounts, cgroups); the lines say what."""
    said = []
    for tag, users in sorted(leftovers().items()):
        plan = Plan(marker=(RUN_MARKER, tag), users=users,
                    cgroups=[str(m / f"dp-course-hub-{tag}") for m in cgroup_roots()],
                    folders=[str(f) for f in Path(tempfile.gettempdir()).glob(f"dpc-exchange-{tag}-*")])
        said += [f"run {tag}: {line}" for line in clean(plan)]
    return said


def cgroup_roots() -> list[Path]:
    """The mount points of the cgroup hierarchies (v2 and v1) this machine has."""
    roots = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        f = line.split()
        if len(f) > 2 and f[2] in ("cgroup", "cgroup2"):
            roots.append(Path(f[1]))
    return roots


def answers(lab: str) -> dict[str, dict[str, str]]:
    """Per notebook of the lab, the reference's answer cells (grade id -> the cell's whole source)."""
    out = {}
    for nb_path in sorted((ROOT / "solutions" / lab).glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        cells = {}
        for c in nb["cells"]:
            meta = c.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and not meta.get("grade"):
                src = c["source"]
                cells[meta["grade_id"]] = src if isinstance(src, str) else "".join(src)
        out[nb_path.name] = cells
    return out


# ---------------------------------------------------------------- the browser (hub's environment)


JS_API = """async ([method, url, body]) => {
  const m = document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);
  const headers = {'Content-Type': 'application/json'};
  if (m) headers['X-XSRFToken'] = decodeURIComponent(m[1]);
  const r = await fetch(url, {method, headers, credentials: 'same-origin',
                              body: body === null ? undefined : JSON.stringify(body)});
  return {status: r.status, text: await r.text()};
}"""
JS_PROMPTS = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
  .map(e => e.textContent.trim())"""


async def _api(page: Any, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """A REST call of the user's Jupyter server from their page (their cookies, their XSRF token)."""
    r = await page.evaluate(JS_API, [method, url, body])
    try:
        return int(r["status"]), json.loads(r["text"]) if r["text"] else None
    except json.JSONDecodeError:
        return int(r["status"]), r["text"]


async def _login(ctx: Any, plan: dict, s: dict) -> Any:
    """Log in on the hub's page; returns the page once the user's JupyterLab is up."""
    page = ctx.pages[0] if ctx.pages else await ctx.new_page()
    await page.goto(f"{plan['base']}/hub/login")
    if await page.locator("#username_input").count():
        await page.fill("#username_input", s["name"])
        await page.fill("#password_input", s["password"])
        await page.click("#login_submit")
    else:  # logged in already (this browser's profile has the hub's cookie)
        await page.goto(f"{plan['base']}/hub/user-redirect/lab")
    # The user's JupyterLab, or the hub's error (a refused login, a failed spawn): whichever comes first.
    await page.wait_for_function(
        "() => location.pathname.includes('/lab') || document.querySelector('div.error, .progress-bar.bg-danger') !== null",
        timeout=SPAWN_S * 1000, polling=500)
    if "/lab" not in page.url:
        text = " ".join((await page.inner_text("body")).split())[:300]
        raise RuntimeError(f"login/spawn failed at {page.url}: {text}")
    await page.wait_for_selector("#jp-main-dock-panel", timeout=SPAWN_S * 1000)
    return page


def chapter_title() -> str:
    """CHAPTER's title (its first heading), as JupyterLab shows it at the top of the notebook."""
    from dpc_instructor.release import first_heading  # the harness's side (the course's environment)

    return first_heading(ROOT / CHAPTER)


async def _open_chapter(page: Any, plan: dict, name: str) -> float:
    """From the course's website (file://), follow a chapter's "Open on your class hub": nbgitpuller pulls the
    release into the student's home and JupyterLab opens the chapter there. Seconds it took."""
    t0 = time.monotonic()
    chapter, folder = plan["chapter"], plan["folder"]
    await page.goto((Path(plan["book"]) / chapter).with_suffix(".html").as_uri())
    await page.click("a.dpc-hub")
    await page.wait_for_url(f"**/user/{name}/lab/tree/{folder}/{chapter}**", timeout=SPAWN_S * 1000)
    await page.wait_for_function(
        "t => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) h1')].some(h => h.textContent.includes(t))",
        arg=plan["chapter_title"], timeout=SPAWN_S * 1000, polling=200)
    await _kernel_idle(page, f"/user/{name}", f"{folder}/{chapter}", SPAWN_S)  # the chapter, ready to run
    st, model = await _api(page, "GET", f"/user/{name}/api/contents/{folder}/{chapter}?content=0")
    if st != 200 or not isinstance(model, dict) or model.get("type") != "notebook":
        raise RuntimeError(f"{chapter} is open but not in the home's {folder}/ (HTTP {st})")
    await page.screenshot(path=str(Path(plan["screens"]) / f"chapter-{name}.png"))
    return round(time.monotonic() - t0, 1)


async def _work(ctx: Any, plan: dict, s: dict, start_together: asyncio.Barrier) -> dict[str, Any]:
    """One student: log in, pull the lab by the link, fill it (or not), Run All, save, check the result."""
    shots = Path(plan["screens"])
    lab, folder, name = plan["lab"], plan["folder"], s["name"]
    res: dict[str, Any] = {"filled": s["filled"]}
    t0 = time.monotonic()
    page = await _login(ctx, plan, s)
    res["login_s"] = round(time.monotonic() - t0, 1)
    if plan["chapter"] and plan["book"]:
        res["chapter_s"] = await _open_chapter(page, plan, name)
    t0 = time.monotonic()
    link = pull_link(plan["base"], plan["repo"], f"labs/{lab}")
    # The link as students get it: on a page, clicked.
    await page.set_content(f'<a id="lab-link" href="{link}">Lab {lab}</a>')
    await page.click("#lab-link")
    await page.wait_for_url(f"**/user/{name}/lab/tree/{folder}/labs/{lab}**", timeout=SPAWN_S * 1000)
    await page.wait_for_selector(".jp-DirListing-item", timeout=SPAWN_S * 1000)
    await page.screenshot(path=str(shots / f"{lab}-{name}-1-pulled.png"))
    res["pull_s"] = round(time.monotonic() - t0, 1)
    user = f"/user/{name}"
    await _harness_settings(page, user)
    res["notebooks"] = {}
    for nb_name, cells in plan["answers"].items():
        path = f"{folder}/labs/{lab}/{nb_name}"
        if s["filled"]:
            await _fill(page, user, path, cells)
        # A student moving on from an earlier lab (CLASSROOM_LAB=all): its kernels end (they would hold
        # memory under the user's limit) and the workspace is reset, so only this lab's notebook is open.
        st, sessions = await _api(page, "GET", f"{user}/api/sessions")
        for x in sessions if st == 200 else []:
            if x.get("path") != path:
                await _api(page, "DELETE", f"{user}/api/sessions/{x['id']}")
        await page.goto(f"{plan['base']}{user}/lab/tree/{path}?reset")
        await page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", timeout=SPAWN_S * 1000)
        await _kernel_idle(page, user, path, SPAWN_S)
        await start_together.wait()  # every student presses Run All at the same moment
        t0 = time.monotonic()
        await _menu(page, "Run", "Run All Cells")
        await page.wait_for_function(
            f"() => ({JS_PROMPTS})().some(p => /[0-9*]/.test(p))", timeout=60_000, polling=200)
        await page.wait_for_function(
            f"() => !({JS_PROMPTS})().some(p => p.includes('*'))", timeout=RUN_ALL_S * 1000, polling=500)
        run_s = round(time.monotonic() - t0, 1)
        await _kernel_idle(page, user, path, 60)
        await page.screenshot(path=str(shots / f"{lab}-{name}-2-ran-{Path(nb_name).stem}.png"), full_page=False)
        code, errors, ran = await _save_run(page, user, path, s["filled"])
        res["notebooks"][nb_name] = {"run_all_s": run_s, "cells": len(code), "ran": ran, "errors": errors}
        if s["filled"] and (errors or ran != len(code)):
            raise RuntimeError(f"{nb_name}: {ran}/{len(code)} cells ran, errors {errors}")
        if not s["filled"] and not errors:
            raise RuntimeError(f"{nb_name}: the unfilled lab's saved run shows no error ({ran}/{len(code)} cells ran)")
    return res


async def _fill(page: Any, user: str, path: str, cells: dict[str, str]) -> None:
    """Write the answer cells (by their nbgrader grade_id) into the student's copy, through their server, before
    JupyterLab opens it."""
    st, model = await _api(page, "GET", f"{user}/api/contents/{path}?content=1&type=notebook")
    if st != 200:
        raise RuntimeError(f"GET {path}: HTTP {st}")
    nb = model["content"]
    n = 0
    for c in nb["cells"]:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in cells:
            c["source"] = cells[gid]
            n += 1
    if n != len(cells):
        raise RuntimeError(f"{Path(path).name}: {n} of {len(cells)} answer cells found in the student's copy")
    st, _ = await _api(page, "PUT", f"{user}/api/contents/{path}", {"type": "notebook", "format": "json", "content": nb})
    if st not in (200, 201):
        raise RuntimeError(f"PUT {path}: HTTP {st}")


async def _harness_settings(page: Any, user: str) -> None:
    """The student's JupyterLab settings the harness needs (read as JupyterLab next loads): every cell in the page
    (no windowing), so that the prompts of all cells can be read; no autosave, so that every save of a notebook
    is one the harness pressed and waits for (_save) before it reads the notebook back."""
    for plugin, raw in (("notebook-extension:tracker", {"windowingMode": "none"}),
                        ("docmanager-extension:plugin", {"autosave": False})):
        st, _ = await _api(page, "PUT", f"{user}/lab/api/settings/@jupyterlab/{plugin}", {"raw": json.dumps(raw)})
        if st not in (200, 204):
            raise RuntimeError(f"settings PUT {plugin}: HTTP {st}")


async def _save(page: Any, user: str, path: str, deadline: float) -> None:
    """File > Save Notebook, then wait for the save itself: JupyterLab's PUT of the notebook, answered (2xx).

    Only then may the harness read the notebook back through the contents API. A GET while the PUT still writes
    reads a half-written file, which jupyter_server takes for a corrupt one and repairs: it moves the file aside
    (.invalid) and restores the save's .~ backup, which the save removes as it ends: the notebook is gone and the
    save ends in 'File Save Error ... No such file or directory' (classroom run 20261128-060211, student 2).
    A press that starts no save within PRESS_S (the menu did not take the click; seen once: lab 9's unfilled
    notebook reached the disk only by autosave, which the harness turns off) is pressed again, to the deadline.
    """
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    target = f"{user}/api/contents/{path}"

    def is_save(r: Any) -> bool:
        return r.request.method == "PUT" and urllib.parse.unquote(urllib.parse.urlsplit(r.url).path) == target

    while True:
        try:
            async with page.expect_response(is_save, timeout=PRESS_S * 1000) as saved:
                await _menu(page, "File", "Save Notebook")
            r = await saved.value
            break
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"File > Save Notebook: no save of {path} began (no PUT)") from None
    if not r.ok:
        raise RuntimeError(f"saving {path}: HTTP {r.status} {(await r.text())[:200]}")


async def _save_run(page: Any, user: str, path: str, filled: bool) -> tuple[list[dict], list[str], int]:
    """Save the notebook until its copy on disk shows the run (every cell ran; the unfilled lab: its error), or
    SAVE_S passes; returns that copy's code cells, error names and cells that ran. Each read follows a finished
    save (_save); a saved copy that lacks the run (outputs that reached the page after the save) is saved again."""
    deadline = time.monotonic() + SAVE_S
    while True:
        await _save(page, user, path, deadline)
        st, after = await _api(page, "GET", f"{user}/api/contents/{path}?content=1&type=notebook")
        if st != 200 or not isinstance(after, dict) or not isinstance(after.get("content"), dict):
            raise RuntimeError(f"{Path(path).name}: GET after saving: HTTP {st}")
        code = [c for c in after["content"]["cells"] if c["cell_type"] == "code"]
        errors = [o.get("ename", "") for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        ran = sum(c.get("execution_count") is not None for c in code)
        if (ran == len(code) if filled else bool(errors)) or time.monotonic() > deadline:
            return code, errors, ran
        await asyncio.sleep(0.5)  # polling the saved file, with a deadline


async def _menu(page: Any, menu: str, item: str) -> None:
    """Click a JupyterLab menu, then one of its items (by their labels)."""
    await page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    await page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).click()


async def _kernel_idle(page: Any, user: str, path: str, timeout: float) -> None:
    """Wait until the notebook's kernel exists and is idle (the server's sessions API)."""
    deadline = time.monotonic() + timeout
    while True:
        st, sessions = await _api(page, "GET", f"{user}/api/sessions")
        states = [x["kernel"]["execution_state"] for x in (sessions if st == 200 else [])
                  if x.get("path") == path and x.get("kernel")]
        if states and all(s == "idle" for s in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kernel of {path} is not idle within {timeout:.0f} s (states {states})")
        await asyncio.sleep(0.25)  # polling the kernel's state, with a deadline


async def _feedback(ctx: Any, plan: dict, s: dict, others: dict[str, list[str]]) -> dict[str, Any]:
    """One student opens their feedback pages (200) and a classmate's (must be refused)."""
    shots = Path(plan["screens"])
    res: dict[str, Any] = {"own": {}, "classmate": {}}
    page = await _login(ctx, plan, s)
    for rel in plan["feedback"][s["name"]]:
        r = await page.goto(f"{plan['base']}/user/{s['name']}/files/{rel}")
        status = r.status if r is not None else 0
        res["own"][rel] = status
        await page.screenshot(path=str(shots / f"{plan['lab']}-{s['name']}-3-feedback.png"), full_page=True)
        text = await page.inner_text("body")
        if status != 200 or plan["lab"] not in text and "score" not in text.lower():
            raise RuntimeError(f"own feedback {rel}: HTTP {status}, page {text[:200]!r}")
    for other, rels in others.items():
        r = await page.goto(f"{plan['base']}/user/{other}/files/{rels[0]}")
        status = r.status if r is not None else 0
        res["classmate"][other] = status
        await page.screenshot(path=str(shots / f"{plan['lab']}-{s['name']}-4-refused.png"))
        if status not in (403, 404):
            raise RuntimeError(f"{other}'s feedback: HTTP {status}, not refused")
    return res


def _stats(ms: list[float]) -> str:
    """'median M ms, max X ms (n N)' of round-trip times."""
    if not ms:
        return "no sample"
    s = sorted(ms)
    return f"median {s[len(s) // 2]:.0f} ms, max {s[-1]:.0f} ms (n {len(s)})"


def fairness_lines(r: dict[str, Any], lab: str, mem: str) -> list[str]:
    """The benchmark's lines: the classmate's round trips idle and busy, their ratio, the memory kill."""
    if not r.get("idle_ms"):
        return ["fairness: no measurement"]
    idle, busy = sorted(r["idle_ms"]), sorted(r.get("busy_ms", []))
    lines = [f"fairness: classmate's kernel round trip, class idle: {_stats(idle)}",
             f"fairness: classmate's kernel round trip while a student runs {lab} (Run All "
             f"{r.get('heavy_run_all_s', '?')} s): {_stats(busy)}"]
    if busy:
        med = busy[len(busy) // 2]
        lines.append(f"fairness: busy/idle median ratio {med / max(idle[len(idle) // 2], 1e-3):.1f}; "
                     f"goal median <= 1000 ms: {'met' if med <= 1000 else 'MISSED'}")
    if "oom" in r:
        o = r["oom"]
        lines.append(f"fairness: a kernel that allocates past the {mem} limit: {o.get('state', '?')} after "
                     f"{o.get('after_s', '?')} s; the other student's kernel: {o.get('other', '?')}")
    return lines


JS_ROUND_TRIPS = """async ([url, n, gapMs, code, untilFlag]) => {
  // Kernel round trips over the kernel's websocket (the way JupyterLab talks to it): send an
  // execute_request, wait for its execute_reply. Returns milliseconds per request.
  const ws = new WebSocket(url);
  await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = () => bad(new Error('websocket failed')); });
  const session = crypto.randomUUID(), times = [];
  const one = (src) => new Promise((ok) => {
    const id = crypto.randomUUID();
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.parent_header && m.parent_header.msg_id === id && m.msg_type === 'execute_reply') ok(m.content.status);
    };
    ws.send(JSON.stringify({channel: 'shell', buffers: [], metadata: {}, parent_header: {},
      header: {msg_id: id, session, username: '', msg_type: 'execute_request', version: '5.3',
               date: new Date().toISOString()},
      content: {code: src, silent: false, store_history: false, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
  });
  for (let i = 0; untilFlag ? !window[untilFlag] : i < n; i++) {
    const t0 = performance.now();
    await one(code);
    times.push(performance.now() - t0);
    await new Promise((ok) => setTimeout(ok, gapMs));  // the sampling interval, not a wait for an event
  }
  ws.close();
  return times;
}"""
JS_PAST_LIMIT = """async ([url, code, timeoutMs]) => {
  // Run code that allocates past the memory limit; resolve with the first kernel status that says it
  // died ('restarting', 'dead'), or 'finished' when it ran to its reply, or 'no answer' at the deadline.
  const ws = new WebSocket(url);
  await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = () => bad(new Error('websocket failed')); });
  const id = crypto.randomUUID(), t0 = performance.now();
  const state = await new Promise((ok) => {
    setTimeout(() => ok('no answer'), timeoutMs);
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.msg_type === 'status' && ['restarting', 'dead'].includes(m.content.execution_state)) ok(m.content.execution_state);
      if (m.parent_header && m.parent_header.msg_id === id && m.msg_type === 'execute_reply') ok('finished');
    };
    ws.send(JSON.stringify({channel: 'shell', buffers: [], metadata: {}, parent_header: {},
      header: {msg_id: id, session: crypto.randomUUID(), username: '', msg_type: 'execute_request',
               version: '5.3', date: new Date().toISOString()},
      content: {code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
  });
  ws.close();
  return {state, after_s: Math.round((performance.now() - t0) / 100) / 10};
}"""
IDLE_SAMPLES = 20
GAP_MS = 250


def past_limit_code(mem: str) -> str:
    """Python that touches 1.5 times the memory limit (numpy ones, page by page), then prints."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    n = int(float(mem[:-1]) * units[mem[-1].upper()]) if mem[-1:].upper() in units else int(mem)
    return f"import numpy as np\nx = np.ones({int(n * 1.5) // 8}, dtype=np.float64)\nprint(x.sum())"


async def _probe_kernel(page: Any, plan: dict, user: str) -> tuple[str, str]:
    """A fresh kernel in the user's server (the kernels API), answering; returns its id and websocket URL."""
    st, k = await _api(page, "POST", f"{user}/api/kernels", {"name": "python3"})
    if st not in (200, 201):
        raise RuntimeError(f"starting a kernel: HTTP {st} {k}")
    ws = plan["base"].replace("http://", "ws://") + f"{user}/api/kernels/{k['id']}/channels"
    # The server calls a kernel 'starting' until a client talks to it: the first request is the wait.
    try:
        await asyncio.wait_for(page.evaluate(JS_ROUND_TRIPS, [ws, 1, 0, "1 + 1", None]), SPAWN_S)
    except asyncio.TimeoutError:
        raise RuntimeError(f"the probe kernel did not answer within {SPAWN_S} s") from None
    return k["id"], ws


async def _student_browser(p: Any, plan: dict, s: dict) -> Any:
    """A student's own Chromium: a persistent context with a profile folder of its own (their cookies)."""
    profile = Path(plan["profiles"]) / s["name"]
    profile.mkdir(parents=True, exist_ok=True)
    ctx = await p.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
        viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(120_000)
    return ctx


def _first_line(e: BaseException) -> str:
    """A student's failure as one line: the exception's type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


async def _fairness(p: Any, plan: dict) -> dict[str, Any]:
    """Student 1 runs the lab (filled, Run All); student 2's kernel is timed idle, then during that run;
    then student 2's kernel allocates past the memory limit and must die alone."""
    heavy, probe = plan["students"][0], plan["students"][1]
    heavy = {**heavy, "filled": True}
    together = asyncio.Barrier(2)
    out: dict[str, Any] = {}
    ctxs = []
    for s in (heavy, probe):
        ctxs.append(await _student_browser(p, plan, s))
    done = asyncio.Event()

    async def run_heavy() -> None:
        try:
            out[heavy["name"]] = await _work(ctxs[0], plan, heavy, together)
            nb = next(iter(out[heavy["name"]]["notebooks"].values()))
            out["fairness"]["heavy_run_all_s"] = nb["run_all_s"]
        except BaseException:
            await together.abort()  # the classmate waiting for Run All stops too
            raise
        finally:
            done.set()

    async def run_probe() -> None:
        try:
            await probe_steps()
        except BaseException:
            await together.abort()  # the classmate waiting to press Run All stops too
            raise

    async def probe_steps() -> None:
        page = await _login(ctxs[1], plan, probe)
        user = f"/user/{probe['name']}"
        kid, ws = await _probe_kernel(page, plan, user)
        r = out["fairness"]
        r["idle_ms"] = await page.evaluate(JS_ROUND_TRIPS, [ws, IDLE_SAMPLES, GAP_MS, "1 + 1", None])
        await together.wait()  # the classmate presses Run All now
        await page.evaluate("() => { window.dpcHeavyDone = false; }")
        busy = asyncio.ensure_future(page.evaluate(JS_ROUND_TRIPS, [ws, 0, GAP_MS, "1 + 1", "dpcHeavyDone"]))
        await done.wait()
        await page.evaluate("() => { window.dpcHeavyDone = true; }")
        r["busy_ms"] = await busy
        if out.get(heavy["name"], {}).get("error"):
            return
        # Past the memory limit: this kernel is killed (and restarted by its server), the classmate's lives.
        hpage = ctxs[0].pages[0]
        huser = f"/user/{heavy['name']}"
        st, before = await _api(hpage, "GET", f"{huser}/api/kernels")
        r["oom"] = await page.evaluate(JS_PAST_LIMIT, [ws, past_limit_code(plan["mem"]), 300_000])
        st2, after = await _api(hpage, "GET", f"{huser}/api/kernels")
        ids = {k["id"] for k in before or []} if st == 200 else set()
        alive = st2 == 200 and ids and ids <= {k["id"] for k in after or []}
        _, mine = await _api(page, "GET", f"{user}/api/kernels/{kid}")
        r["oom"]["other"] = "alive, same kernel" if alive else f"LOST (before {before}, after {after})"
        r["oom"]["own_kernel_after"] = mine.get("execution_state") if isinstance(mine, dict) else mine
        if r["oom"]["state"] not in ("restarting", "dead") or not alive:
            raise RuntimeError(f"past the memory limit: {r['oom']}")

    out["fairness"] = {}
    try:
        results = await asyncio.gather(run_heavy(), run_probe(), return_exceptions=True)
        for name, res in zip((heavy["name"], probe["name"]), results):
            if isinstance(res, BaseException):
                out[name] = {"error": _first_line(res)}
    finally:
        for ctx in ctxs:
            await ctx.close()
    return out


async def _browser(phase: str, plan: dict) -> dict[str, Any]:
    """Every student in their own Chromium (a profile folder each), all at once."""
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {}
    together = asyncio.Barrier(len(plan["students"]))
    async with async_playwright() as p:
        if phase == "fairness":
            return await _fairness(p, plan)

        async def one(s: dict) -> None:
            ctx = await _student_browser(p, plan, s)
            try:
                if phase == "work":
                    out[s["name"]] = await _work(ctx, plan, s, together)
                else:
                    others = {k: v for k, v in plan["feedback"].items() if k != s["name"]}
                    out[s["name"]] = await _feedback(ctx, plan, s, others)
            except Exception as e:  # noqa: BLE001 (reported per student, with a screenshot)
                out[s["name"]] = {"error": _first_line(e)}
                if phase == "work":
                    await together.abort()  # the classmates waiting to press Run All stop too
                for i, pg in enumerate(ctx.pages):
                    with contextlib.suppress(Exception):
                        await pg.screenshot(path=str(Path(plan["screens"]) / f"{plan['lab']}-{s['name']}-failed-{i}.png"))
            finally:
                await ctx.close()

        await asyncio.gather(*(one(s) for s in plan["students"]))
    return out


# ---------------------------------------------------------------- main


def _end_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent (make, a test) dies (Linux's prctl)."""
    import ctypes

    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """Bring up the class, run it, tear it down; print the timeline; 0 when every step passed."""
    ap = argparse.ArgumentParser(prog="python -m dpc_maintainer.classroom", description=__doc__.splitlines()[0])
    ap.add_argument("--lab", default=os.environ.get("CLASSROOM_LAB") or DEFAULT_LAB,
                    help="a lab of labs/, or 'all' (default: $CLASSROOM_LAB or 05-ring-allreduce)")
    ap.add_argument("--students", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave it all running, even after a failure (no tear-down: for a look)")
    ap.add_argument("--cpu", default="1.5", help="cores per user (cgroup CPU quota)")
    ap.add_argument("--mem", default="4G", help="memory per user")
    ap.add_argument("--parameters", choices=["defaults", "ci"], default="defaults",
                    help="the grader's --parameters: the notebooks' own (default) or course.yml's ci values")
    ap.add_argument("--no-labs-check", action="store_true",
                    help="the release skips its check that labs/ is generated from solutions/ (nbgrader on "
                         "every lab, about 2 minutes; the suite has a test of its own for it)")
    ap.add_argument("--fairness", action="store_true",
                    help="instead of the class: one student runs the lab (default 06-horovod) while a classmate's "
                         "kernel round trip is timed, then that kernel goes past the memory limit")
    ap.add_argument("--clean", action="store_true",
                    help="only remove what earlier runs that were killed left behind (accounts, hubs, cgroups), and exit")
    ap.add_argument("--browser", choices=["work", "feedback", "fairness"], help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.browser:  # the browser part, in the hub's environment
        try:
            res = asyncio.run(_browser(a.browser, json.loads(a.plan.read_text())))
        except KeyboardInterrupt:  # a Ctrl-C reaches the whole group: the run says it once, with its tear-down
            return 130
        a.result.write_text(json.dumps(res, indent=1))
        return 0
    why = unavailable()
    if why:
        print(f"classroom: cannot run here: {why}", file=sys.stderr)
        return 2
    for line in clean_leftovers():  # an earlier run killed with its guardian (a reboot, kill -9 of both)
        print(f"classroom: left by an earlier run, removed: {line}", flush=True)
    if a.clean:
        left = leftovers()
        print(f"classroom: clean: {len(left)} run(s) left")
        return 0 if not left else 1
    if a.fairness and a.lab == DEFAULT_LAB and not os.environ.get("CLASSROOM_LAB"):
        a.lab = FAIRNESS_LAB
    labs = sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir()) if a.lab == "all" else [a.lab]
    for lab in labs:
        if not (ROOT / "labs" / lab).is_dir():
            print(f"classroom: no lab labs/{lab}", file=sys.stderr)
            return 2
    if a.students < 2:
        print("classroom: --students must be at least 2 (one hands in the lab unfilled)", file=sys.stderr)
        return 2
    room = Classroom(labs, a.students, a.keep, a.cpu, a.mem, fairness_only=a.fairness, parameters=a.parameters,
                     labs_check=not a.no_labs_check)
    print(f"classroom: run {room.dir.name}: labs {', '.join(labs)}, {a.students} students, "
          f"ports {room.ports}; logs and screenshots in {room.dir}", flush=True)
    failed = ""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    _end_with_parent()  # `kill -TERM` of `make classroom-test` reaches this run as a SIGTERM
    try:
        room.up_and_run()
    except StepFailed as e:
        failed = str(e)
    except KeyboardInterrupt:
        failed = "interrupted"
    if a.keep:
        (room.dir / "accounts.json").write_text(json.dumps([asdict(x) for x in room.made_users], indent=1))
        room.guard.dismiss()
        print(f"classroom: kept (--keep): hub {getattr(room, 'base', '?')}, accounts in {room.dir}/accounts.json; "
              "remove it all with `make classroom-test CLASSROOM_ARGS=--clean` once its process has ended")
    else:
        try:
            with room.timeline.step("tear-down (hub, proxy, servers, git daemon, users, cgroups, exchange)"):
                problems = room.tear_down()
                if problems:
                    raise StepFailed("not clean: " + "; ".join(problems))
        except StepFailed as e:
            failed = f"{failed}; {e}" if failed else str(e)
    print(room.timeline.report())
    if failed:
        print(f"classroom: FAILED: {failed}", file=sys.stderr)
        return 1
    print("classroom: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
