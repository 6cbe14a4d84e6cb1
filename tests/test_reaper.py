"""dpc_runtime.reaper (issue 39): a guardian removes what a run made when the run dies without cleaning up,
and leaves everything alone when the run dismissed it."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import guardians
import pytest

from dpc_runtime.reaper import marked

pytestmark = pytest.mark.gate  # tests/tiers.py

OWNER = """
import os, subprocess, sys, time
from dpc_runtime.reaper import Guard
tag, folder, dismiss = sys.argv[1], sys.argv[2], sys.argv[3] == "dismiss"
guard = Guard(marker=("DPC_TEST_RUN", tag), folders=[folder])
subprocess.Popen(["sleep", "600"], env={**os.environ, "DPC_TEST_RUN": tag}, start_new_session=True)
if dismiss:
    guard.dismiss()
print("up", guard.proc.returncode, flush=True)  # the guardian's exit status once dismissed, else None
time.sleep(600)
"""


def _owner(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], str, Path, str]:
    tag, folder = secrets.token_hex(4), tmp_path / "made"
    folder.mkdir()
    p = subprocess.Popen([sys.executable, "-c", OWNER, tag, str(folder), how], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert p.stdout is not None
    said = p.stdout.readline().split()  # the run is up: the event
    assert said[0] == "up", said
    end = time.monotonic() + 60
    while not marked("DPC_TEST_RUN", tag) and time.monotonic() < end:
        time.sleep(0.05)  # its daemon has exec'd with the marker (bounded)
    return p, tag, folder, said[1]


def _gone(tag: str, folder: Path) -> bool:
    return not marked("DPC_TEST_RUN", tag) and not folder.exists()


def test_a_run_killed_outright_is_cleaned_by_its_guardian(tmp_path):
    p, tag, folder, guardian = _owner(tmp_path, "keep")
    assert guardian == "None"  # still watching
    assert marked("DPC_TEST_RUN", tag) and folder.exists()
    p.send_signal(signal.SIGKILL)  # no finally, no handler
    p.wait()
    end = time.monotonic() + 60
    while not _gone(tag, folder) and time.monotonic() < end:
        time.sleep(0.1)  # until the guardian has done it (bounded)
    assert marked("DPC_TEST_RUN", tag) == [] and not folder.exists()
    log = guardians.take_log("DPC_TEST_RUN", tag)
    assert "the run ended without cleaning up" in log and f"removed {folder}" in log, log


def test_a_dismissed_guardian_touches_nothing(tmp_path):
    p, tag, folder, guardian = _owner(tmp_path, "dismiss")
    assert guardian == "0"  # it left on being dismissed, before the run is killed
    p.send_signal(signal.SIGKILL)
    p.wait()
    left = marked("DPC_TEST_RUN", tag)
    try:
        assert left and folder.exists()  # the guardian left when dismissed: the run's things stay
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def test_a_run_is_known_alive_by_its_guardian(tmp_path):
    """guarded(): a run whose marker is set once it runs (not in its /proc environ, as a class run's) is alive
    exactly as long as its guardian: a second run's start then leaves it alone (the class on SLURM was torn down
    by a class test started beside it before this)."""
    from dpc_runtime.reaper import Guard, guarded

    tag = f"alive-{os.getpid()}"
    guard = Guard(marker=("DPC_TEST_RUN", tag), folders=[str(tmp_path / "nothing")])
    try:
        assert guarded("DPC_TEST_RUN", tag)
        assert not guarded("DPC_TEST_RUN", tag + "-other")
    finally:
        guard.dismiss()  # the guardian leaves (and waits for it): the run is over
    assert not guarded("DPC_TEST_RUN", tag)
