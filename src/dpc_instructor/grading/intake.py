"""What a class handed in, read as one Student each (find_submissions): the first stage of grading.

SUBMISSIONS holds one entry per student, any of:
    SUBMISSIONS/<student>/<lab>/<notebook>.ipynb     (nbgrader's layout; timestamp.txt and
                                                       submission_secret.txt beside it are kept:
                                                       late-submission rules, release_feedback)
    SUBMISSIONS/<student>/<notebook>.ipynb
    SUBMISSIONS/<student>.ipynb                      (labs with one notebook)
The submissions are read, never modified, and only as regular files: a symbolic link, a named
pipe, a device or a hard link anywhere on the way is refused (that student's status says so) and
nothing of its target is read; a notebook may have MAX_NOTEBOOK bytes. Any name is a student:
the grader's id for it is the name when plain, else a slug and a hash (grader_id); the CSV, the
course's gradebook exports and the feedback show the name as handed in.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from dpc_instructor import gradebook
from dpc_runtime import sandbox

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Student:
    """One student's submission and what grading made of it (`name` as handed in, `id` the
    grader's: see grader_id)."""

    name: str
    id: str
    notebooks: dict[str, bytes] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)  # gradebook.KEPT files handed in beside them
    status: str = "graded"
    notes: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    cells: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    retried: list[str] = field(default_factory=list)  # why each try but the last failed (host_failure)


PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.]+)*")
JUNK = {".ipynb_checkpoints", ".DS_Store", ".git", "__MACOSX"}  # not students
MAX_NOTEBOOK = 32 << 20  # bytes a submitted notebook may have
MAX_STAMP = 1 << 10


def grader_id(name: str) -> str:
    """The grader's id for a student's name: the name itself when plain (ASCII letters, digits, '_',
    '.', single '-' inside; at most 64), else a readable ASCII slug, '--' and a hash of the name.

    A plain name never holds '--', so a hashed id never equals one; two names differing in any way
    (script, case, space vs '_') get different ids; no id starts with '-' (never read as an option).
    """
    if len(name) <= 64 and PLAIN_ID.fullmatch(name):
        return name
    raw = name.encode("utf-8", "surrogateescape")
    ascii_ = unicodedata.normalize("NFKD", raw.decode("utf-8", "replace")).encode("ascii", "ignore")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", ascii_.decode()).strip("_")[:40] or "student"
    return f"{slug}--{hashlib.sha256(raw).hexdigest()[:16]}"


def shown(name: str) -> str:
    """A name as the CSV and the gradebook show it (bytes that are not UTF-8 replaced)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def lab_notebooks(lab: str) -> list[str]:
    """Notebook names (without .ipynb) of a lab's source in solutions/."""
    src = ROOT / "solutions" / lab
    if not src.is_dir():
        labs = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
        raise SystemExit(f"grade: no lab {lab!r} in solutions/ (labs: {', '.join(labs)})")
    return sorted(p.stem for p in src.glob("*.ipynb"))


def _take(st: Student, top: int, entry: str, lab: str, names: list[str], single: bool) -> None:
    """Read st's notebooks (and gradebook.KEPT files) from the entry `entry` of the open folder top."""
    for name in names:
        options = [[entry]] if single else [[entry, lab, f"{name}.ipynb"], [entry, f"{name}.ipynb"]]
        for parts in options:
            try:
                st.notebooks[name] = sandbox.read_regular(top, parts, MAX_NOTEBOOK)
                break
            except FileNotFoundError:
                continue
    for kept in gradebook.KEPT if not single else ():
        with contextlib.suppress(FileNotFoundError):
            st.kept[kept] = sandbox.read_regular(top, [entry, lab, kept], MAX_STAMP)


def _check_notebooks(st: Student, names: list[str]) -> None:
    """st's status when a notebook is missing or is no notebook (JSON with cells of a type and a source)."""
    missing = [n for n in names if n not in st.notebooks]
    if missing:
        st.status = f"missing notebook(s): {', '.join(n + '.ipynb' for n in missing)}"
    for nb_name, data in st.notebooks.items():
        try:
            nb = json.loads(data.decode("utf-8"))
            if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
                raise ValueError("no cells")
            if not all(isinstance(c, dict) and "cell_type" in c and "source" in c
                       for c in nb["cells"]):
                raise ValueError("a cell without cell_type or source")
        except (UnicodeDecodeError, ValueError) as err:
            st.status = f"unreadable notebook {nb_name}.ipynb: {err}"


def _student_of(top: int, entry: str, lab: str, names: list[str]) -> Student:
    """The Student of one entry of the open submissions folder top, read (or refused: its status)."""
    mode = os.stat(entry, dir_fd=top, follow_symlinks=False).st_mode
    single = stat.S_ISREG(mode) and entry.endswith(".ipynb") and len(names) == 1
    name = entry[:-len(".ipynb")] if entry.endswith(".ipynb") and not stat.S_ISDIR(mode) else entry
    st = Student(shown(name), grader_id(name))
    try:
        if not (single or stat.S_ISDIR(mode)):
            raise sandbox.Refused(f"{entry} is {sandbox.file_kind(mode)}: only regular files "
                                  f"and folders are read")
        _take(st, top, entry, lab, names, single)
    except sandbox.Refused as why:
        st.status = f"not graded: {shown(str(why))}"
        st.notebooks, st.kept = {}, {}
        return st
    _check_notebooks(st, names)
    return st


def _one_each(students: list[Student]) -> list[Student]:
    """students with one per grader id: two entries of one student (ann/ and ann.ipynb) are neither
    guessed, the first one's status says so and the second is dropped."""
    kept: dict[str, Student] = {}
    for st in students:
        if st.id in kept:
            first = kept[st.id]
            first.status = (f"not graded: handed in twice (a folder and a notebook named "
                            f"{first.name}): keep one")
            first.notebooks, first.kept = {}, {}
        else:
            kept[st.id] = st
    return list(kept.values())


def find_submissions(folder: Path, lab: str, names: list[str]) -> list[Student]:
    """One Student per entry of folder, with the notebooks read for them (or a status why not).

    Only regular files and folders are read, never through a link (sandbox.read_regular); what is refused
    becomes that student's status, and nothing of it is read or copied.
    """
    if not folder.is_dir():
        raise SystemExit(f"grade: {folder} is not a folder of submissions")
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        students = [_student_of(top, entry, lab, names) for entry in sorted(os.listdir(top)) if entry not in JUNK]
    finally:
        os.close(top)
    return _one_each(students)
