"""Order of the suite's files: the long ones first, so that the two workers of `make test`
(pytest-xdist, --dist loadfile --no-loadscope-reorder, which hands out files in collection order)
end together instead of one grading a lab alone at the end. Within a file, the order is the file's
own. (Without --no-loadscope-reorder xdist sorts files by their number of tests, most first: the
classroom, one test of 5 minutes, then started 18 minutes into a 20-minute run.)

Also: the grading runs of one session share the reference solutions' records (DPC_REFERENCES,
dpc_instructor.grading.reference.reference) and the seed of the hidden tests' cases (DPC_GRADE_SEED): a lab
graded by several files is run as its reference once."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

# Files that take minutes (each grades a lab in several notebooks, or runs a chapter), longest first
# (seconds each in a make test on a 2-core machine, 2026-11-25: classroom 328, lab 7 238, lab 1 205,
# test_launch 149, lab 6 146, lab 9 146, lab 5 134, class grading 122, intake 69, lab 2 67, release
# 66, chapters 7/10/6/8 50-66 each, cluster 55, lab 4 51; lab 10, added later, 313 alone; grading over
# SLURM, later still, 680 at load 10); the
# classroom first of all: it builds the class environment (make class-env) that test_release uses. The
# self-learner's install (its own .venv from PyPI, torch from a local mirror, Horovod's wheel seeded from
# this run's build: 220 s idle, a third of it waiting on the network) after the longest grading files;
# lab 1's file grew by its run beside four hogs on one core (2-5 minutes).
FIRST = ("tests/test_classroom.py",) + tuple(f"tests/test_grading_{name}.py" for name in (
    "10_failure_diagnosis", "01_input_pipeline", "07_ddp_syncbn")) + ("tests/test_student_install.py",) + tuple(
    f"tests/test_grading_{name}.py" for name in ("06_horovod", "09_zero", "05_ring_allreduce", "class", "spread")) + (
    "tests/test_launch.py",) + tuple(f"tests/test_grading_{name}.py" for name in (
    "intake", "02_mirrored_strategy", "04_manual_towers")) + (
    "tests/test_grading_", "tests/test_release.py", "build/nbtest/", "tests/test_cluster.py",
    "tests/test_multinode.py")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    return next((i for i, prefix in enumerate(FIRST) if path.startswith(prefix)), len(FIRST))


# The suite's tiers (tests/tiers.py) as a plugin of their own: its report hooks see every test, the
# chapters' copies under build/nbtest/ too (a conftest's runtest hooks see only the tests below it).
pytest_plugins = ["tiers"]


@pytest.hookimpl(trylast=True)  # after the tiers' selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: files keep their own order inside each rank


OWN_REFERENCES = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex  # the same in every xdist worker
    if "DPC_REFERENCES" not in os.environ:  # this session's own: removed at its end (pytest_unconfigure)
        os.environ["DPC_REFERENCES"] = str(Path(tempfile.gettempdir()) / f"dpc-references-{run[:12]}")
        config.stash[OWN_REFERENCES] = Path(os.environ["DPC_REFERENCES"])
    # one seed of the hidden tests for the whole session (else each grading run drew its own and
    # could not share a reference): new in every session, printed by every grading run
    os.environ.setdefault("DPC_GRADE_SEED", str(int(hashlib.sha256(run.encode()).hexdigest()[:7], 16)))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's reference records go with it (the controller's, once every worker has ended)."""
    own = config.stash.get(OWN_REFERENCES, None)
    if own is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(own, ignore_errors=True)
