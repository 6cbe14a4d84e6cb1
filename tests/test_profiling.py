"""helpers.profiling: named ranges of a real torch.profiler run, busy fraction per window; its notices hidden."""
from __future__ import annotations

import os
import time

import pytest
import torch

import helpers

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_named_ranges_of_a_real_profile():
    with helpers.quiet_stderr():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                with torch.profiler.record_function("wait"):
                    time.sleep(0.02)
                with torch.profiler.record_function("work"):
                    torch.ones(64, 64) @ torch.ones(64, 64)
    ranges = helpers.named_ranges(prof.events(), ["wait", "work"])
    assert [r[0] for r in ranges] == ["wait", "work", "wait", "work"]
    assert ranges[0][1] == 0.0
    assert all(a <= b for _, a, b in ranges)
    assert all(ranges[k][2] <= ranges[k + 1][1] + 1e-6 for k in range(3))
    assert ranges[0][2] - ranges[0][1] >= 0.015  # the sleep


def test_busy_per_window():
    ranges = [("wait", 0.0, 0.1), ("work", 0.1, 0.15), ("wait", 0.15, 0.2), ("work", 0.2, 0.3)]
    starts, busy = helpers.busy_per_window(ranges, "work", 0.05)
    assert starts == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.25])
    assert busy == pytest.approx([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    starts, busy = helpers.busy_per_window(ranges, "work", 0.1)
    assert busy == pytest.approx([0.0, 0.5, 1.0])
    assert helpers.busy_per_window([], "work", 0.1) == ([], [])
    with pytest.raises(ValueError):
        helpers.busy_per_window(ranges, "work", 0.0)


def test_quiet_stderr_keeps_real_lines(capsys):
    line = "USDT:2026-11-22 18:11:59 18316:18316 SyncActivityProfilerHandler.cpp:52] profiler_start"
    assert helpers.harmless(line)
    with helpers.quiet_stderr():
        os.write(2, (line + "\nsomething real\n").encode())
    err = capsys.readouterr().err
    assert "something real" in err and "USDT" not in err
