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

pytestmark = pytest.mark.gate  # tests/tiers.py

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


def module_name(path: Path) -> str:
    """The dotted name of a .py file under src/ (a package's __init__.py: the package)."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of tree except those in the body of an `if TYPE_CHECKING:` (for type checkers only)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test).split("."):
            todo += [node.test, *node.orelse]
        else:
            todo += ast.iter_child_nodes(node)
    return nodes


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of src/ that path's import statements name, anywhere in it (in functions too).

    `from x import y` names x.y when that is a module, else x; relative imports are resolved
    against path's package. Imports under `if TYPE_CHECKING:` are left out: they never run.
    """
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in run_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return (found & modules) - {me}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of graph (module -> modules it imports) as [a, b, ..., a], or None when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for nxt in sorted(graph[module]):
            if cycle := visit(nxt):
                return cycle
        path.pop()
        done.add(module)
        return None

    return next((c for m in sorted(graph) if (c := visit(m))), None)


def test_no_import_cycle_between_modules_of_src():
    files = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    graph = {m: imported_modules(p, set(files)) for m, p in files.items()}
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]  # the finder
    cycle = import_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)} (move what both need into a module of its own)"


LONGEST = 50  # lines of a function, def to its last line, docstring included
# "path::function" -> why it stays longer: a chapter reads it whole.
LONG_ON_PURPOSE = {
    "src/helpers/ring.py::ring_allreduce": "chapter 5 prints its source (inspect.getsource in "
                                           "course/05-ring-allreduce.ipynb) as the algorithm students read",
}


def function_lengths(path: Path) -> dict[str, int]:
    """Lines of every function of path (methods and nested functions too), by Class.function name."""
    lengths = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return lengths


def test_no_function_is_longer_than_fifty_lines():
    lengths = {f"{p.relative_to(ROOT).as_posix()}::{name}": n
               for d in ("src", "benchmarks", "examples") for p in sorted((ROOT / d).rglob("*.py"))
               for name, n in function_lengths(p).items()}
    long = {k: n for k, n in lengths.items() if n > LONGEST and k not in LONG_ON_PURPOSE}
    assert not long, f"functions over {LONGEST} lines (split them into named steps):\n" + "\n".join(
        f"  {k}: {n} lines" for k, n in sorted(long.items()))
    stale = [k for k in LONG_ON_PURPOSE if lengths.get(k, 0) <= LONGEST]
    assert not stale, f"LONG_ON_PURPOSE names functions that no longer exist or are short now: {stale}"
