"""The notebook conventions of CONTRIBUTING.md, checked on every notebook of course/ and solutions/."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpc_maintainer.needs import NEEDS, needs_line
from dpc_runtime import manifest
from dpc_runtime.notebook import grade_id, nbgrader, source

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.relative_to(ROOT).as_posix() for d in ("course", "solutions")
                   for p in (ROOT / d).rglob("*.ipynb")  # parts inside the checkout: it may lie in a folder named runs
                   if not {".ipynb_checkpoints", "runs"} & set(p.relative_to(ROOT).parts))
LISTED = manifest.notebooks()
CHECKED = "nbval-check-output"  # the cell tag: nbval compares this cell's output with the committed one


def cells(rel: str) -> list[dict]:
    return json.loads((ROOT / rel).read_text())["cells"]


def opening(rel: str) -> str:
    """The markdown before the first code cell: title and Overview, in short blocks."""
    found = []
    for c in cells(rel):
        if c["cell_type"] == "code":
            break
        found.append(source(c))
    return "\n\n".join(found)




def test_every_notebook_is_listed_for_ci():
    assert NOTEBOOKS, "no notebooks found"
    assert sorted(LISTED) == NOTEBOOKS, "course.yml must list exactly the notebooks"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_has_a_parameters_cell(rel):
    tagged = [c for c in cells(rel) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{rel}: needs exactly one cell tagged 'parameters'"
    names = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*=", source(tagged[0]), re.M))
    settings = LISTED[rel] or {}
    declared = set(settings.get("ci", {})) | set(settings.get("gpu", {})) | set(settings.get("sections", {}))
    unknown = declared - names
    assert not unknown, f"{rel}: parameters {unknown} of course.yml are not in its parameters cell"
    # papermill must understand every line (an "=" in a comment makes it skip the line with a warning)
    from papermill.translators import PythonTranslator
    parsed = {p.name for p in PythonTranslator.inspect({**tagged[0], "source": source(tagged[0])})}
    assert parsed == names, f"{rel}: papermill cannot parse the parameters {names - parsed}"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_declares_what_it_needs(rel):
    """The opening says what a run with the defaults needs: cores, memory, minutes idle, at a class hub's
    share and on a busy node (all three measured: dpc_maintainer.needs)."""
    found = NEEDS.search(opening(rel))
    assert found, (f"{rel}: the opening (the markdown before the first code cell) must say what the "
                   "notebook needs, on a line like "
                   + repr(needs_line(2, "2", 180, 240, 1.5, "about 1 minute", 700, 8))
                   + " (python -m dpc_maintainer.needs writes it from measured runs)")
    assert int(found["idle"]) <= 5, f"{rel}: the defaults must run in at most 5 minutes on 2 cores"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_the_parameters_say_what_to_lower_on_a_busy_node(rel):
    """The parameters cell ends with what to lower first on a shared node (issue 35)."""
    tagged = next(c for c in cells(rel) if "parameters" in c.get("metadata", {}).get("tags", []))
    last = source(tagged).rstrip().splitlines()[-1]
    assert last.startswith("# On a busy node: "), f"{rel}: end the parameters cell with '# On a busy node: ...'"
    names = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*=", source(tagged), re.M))
    assert any(re.search(rf"\b{n}\b", last) for n in names) or "nothing to lower" in last or \
        "keep these values" in last, f"{rel}: the busy-node line names a parameter to lower"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_workers_speak_the_protocol(rel):
    """Every worker script a notebook writes and launches starts, reports and ends the course's way."""
    code = [source(c) for c in cells(rel) if c["cell_type"] == "code"]
    launching = "\n".join(t for t in code if "launch(" in t and not t.startswith("%%writefile"))
    for text in code:
        if not text.startswith("%%writefile"):
            continue
        name = text.splitlines()[0].split()[-1].rsplit("/", 1)[-1]
        if not re.search(rf"[/\"']{re.escape(name)}[\"']", launching):
            continue  # a module the workers import, not a script that is launched
        first = text.splitlines()[0]
        assert "from helpers.worker import" in text, f"{rel}: {first}: start, report and finish with helpers.worker"
        assert "finish(" in text, f"{rel}: {first}: end with helpers.worker.finish()"
        assert not re.search(r"print\(f?[\"']RESULT", text), f"{rel}: {first}: report results with report()"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_no_shell_escapes(rel):
    """`!cmd` does not fail the cell when cmd fails: notebooks use helpers.sh instead."""
    for c in cells(rel):
        if c["cell_type"] != "code":
            continue
        for line in source(c).splitlines():
            stripped = line.strip()
            assert not (stripped.startswith("!") or stripped.startswith("%%bash")
                        or stripped.startswith("%%sh") or stripped.startswith("%system")
                        or re.match(r"\w+\s*=\s*!", stripped)), f"{rel}: shell escape {line!r}"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_checked_cells_have_recorded_outputs(rel):
    """nbval never compares a cell without an execution count: that would disable the check."""
    for c in cells(rel):
        if c["cell_type"] == "code" and CHECKED in c.get("metadata", {}).get("tags", []):
            assert c.get("execution_count") and c.get("outputs"), (
                f"{rel}: a cell tagged {CHECKED} has no recorded output: run the notebook and save")



