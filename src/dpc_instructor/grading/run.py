"""What every job of one grading run shares (Run), and how many jobs run at once (default_jobs).

A run grades one lab: a template course folder every job copies (template.prepare), the reference's
records the judge compares every student with (reference), one seed of the hidden tests' cases
(dpc_runtime.judge.rng), the limits of every job (dpc_runtime.sandbox.Limits).
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from dpc_instructor import gradebook
from dpc_runtime import manifest, sandbox

BIN = Path(sys.executable).parent  # nbgrader, and the Python every job runs
REFERENCE = "reference-records.json"  # in the template: the judge's reference (reference.reference)


@dataclass
class Run:
    """What every job of one grading run shares."""

    course: gradebook.Course
    lab: str
    template: Path
    release: dict[str, dict]
    cell_timeout: int | None
    notebook_timeout: float
    limits: sandbox.Limits
    sandboxed: bool
    seed: int  # of the hidden tests' cases (dpc_runtime.judge.seed): the reference's and every student's
    cases: str | None = None  # the notebook whose hidden cases are made outside the kernels (cases.make_cases)
    lock: threading.Lock = field(default_factory=threading.Lock)


def default_jobs(lab: str, students: int) -> int:
    """As many students at once as the machine has cores for the lab's ranks (at least 1)."""
    return max(1, min(students, (os.cpu_count() or 1) // manifest.lab_ranks(lab)))
