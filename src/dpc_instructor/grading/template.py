"""A run's start: the lab in the course gradebook, and a template course folder every job copies
(prepare), with the reference's records (reference) and the notebook whose hidden cases are made
outside the kernels (cases).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from dpc_instructor import gradebook
from dpc_instructor.grading.cases import cases_cell
from dpc_instructor.grading.reference import reference
from dpc_instructor.grading.run import BIN, Run
from dpc_runtime import manifest, notebook, sandbox


def set_parameters(path: Path, values: dict[str, object]) -> None:
    """Give the notebook at path these parameter values: `NAME = value` lines added to its
    `parameters` cell (as papermill injects them; a locked cell, so nbgrader restores it)."""
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    lines = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    cell["source"] = notebook.source(cell).rstrip("\n") + "\n# the grader's --parameters\n" + lines
    path.write_text(json.dumps(nb, indent=1))


def prepare(course: gradebook.Course, lab: str, names: list[str], cell_timeout: int | None,
            notebook_timeout: float, sandboxed: bool, seed: int, limits: sandbox.Limits = sandbox.Limits(),
            parameters: str = "defaults") -> Run:
    """The lab in the course gradebook, and a template course folder every job copies (its
    notebooks run with `parameters`: their defaults, or course.yml's `ci` values), with the
    reference's records the judge compares every student's with (reference), its hidden tests'
    cases drawn with `seed`."""
    course.add_lab(lab)
    template = course.jobs / f"template-{lab}-{uuid.uuid4().hex[:8]}"
    gradebook.nbgrader_course(template, lab)
    if parameters == "ci":
        for name in names:
            values = manifest.notebooks().get(f"solutions/{lab}/{name}.ipynb", {}).get("ci") or {}
            set_parameters(template / "source" / lab / f"{name}.ipynb", values)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    code, out = gradebook.nbgrader(["generate_assignment", lab, "--force"], template, env, 600)
    if code != 0:
        raise SystemExit(f"grade: nbgrader generate_assignment failed:\n{out}")
    release = {n: json.loads((template / "release" / lab / f"{n}.ipynb").read_text()) for n in names}
    shutil.rmtree(template / "release")
    outside = [n for n in names if cases_cell(json.loads((template / "source" / lab / f"{n}.ipynb").read_text()))
               is not None]
    if len(outside) > 1:
        raise SystemExit(f"grade: {lab}: only one notebook may define hidden_cases (here: {', '.join(outside)})")
    run = Run(course, lab, template, release, cell_timeout, notebook_timeout, limits, sandboxed, seed,
              outside[0] if outside else None)
    reference(run)
    return run
