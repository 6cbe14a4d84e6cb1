"""Reading a profiler's timeline (chapter 1): named ranges of a torch.profiler run, busy fraction per window.

(The profiler's own start/stop notices on stderr are hidden by `helpers.quiet_stderr`.)
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["busy_per_window", "named_ranges"]


def named_ranges(events: Iterable[Any], names: Sequence[str]) -> list[tuple[str, float, float]]:
    """(name, start s, end s) of the profiler events with one of `names`, sorted, time 0 = the first (chapter 1)."""
    found = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.name in names)
    if not found:
        return []
    t0 = found[0][0]
    return [(name, (start - t0) / 1e6, (end - t0) / 1e6) for start, end, name in found]


def busy_per_window(ranges: Sequence[tuple[str, float, float]], busy: str,
                    window_s: float) -> tuple[list[float], list[float]]:
    """Window start times and the fraction of each window covered by ranges named `busy` (chapter 1)."""
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
