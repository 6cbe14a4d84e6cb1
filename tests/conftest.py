"""Order of the suite's files: the long ones first, so that the two workers of `make test`
(pytest-xdist, --dist loadfile, which hands out files in collection order) end together instead
of one grading a lab alone at the end. Within a file, the order is the file's own.

Also: the grading runs of one session share the reference solutions' records (DPC_REFERENCES,
dpc_instructor.grade.reference): a lab graded by several files is run as its reference once."""
from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

# Files that take minutes (each grades a lab in several notebooks, or runs a chapter), longest first.
# (measured with --durations on a 2-core machine: lab 6 about 200 s, lab 7 170, lab 1 150, ...);
# the classroom first of all: it builds the class environment (make class-env) that test_release uses.
FIRST = ("tests/test_classroom.py",) + tuple(f"tests/test_grading_{name}.py" for name in (
    "06_horovod", "07_ddp_syncbn", "01_input_pipeline", "09_zero", "05_ring_allreduce",
    "02_mirrored_strategy", "class", "intake", "04_manual_towers")) + (
    "tests/test_grading_", "build/nbtest/", "tests/test_release.py")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: files keep their own order inside each rank


def pytest_configure(config: pytest.Config) -> None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex  # the same in every xdist worker
    os.environ.setdefault("DPC_REFERENCES", str(Path(tempfile.gettempdir()) / f"dpc-references-{run[:12]}"))
