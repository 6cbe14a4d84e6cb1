"""The class's people: N student accounts and an instructor, Linux accounts with private homes and random
passwords (each named to the guardian before it exists), and running a command as one of them.
"""
from __future__ import annotations

import pwd
from typing import TYPE_CHECKING

from dpc_maintainer.classroom.common import COURSE_ID, Account, run

if TYPE_CHECKING:
    from dpc_maintainer.classroom.room import Classroom


def make_accounts(room: Classroom) -> None:
    """The students and the instructor: Linux accounts with private homes and random passwords."""
    for a in [*room.students, room.instructor]:
        room.guard.add(users=[a.name])  # before it exists: a kill right after useradd is covered too
        run(["useradd", "--create-home", "--shell", "/bin/bash", "-K", "HOME_MODE=0700", a.name],
            f"useradd {a.name}", room.log)
        room.made_users.append(a)
        run(["chpasswd"], f"chpasswd {a.name}", room.log, input=f"{a.name}:{a.password}\n")
        pw = pwd.getpwnam(a.name)
        a.uid, a.gid, a.home = pw.pw_uid, pw.pw_gid, pw.pw_dir


def as_user(room: Classroom, a: Account, cmd: list[str], cwd: str, what: str) -> str:
    """Run a command of the class environment as that user (their home, no root rights), with the variables the
    hub gives every server (jupyterhub_config.py): the class's Python and nbgrader's course id and exchange."""
    env = {"HOME": a.home, "USER": a.name, "LOGNAME": a.name, "LANG": "C.UTF-8",
           "PATH": f"{room.class_env / 'bin'}:/usr/local/bin:/usr/bin:/bin",
           "DPC_PYTHON": str(room.class_env / "bin" / "python"), "DPC_COURSE_ID": COURSE_ID,
           "DPC_EXCHANGE": str(room.exchange)}
    return run(cmd, what, room.log, cwd=cwd, user=a.uid, group=a.gid, extra_groups=[], env=env)
