"""Every cell of a lab that launches ranks has its own time limit in course.yml (issue 54, item 2).

A graded notebook's cell may run DPC_CELL_TIMEOUT seconds (60) unless `slow_cells` of course.yml gives its
grade id more (dpc_runtime.manifest.cell_timeout). A cell that launches ranks (torchrun, horovodrun, the
`tf` launcher, srun's variables) starts processes, imports torch or TensorFlow in each and waits for their
rendezvous: on a busy node that alone can pass 60 s. So each such cell of every lab source
(solutions/*/*.ipynb) has a grade id and a slow_cells entry, and that limit is at least the longest
`timeout` of any one launch it makes (evaluated with the larger of the lab's default and CI parameters):
below it a hung launch is cut by the cell's limit before the launcher stops it and names the stuck rank.

How a launching cell is found, statically (ast, no launch): the launchers are the functions of
`dpc_runtime.launch` and `helpers` that reach `dpc_runtime.launch.run_processes` (which starts every
launch's processes), found in their source, with the names `helpers` re-exports them under; a command
line that names torchrun, horovodrun, mpirun, srun or `torch.distributed.run` run by `subprocess`,
`os.system` or `helpers.sh` is one too. A cell launches when the code it runs (its statements, not the
bodies of the functions it only defines) uses a launcher, or a function or method defined in the same
or an earlier cell of the notebook (its locked helper cells, its own earlier definitions) that uses one,
followed by name through every definition. Cell magics (`%%writefile` of a worker) are text, not code.

Not checked here: that the limit covers the cell's time at the Needs line's busy-node load (load 8 on 2
cores). No per-cell time is recorded anywhere yet: `dpc_maintainer.needs` reports whole notebooks
(build/needs/<mode>/report.json); papermill's per-cell durations are only in the executed copies it
leaves there, and `dpc_maintainer.outputs writeback` drops them from what is committed. So the floor
above is the launches' own timeouts, not a measurement.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from dpc_maintainer.solutions import defaults
from dpc_runtime import manifest
from dpc_runtime.notebook import grade_id, source

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LABS = sorted((ROOT / "solutions").glob("*/*.ipynb"))
RUN_PROCESSES = "dpc_runtime.launch.run_processes"  # starts the processes of every launch of the course
# Launchers on a command line, and what runs one.
LAUNCH_WORDS = re.compile(r"\b(torchrun|horovodrun|mpirun|mpiexec|srun)\b|torch\.distributed\.(run|launch)\b")
SHELLS = re.compile(r"^(subprocess\.\w+|os\.(system|popen|exec\w*|spawn\w*|posix_spawn\w*)|helpers\.sh)$")


# --- names and what they resolve to --------------------------------------------------------------

def dotted(node: ast.AST) -> str | None:
    """'a.b.c' for the expression a.b.c (a name and attributes), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def imports(tree: ast.AST, package: str = "") -> dict[str, str]:
    """Local name -> qualified name of every import in tree (`package`: for relative imports)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    found[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    found[head] = head
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            for a in node.names:
                found[a.asname or a.name] = f"{base}.{a.name}"
    return found


def resolve(name: str, aliases: dict[str, str]) -> str:
    """A dotted name with its first part replaced by what it was imported as."""
    head, _, rest = name.partition(".")
    if head not in aliases:
        return name
    return aliases[head] + (f".{rest}" if rest else "")


def executed(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node the statements run when executed: not the bodies of the functions they only define
    (their decorators and default values run), a class body's statements but not its methods' bodies."""
    stack: list[ast.AST] = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            children: list[ast.AST] = [*node.decorator_list, *node.args.defaults,
                                       *(d for d in node.args.kw_defaults if d is not None)]
        else:
            children = list(ast.iter_child_nodes(node))
        stack.extend(reversed(children))


def functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Every function defined anywhere in tree, and whether it is a method (defined in a class body)."""
    def visit(node: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, isinstance(node, ast.ClassDef)
            yield from visit(child)

    return visit(tree)


def strings(node: ast.AST) -> Iterator[str]:
    """The literal text inside an expression (string constants, the fixed parts of f-strings)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


# --- the launchers of the course's own packages ----------------------------------------------------

