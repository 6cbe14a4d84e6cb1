"""How long a run's threads ran and how long they waited for a CPU, over time: the grader's evidence of
whether a cell that ran past its time limit was slow by itself or starved by a busy machine
(dpc_instructor.grading.failures.busy_timeout; sampled by dpc_runtime.sandbox.run_limited).

Linux counts, for every thread, the time it ran on a CPU and the time it was ready to run but waited
for one (/proc/PID/task/TID/schedstat: run and run-delay nanoseconds). A sleeping cell does neither;
a computing cell on a calm machine mostly runs; the same cell beside other work waits. Sampled four times
a second over the whole process tree, the sums say, for any window of the run, how much CPU the run got
and how much it was denied.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

SAMPLE_S = 0.25  # seconds between samples (the sandbox's disk watcher's pace too)


def thread_times(pid: int) -> dict[int, tuple[float, float]]:
    """Seconds each thread of process pid ran, and waited ready to run, since it started (by thread id;
    empty when the process is gone or the kernel keeps no schedstat)."""
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ran, waited = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        found[int(tid)] = (int(ran) / 1e9, int(waited) / 1e9)
    return found


@dataclass
class CpuWaits:
    """Running sums of the run and wait time of every thread under one process (root), sampled."""

    root: int
    series: list[tuple[float, float, float]] = field(default_factory=list)  # (time.time(), ran, waited)
    _last: dict[int, tuple[float, float]] = field(default_factory=dict)

    def sample(self) -> None:
        """Add what every thread of the tree ran and waited since the last sample (a thread seen for
        the first time: since it started)."""
        try:
            pids = [self.root, *(p.pid for p in psutil.Process(self.root).children(recursive=True))]
        except psutil.Error:
            pids = []
        ran, waited = self.series[-1][1:] if self.series else (0.0, 0.0)
        for pid in pids:
            for tid, (r, w) in thread_times(pid).items():
                r0, w0 = self._last.get(tid, (0.0, 0.0))
                ran, waited = ran + max(0.0, r - r0), waited + max(0.0, w - w0)
                self._last[tid] = (r, w)
        self.series.append((time.time(), ran, waited))

    def between(self, start: float, end: float) -> tuple[float, float]:
        """Seconds the tree's threads ran and waited for a CPU between two times (time.time()), from
        the samples around them."""
        def at(t: float) -> tuple[float, float]:
            before = [s for s in self.series if s[0] <= t]
            return before[-1][1:] if before else (0.0, 0.0)

        (r0, w0), (r1, w1) = at(start), at(end + SAMPLE_S)
        return r1 - r0, w1 - w0
