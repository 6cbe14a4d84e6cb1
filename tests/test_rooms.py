"""The layout by audience: which room imports which, the lesson's docstrings name their chapter,
nothing finds code by path (no sys.path inserts, no spec loaders), no helper shadows its module."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from gradekit import ROOT

import helpers

SRC = ROOT / "src"
# room -> the rooms it may import. The lesson and its runtime ship to students; the instructor's and
# maintainers' rooms never do, so nothing shipped may import them.
ALLOWED = {
    "helpers": {"dpc_runtime"},
    "dpc_runtime": set(),
    "dpc_setup": {"dpc_runtime", "helpers"},
    "dpc_instructor": {"dpc_runtime"},
    "dpc_maintainer": {"dpc_runtime", "dpc_instructor", "helpers", "dpc_setup"},
}
SHIPPED = ("helpers", "dpc_runtime", "dpc_setup")


def python_files() -> list[Path]:
    return sorted(p for d in ("src", "tests", "benchmarks", "examples") for p in (ROOT / d).rglob("*.py"))


def imported_rooms(path: Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        rooms |= {n.split(".")[0] for n in names if n.split(".")[0] in ALLOWED}
    return rooms


def test_every_room_is_a_package_and_imports_only_what_it_may():
    assert {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()} == set(ALLOWED)
    for room, allowed in ALLOWED.items():
        for path in (SRC / room).rglob("*.py"):
            wrong = imported_rooms(path) - allowed - {room}
            assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}; {room} may import {sorted(allowed)}"


def test_nothing_finds_code_by_path():
    for path in python_files():
        if path == Path(__file__).resolve():
            continue  # this test names what it looks for
        text = path.read_text()
        for bad in ("sys.path.insert", "sys.path.append", "spec_from_file_location", "SourceFileLoader"):
            assert bad not in text, f"{path.relative_to(ROOT)}: {bad} (import the package by name)"


def test_every_public_function_of_the_lesson_names_its_chapter():
    for path in sorted((SRC / "helpers").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                first = (ast.get_docstring(node) or "").split("\n")[0]
                assert re.search(r"\b[Cc]hapters? \d+", first), (
                    f"src/helpers/{path.name}: {node.name}'s docstring must say which chapter teaches it")


def test_no_helper_shadows_a_module_of_the_same_name():
    modules = {p.stem for p in (SRC / "helpers").glob("*.py")} - {"__init__"}
    for name in helpers.__all__:
        obj = getattr(helpers, name)
        assert name not in modules or getattr(obj, "__name__", "") == f"helpers.{name}", (
            f"helpers.{name} is not the module helpers/{name}.py")


@pytest.mark.parametrize("folder", ["course", "solutions", "examples", "benchmarks"])
def test_course_material_uses_no_private_helper(folder):
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        elif path.suffix == ".py":
            text = path.read_text()
        else:
            continue
        private = re.findall(r"(?:from helpers\.\w+ import [^\n]*\b(_[a-z]\w*)|helpers(?:\.\w+)*\.(_[a-z]\w*))", text)
        assert not private, f"{path.relative_to(ROOT)} uses private helpers {private}"


def test_every_module_of_the_lesson_names_its_chapters():
    for path in sorted((SRC / "helpers").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert re.search(r"\b[Cc]hapters? \d+|chapters\b", doc), f"src/helpers/{path.name}: say which chapter it serves"


# Modules that also run in an environment other than the course's: the classroom's browser phase runs in the
# hub's (JupyterHub, Playwright; src/dpc_setup/hub.sh), the guardian with whatever python started the run,
# Horovod's build-log reader with the Python being built for (src/dpc_setup/horovod/build.sh), the website's
# builder in its own (requirements-book.txt: Sphinx, Playwright).
OUTSIDE_THE_COURSE_ENV = ("dpc_maintainer.classroom", "dpc_runtime.reaper", "dpc_instructor.hub.cgroups",
                          "dpc_setup.buildlog", "dpc_maintainer.book")


@pytest.mark.parametrize("module", OUTSIDE_THE_COURSE_ENV)
def test_a_module_run_outside_the_course_environment_imports_without_its_packages(module):
    import subprocess
    import sys

    # -S: no site-packages, so no psutil, torch or playwright; the module must still import (it takes those
    # where it uses them). This is the failure CI saw: the browser phase died on `import psutil`.
    out = subprocess.run([sys.executable, "-S", "-c", f"import {module}"], env={"PYTHONPATH": str(SRC)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