@dataclass(frozen=True)
class Launcher:
    """A function that launches ranks: its qualified name and the default of its `timeout` (None: none)."""

    name: str
    timeout: float | None


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _timeout_default(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> float | None:
    args = fn.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    for arg, default in pairs:
        if arg.arg == "timeout" and isinstance(default, ast.Constant) and isinstance(default.value, (int, float)):
            return float(default.value)
    return None


def course_launchers() -> dict[str, Launcher]:
    """Qualified name -> Launcher for every function of dpc_runtime.launch and helpers that reaches
    run_processes (transitively), under every name helpers exports it as."""
    modules = [SRC / "dpc_runtime" / "launch.py", *sorted((SRC / "helpers").glob("*.py"))]
    parsed = {}
    for path in modules:
        name = _module_name(path)
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        aliases = imports(tree, package)
        defs = {fn.name: fn for fn in tree.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))}
        aliases.update({fn: f"{name}.{fn}" for fn in defs})
        parsed[name] = (aliases, defs)
    found: dict[str, Launcher] = {RUN_PROCESSES: Launcher(RUN_PROCESSES, None)}
    changed = True
    while changed:
        changed = False
        for module, (aliases, defs) in parsed.items():
            for local, qualified in aliases.items():  # a launcher imported (re-exported) under a name
                if qualified in found and f"{module}.{local}" not in found:
                    found[f"{module}.{local}"] = found[qualified]
                    changed = True
            for fn in defs.values():
                qualified = f"{module}.{fn.name}"
                if qualified in found:
                    continue
                uses = {resolve(d, aliases) for n in ast.walk(fn) if (d := dotted(n))}
                if uses & set(found):
                    found[qualified] = Launcher(qualified, _timeout_default(fn))
                    changed = True
    return found


LAUNCHERS = course_launchers()


def test_the_course_launchers_are_found_in_their_source():
    """The launchers a lab calls are found (and so would a new one be): helpers.launch, elastic's,
    the multi-node ones; and no plain helper is taken for one."""
    for name in ["helpers.launch", "dpc_runtime.launch.launch", "helpers.elastic.launch_elastic",
                 "helpers.multinode.launch_nodes", "helpers.multinode.horovodrun_hosts",
                 "helpers.multinode.slurm_tasks"]:
        assert name in LAUNCHERS, f"{name} is not found as a launcher: {sorted(LAUNCHERS)}"
    for name in ["helpers.sh", "helpers.inventory", "helpers.elastic.torchrun_argv", "dpc_runtime.launch.free_port"]:
        assert name not in LAUNCHERS, name
    assert LAUNCHERS["helpers.launch"].timeout == LAUNCHERS["helpers.elastic.launch_elastic"].timeout == 120


# --- a notebook's launching cells -------------------------------------------------------------------

@dataclass
class Launching:
    """One code cell that launches ranks: its index, grade id, the chain of names that reaches a launcher
    (e.g. ['run_check', 'helpers.launch']) and the longest timeout of any one of its launches (None:
    not known)."""

    index: int
    grade_id: str | None
    chain: list[str]
    timeout: float | None