TEMPLATE = ("Overview", "Parameters", "Setup", "<numbered sections>", "What to take away", "Exercises",
            "Next steps")


def sections(rel: str) -> list[tuple[str, int]]:
    """The notebook's level-2 headings, each with the index of the cell holding it."""
    found = []
    for i, c in enumerate(cells(rel)):
        if c["cell_type"] == "markdown":
            found += [(m.group(1).strip(), i) for m in re.finditer(r"^## (.+)$", source(c), re.M)]
    return found


def title_number(rel: str) -> tuple[str, str]:
    """('Chapter'|'Lab', 'N') that the notebook's file or folder name says it must carry."""
    if rel.startswith("course/"):
        return "Chapter", str(int(rel.split("/")[1][:2]))
    return "Lab", str(int(rel.split("/")[1][:2]))


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_follows_the_notebook_template(rel):
    """CONTRIBUTING's template: title, Overview, Parameters, Setup, 1. 2. ..., take-aways, exercises, next."""
    kind, number = title_number(rel)
    first = source(cells(rel)[0])
    assert re.match(rf"# {kind} {number} — \S", first), (
        f"{rel}: the first cell must start with the title '# {kind} {number} — <title>'")
    heads = sections(rel)
    names = [h for h, _ in heads]
    numbered = [h for h in names if re.match(r"\d+\. ", h)]
    assert numbered and [int(h.split(".")[0]) for h in numbered] == list(range(1, len(numbered) + 1)), (
        f"{rel}: numbered sections must run 1., 2., 3., ... (found {numbered})")
    shape = [h if not re.match(r"\d+\. ", h) else "<numbered sections>" for h in names]
    shape = [h for i, h in enumerate(shape) if i == 0 or h != shape[i - 1]]
    assert tuple(shape) == TEMPLATE, f"{rel}: level-2 headings must be {TEMPLATE}, found {names}"
    where = dict(heads)
    assert where["Overview"] == 0, f"{rel}: '## Overview' belongs in the first cell, under the title"
    assert re.search(r"you will learn", opening(rel), re.I), f"{rel}: the Overview says what you will learn"
    tagged = [i for i, c in enumerate(cells(rel)) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert tagged and where["Parameters"] < tagged[0] < where["Setup"], (
        f"{rel}: the parameters cell belongs between '## Parameters' and '## Setup'")
    text = "\n".join(source(c) for c in cells(rel)[where["Exercises"]:where["Next steps"]]
                     if c["cell_type"] == "markdown")
    assert re.search(r"\bhint", text, re.I) and re.search(r"not graded|ungraded", text, re.I), (
        f"{rel}: the Exercises section says the exercises are not graded and gives hints")
    nxt = "\n".join(source(c) for c in cells(rel)[where["Next steps"]:] if c["cell_type"] == "markdown")
    assert len(nxt.split("## Next steps", 1)[1].strip()) > 20, f"{rel}: say what comes next"


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_sources_are_named(rel):
    """Student text names the articles it draws on by title (README's References), never 'the seed'."""
    for c in cells(rel):
        if c["cell_type"] == "markdown" or c["cell_type"] == "code":
            assert not re.search(r"\bseed(?:'s)? (?:article|text|example|tutorial|source)|\bthe seed\b(?!\s*=)",
                                 source(c), re.I), f"{rel}: name the source by its title, not 'the seed'"


def test_lab_names_follow_the_scheme():
    """labs: solutions/NN-<slug>/<slug>.ipynb after chapter NN; grade ids labNN-...; tests test_grading_NN_<slug>."""
    chapters = {p.name[:2] for p in (ROOT / "course").glob("[0-9][0-9]-*.ipynb")}
    for rel in NOTEBOOKS:
        if not rel.startswith("solutions/"):
            continue
        folder, name = rel.split("/")[1:]
        number, slug = folder[:2], folder[3:]
        assert re.fullmatch(r"\d\d-[a-z0-9]+(?:-[a-z0-9]+)*", folder), f"{rel}: lab folder NN-<slug>"
        assert name == f"{slug}.ipynb", f"{rel}: the notebook of lab {folder} is {slug}.ipynb"
        assert number in chapters, f"{rel}: lab {number} follows chapter {number}, which does not exist"
        assert (ROOT / "tests" / f"test_grading_{folder.replace('-', '_')}.py").exists(), (
            f"{rel}: its grading test is tests/test_grading_{folder.replace('-', '_')}.py")
        for c in cells(rel):
            gid = grade_id(c)
            if gid:
                test = nbgrader(c).get("grade", False)
                pattern = rf"lab{number}-test-[a-z0-9-]+" if test else rf"lab{number}-(?!test-)[a-z0-9-]+"
                assert re.fullmatch(pattern, gid), f"{rel}: grade id {gid!r} must match {pattern}"


def test_student_labs_carry_no_ci_machinery():
    """A released lab holds nothing that only CI reads: no nbval markers, no CI-only branches."""
    for nb in sorted((ROOT / "labs").glob("*/*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            text = source(c)
            assert "NBVAL" not in text, f"{nb.relative_to(ROOT)}: nbval marker in a student lab"
            assert not re.search(r"environ(?:\.get)?\(?\[?[\"']CI[\"']", text), (
                f"{nb.relative_to(ROOT)}: CI-only code in a student lab")


def test_grade_ids_are_unique_and_slow_cells_exist():
    ids = []
    for rel in NOTEBOOKS:
        if rel.startswith("solutions/"):
            for c in cells(rel):
                nbg = nbgrader(c)
                if nbg:
                    ids.append(nbg["grade_id"])
                    if nbg.get("grade"):
                        assert nbg.get("points", 0) > 0, f"{rel}: test {nbg['grade_id']} has no points"
    assert len(ids) == len(set(ids)), "grade ids must be unique across labs"
    missing = set(manifest.slow_cells()) - set(ids)
    assert not missing, f"course.yml's slow_cells name unknown grade ids: {missing}"


def test_every_lab_has_a_grading_test():
    """make test runs the chapters under nbval; each lab runs whole in its grading test instead."""
    graded = {m.group(1) for p in (ROOT / "tests").glob("test_grading*.py")
              if (m := re.search(r'^LAB = "([^"]+)"', p.read_text(), re.M))}
    labs = {rel.split("/")[1] for rel in NOTEBOOKS if rel.startswith("solutions/")}
    assert labs <= graded, f"labs without a grading test: {sorted(labs - graded)}"


def test_labs_are_generated_from_solutions():
    done = subprocess.run([sys.executable, "-m", "dpc_instructor.labs", "check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
