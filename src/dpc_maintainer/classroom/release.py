"""The release and the exchange: the student release (`python -m dpc_instructor.release`) served by `git daemon`
on loopback, the nbgitpuller link that clones it into a home, nbgrader's exchange, and the assignment's way
through it: the instructor releases, the students hand in (`make submit`, students.py), the instructor collects.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from dpc_maintainer.classroom.accounts import as_user
from dpc_maintainer.classroom.common import COURSE_ID, FOLDER, ROOT, Account, StepFailed, port_open, run, wait_for

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def pull_link(hub: str, repo: str, path: str, branch: str = "student") -> str:
    """The nbgitpuller link that clones (or pulls) repo's branch into the user's home and opens path in JupyterLab.

    hub: the hub's address (without /hub); repo: the release's git URL; path: a file or folder of the release.
    nbgitpuller clones into a folder named like the URL's last part, so that is the folder JupyterLab opens.
    """
    folder = repo.rstrip("/").split("/")[-1]
    query = urllib.parse.urlencode({"repo": repo.rstrip("/"), "branch": branch, "urlpath": f"lab/tree/{folder}/{path}"},
                                   safe="/")
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"


def serve_release(room: Classroom) -> None:
    """The student release (`python -m dpc_instructor.release`) served by git daemon on loopback."""
    out = room.dir / "release" / FOLDER
    check = [] if room.labs_check else ["--no-labs-check"]
    run([sys.executable, "-m", "dpc_instructor.release", "--out", str(out), *check], "release", room.log, cwd=ROOT)
    port = room.ports["git"]
    with (room.dir / "git-daemon.log").open("wb") as log:
        room.procs["git daemon"] = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
             "--informative-errors", f"--base-path={out.parent}", str(out.parent)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"git://127.0.0.1:{port}/{FOLDER}"

    def listed() -> bool:
        """The daemon serves the release's student branch."""
        p = subprocess.run(["git", "ls-remote", url, "student"], capture_output=True, text=True, timeout=30)
        return p.returncode == 0 and "refs/heads/student" in p.stdout

    wait_for("git daemon", lambda: port_open(port) and listed(), 60,
             alive=lambda: room.procs["git daemon"].poll() is None)
    room.repo = url


def make_exchange(room: Classroom) -> None:
    """nbgrader's exchange (mode 1777) and the instructor's course folder."""
    room.exchange.chmod(0o1777)


def nbgrader(room: Classroom, a: Account, args: list[str], cwd: str) -> str:
    """`nbgrader ARGS --course dp-course` with this run's exchange, as user a."""
    return as_user(room, a, [str(room.class_env / "bin/nbgrader"), *args, f"--course={COURSE_ID}",
                             f"--Exchange.root={room.exchange}"], cwd, f"nbgrader {args[0]} as {a.name}")


def release_assignment(room: Classroom, lab: str) -> None:
    """The instructor puts the student lab in their course's release/ and releases it to the exchange."""
    course = Path(room.instructor.home) / "course"
    dest = course / "release" / lab
    dest.mkdir(parents=True, exist_ok=True)
    for nb in sorted((ROOT / "labs" / lab).glob("*.ipynb")):
        shutil.copyfile(nb, dest / nb.name)
    run(["chown", "-R", f"{room.instructor.uid}:{room.instructor.gid}", str(course)], "chown", room.log)
    nbgrader(room, room.instructor, ["release_assignment", lab, f"--CourseDirectory.root={course}"], str(course))


def submissions(exchange: Path, student: str, lab: str) -> list[Path]:
    """The hand-ins of a student's lab in nbgrader's exchange (inbound/<student>+<lab>+<time>...)."""
    return sorted((exchange / COURSE_ID / "inbound").glob(f"{student}+{lab}+*"))


def handed_in(room: Classroom, lab: str) -> None:
    """Every student's hand-in is in the exchange (each typed `make submit` in a JupyterLab terminal: students.py)."""
    missing = [s.name for s in room.students if not submissions(room.exchange, s.name, lab)]
    if missing:
        raise StepFailed(f"no hand-in of {lab} in the exchange from {', '.join(missing)}")


def collect(room: Classroom, lab: str) -> Path:
    """The instructor collects (nbgrader collect); returns their course's submitted/ folder."""
    course = Path(room.instructor.home) / "course"
    nbgrader(room, room.instructor, ["collect", lab, f"--CourseDirectory.root={course}"], str(course))
    submitted = course / "submitted"
    missing = [s.name for s in room.students if not list((submitted / s.name / lab).glob("*.ipynb"))]
    if missing:
        raise StepFailed(f"collect: nothing collected for {', '.join(missing)}")
    return submitted