def _number(node: ast.AST, values: dict[str, object]) -> float | None:
    """The value of an arithmetic expression over numbers and the notebook's parameters, else None."""
    try:
        value = eval(compile(ast.Expression(node), "<timeout>", "eval"), {"__builtins__": {}}, dict(values))  # noqa: S307
    except Exception:  # noqa: BLE001 (anything but plain arithmetic over the parameters: not known)
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class Notebook:
    """Follows a notebook's definitions cell by cell: which names launch, and with what timeout."""

    def __init__(self, parameters: dict[str, object]) -> None:
        self.parameters = parameters
        self.aliases: dict[str, str] = {}
        self.functions: dict[str, tuple[list[str], float | None]] = {}  # name -> (chain, longest timeout)
        self.methods: dict[str, tuple[list[str], float | None]] = {}

    def uses(self, nodes: list[ast.AST] | Iterator[ast.AST]) -> tuple[list[str], float | None] | None:
        """The first launcher these nodes reach (its chain) and the longest timeout of all they reach."""
        chain: list[str] | None = None
        longest: float | None = None

        def seen(found: list[str], timeout: float | None) -> None:
            nonlocal chain, longest
            chain = chain or found
            if timeout is not None:
                longest = max(longest or 0.0, timeout)

        handled: set[int] = set()  # the callee of a launch already counted with its call's timeout
        for node in nodes:
            if isinstance(node, ast.Call) and (name := dotted(node.func)):
                target = resolve(name, self.aliases)
                if target in LAUNCHERS:
                    handled.add(id(node.func))
                    given = next((k.value for k in node.keywords if k.arg == "timeout"), None)
                    seen([target], _number(given, self.parameters) if given is not None
                         else LAUNCHERS[target].timeout)
                elif SHELLS.match(target):
                    words = [m[0] for arg in [*node.args, *(k.value for k in node.keywords)]
                             for text in strings(arg) if (m := LAUNCH_WORDS.search(text))]
                    if words:
                        seen([f"{target}({words[0]} ...)"], None)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                if id(node) in handled:
                    continue
                name = dotted(node)
                if isinstance(node, ast.Name) and node.id in self.functions:
                    seen([node.id, *self.functions[node.id][0]], self.functions[node.id][1])
                elif name and resolve(name, self.aliases) in LAUNCHERS:  # a launcher passed as a value
                    target = resolve(name, self.aliases)
                    seen([target], LAUNCHERS[target].timeout)
                elif isinstance(node, ast.Attribute) and node.attr in self.methods:
                    seen([f".{node.attr}", *self.methods[node.attr][0]], self.methods[node.attr][1])
        return (chain, longest) if chain else None

    def cell(self, code: str) -> tuple[list[str], float | None] | None:
        """Take in one code cell's definitions; what its executed code reaches (None: no launch)."""
        tree = ast.parse(TransformerManager().transform_cell(code))
        self.aliases.update(imports(tree))
        defs = list(functions(tree))
        for fn, method in defs:  # redefined here: what an earlier cell's definition did no longer counts
            (self.methods if method else self.functions).pop(fn.name, None)
        for _ in range(len(defs) + 1):  # a definition may use one defined after it in the same cell
            for fn, method in defs:
                if found := self.uses(ast.walk(fn)):
                    (self.methods if method else self.functions)[fn.name] = found
        return self.uses(executed(tree.body))


def launching_cells(path: Path) -> list[Launching]:
    """The code cells of a lab source that launch ranks, in order."""
    nb = json.loads(path.read_text())
    rel = path.relative_to(ROOT).as_posix()
    parameters = defaults(path)
    for name, value in (manifest.notebooks().get(rel, {}).get("ci") or {}).items():  # the larger of the two
        default = parameters.get(name)
        if isinstance(value, (int, float)) and isinstance(default, (int, float)):
            parameters[name] = max(value, default)
    follow = Notebook(parameters)
    found = []
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code":
            continue
        got = follow.cell(source(c))
        if got:
            found.append(Launching(i, grade_id(c), *got))
    return found


FOUND = {path.relative_to(ROOT).as_posix(): launching_cells(path) for path in LABS}


def _where(rel: str, cell: Launching) -> str:
    return f"{rel} cell {cell.index} ({cell.grade_id or 'no grade id'}, launches through {' -> '.join(cell.chain)})"


def missing_limits(rel: str, limits: dict[str, int]) -> list[str]:
    """The launching cells of lab source rel that have no grade id, or no entry in limits (slow_cells)."""
    found = [f"  {_where(rel, c)}: no grade id: a cell without one cannot get a limit"
             for c in FOUND[rel] if c.grade_id is None]
    return found + [f"  {_where(rel, c)}: no limit in course.yml's slow_cells (it gets the default "
                    f"{manifest.DEFAULT_CELL_TIMEOUT} s)"
                    for c in FOUND[rel] if c.grade_id is not None and c.grade_id not in limits]


def short_limits(rel: str, limits: dict[str, int]) -> list[str]:
    """The launching cells of rel whose limit is below the timeout of one of their launches."""
    return [f"  {_where(rel, c)}: {limits[c.grade_id]} s, but one launch may take {c.timeout:g} s"
            for c in FOUND[rel]
            if c.grade_id in limits and c.timeout is not None and limits[c.grade_id] < c.timeout]


@pytest.mark.parametrize("rel", sorted(FOUND))
def test_every_launching_cell_has_a_grade_id_and_a_limit(rel):
    """A launching cell is keyed by its grade id in slow_cells; without an entry it gets the default 60 s."""
    missing = missing_limits(rel, manifest.slow_cells())
    assert not missing, "cells that launch ranks need their own time limit:\n" + "\n".join(missing)


