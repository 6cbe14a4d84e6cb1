"""Reading a profiler's timeline: named ranges of a torch.profiler run, busy fraction per time window."""
from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .quiet import harmless

# Kineto (torch.profiler's engine) announces every start and stop on the process's stderr.
KINETO_NOTICES = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")

__all__ = ["KINETO_NOTICES", "busy_per_window", "named_ranges", "quiet_stderr"]


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """Run a block with the process's stderr caught; show again every line but the known notices."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
            kept = [ln for ln in text.splitlines()
                    if ln.strip() and not KINETO_NOTICES.search(ln) and not harmless(ln)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def named_ranges(events: Iterable[Any], names: Sequence[str]) -> list[tuple[str, float, float]]:
    """(name, start s, end s) of the profiler events with one of `names`, sorted, time 0 = the first."""
    found = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.name in names)
    if not found:
        return []
    t0 = found[0][0]
    return [(name, (start - t0) / 1e6, (end - t0) / 1e6) for start, end, name in found]


def busy_per_window(ranges: Sequence[tuple[str, float, float]], busy: str,
                    window_s: float) -> tuple[list[float], list[float]]:
    """Window start times and the fraction of each window covered by ranges named `busy`."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    if not ranges:
        return [], []
    end = max(r[2] for r in ranges)
    n = max(1, int(-(-end // window_s)))
    starts = [k * window_s for k in range(n)]
    covered = [0.0] * n
    for name, a, b in ranges:
        if name != busy:
            continue
        for k in range(int(a // window_s), min(n, int(-(-b // window_s)))):
            lo, hi = max(a, starts[k]), min(b, starts[k] + window_s)
            covered[k] += max(0.0, hi - lo)
    return starts, [min(1.0, c / window_s) for c in covered]
