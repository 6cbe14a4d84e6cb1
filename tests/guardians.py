"""Shared by the tests that kill a run outright on purpose (test_reaper, test_cluster, test_classroom): the
guardian of such a run keeps its folder (its plan and a log of what it removed) for whoever looks after
a real crash; a test reads that log, checks it, and removes the folder, so that the suite leaves no
dpc-guard-* behind (issue 46)."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path


def take_log(variable: str, value: str, timeout: float = 120) -> str:
    """The log of the guardian that cleaned up the run marked variable=value, once it is written
    (bounded wait); its folder is removed. '' when no such guardian wrote one in time."""
    end = time.monotonic() + timeout
    while True:
        for plan in Path(tempfile.gettempdir()).glob("dpc-guard-*/plan.json"):
            try:
                marker = json.loads(plan.read_text()).get("marker")
            except (OSError, ValueError):
                continue  # being rewritten, or gone
            log = plan.with_name("guard.log")
            if marker == [variable, value] and log.exists():
                text = log.read_text()
                shutil.rmtree(plan.parent, ignore_errors=True)
                return text
        if time.monotonic() > end:
            return ""
        time.sleep(0.2)  # until the guardian has written its log (bounded)
