"""Prepare the chapter notebooks for the notebook tests.

For each notebook of course/ listed in course.yml, papermill (--prepare-only) injects the
CI parameters after the cell tagged `parameters` and writes a copy under build/nbtest/, keeping the
recorded outputs; `pytest --nbval-lax build/nbtest` then executes the copies and compares the
outputs of the cells tagged `nbval-check-output` (cell metadata) with the recorded ones.

The labs' solution notebooks are not run here: each lab's grading test (tests/test_grading_*.py)
grades a correct submission, which executes every cell of the lab (hidden tests included) with
the parameters the grader uses. Running them here as well ran every lab twice.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import papermill as pm

from dpc_runtime import manifest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "nbtest"


def listed() -> dict[str, dict]:
    """The notebooks of course.yml with their settings."""
    return manifest.notebooks()


def prepare(out: Path = OUT) -> list[Path]:
    """Write parameterised copies of every listed notebook under out; return their paths."""
    shutil.rmtree(out, ignore_errors=True)
    written = []
    for rel, settings in listed().items():
        if not rel.startswith("course/"):
            continue  # labs: executed whole by their grading tests
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        pm.execute_notebook(str(ROOT / rel), str(dst), parameters=settings.get("ci", {}),
                            prepare_only=True, log_output=False, progress_bar=False)
        written.append(dst)
    return written


if __name__ == "__main__":
    for path in prepare():
        print(f"prepared {path.relative_to(ROOT)}")
    sys.exit(0)