@pytest.mark.parametrize("rel", sorted(FOUND))
def test_every_launching_cell_may_run_as_long_as_its_launches_may(rel):
    """A limit below one launch's own timeout cuts a hung launch before the launcher stops it and says
    which rank hung."""
    short = short_limits(rel, manifest.slow_cells())
    assert not short, "cells whose limit is shorter than one of their launches:\n" + "\n".join(short)


def test_a_missing_or_short_limit_is_named():
    """The rule on lab 5's reduce-scatter test: without its entry (as before issue 54) it is missing; with
    the default's 60 s its launches' 120 s (2 * TIMEOUT + 60) is longer."""
    rel = "solutions/05-ring-allreduce/ring-allreduce.ipynb"
    limits = manifest.slow_cells()
    without = {k: v for k, v in limits.items() if k != "lab05-test-real-rs"}
    assert [line.split("(")[1].split(",")[0] for line in missing_limits(rel, without)] == ["lab05-test-real-rs"]
    at = next(c.index for c in FOUND[rel] if c.grade_id == "lab05-test-real-rs")
    assert short_limits(rel, {**limits, "lab05-test-real-rs": 60}) == [
        f"  {rel} cell {at} (lab05-test-real-rs, launches through run_check -> helpers.launch): 60 s, but one "
        "launch may take 120 s"]


def test_the_launching_cells_are_found():
    """What the rule sees in today's labs: a direct launch, one through a locked helper cell's function, one
    through a hidden test's use of it, elastic launches, horovodrun; and the cells that only write or
    read a launch's results are not taken for launches."""
    seen = {c.grade_id: c for cells in FOUND.values() for c in cells}
    for gid, chain in {"lab05-check-run": ["run_check", "helpers.launch"],
                       "lab05-test-real-rs": ["run_check", "helpers.launch"],
                       "lab06-torch-run": ["helpers.launch"],
                       "lab07-test-loss": ["run", "helpers.launch"],
                       "lab10-run-jobs": ["collect", "helpers.launch"],
                       "lab10-run-yours": ["train", "helpers.elastic.launch_elastic"]}.items():
        assert gid in seen and seen[gid].chain == chain, (gid, seen.get(gid))
    for gid in ["lab05-test-real-traffic", "lab05-check-worker", "lab10-worker", "lab10-collect", "lab07-imports",
                "lab10-test-resume", "lab10-train"]:
        assert gid not in seen, (gid, seen[gid])
    assert seen["lab05-test-real-rs"].timeout == 2 * 30 + 60  # timeout=2 * TIMEOUT + 60, TIMEOUT = 30


def test_a_launch_is_found_through_every_way_a_notebook_can_reach_it():
    """The rule's own cases: an alias, a method, a function passed as a value, a later redefinition that
    no longer launches, a shell command, a worker written by %%writefile (text, not a launch)."""
    def cells(*codes: str) -> list[bool]:
        follow = Notebook({"TIMEOUT": 30})
        return [follow.cell(code) is not None for code in codes]

    assert cells("import helpers as h\nh.launch('w.py', 2)") == [True]
    assert cells("from helpers.elastic import launch_elastic as go", "go('w.py')") == [False, True]
    assert cells("import helpers\nclass Job:\n    def start(self):\n        return helpers.launch('w.py', 2)",
                 "job = Job()", "job.start()") == [False, False, True]
    assert cells("import helpers\ndef run(n):\n    return helpers.launch('w.py', n)",
                 "results = list(map(run, [2, 3]))", "def run(n):\n    return n", "run(2)") == [False, True, False, False]
    assert cells("import subprocess\nsubprocess.run(['torchrun', '--nproc-per-node=2', 'w.py'])",
                 "import helpers\nhelpers.sh(f'{sys.executable} -m torch.distributed.run w.py')",
                 "helpers.sh('python w.py')") == [True, True, False]
    assert cells("%%writefile runs/w.py\nimport helpers\nhelpers.launch('x.py', 2)\n") == [False]
    follow = Notebook({"TIMEOUT": 30})
    follow.cell("import helpers\ndef go():\n    helpers.launch('w.py', 2, timeout=2 * TIMEOUT + 60)\n"
                "    helpers.launch('w.py', 2)")
    assert follow.cell("go()") == (["go", "helpers.launch"], 120.0)
