"""Time things: a timer, throughput, per-epoch clocks, speed-up tables and a speed-up plot (chapters 1, 2, 8)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Timer:
    """Record several running times; use `with timer:` or start()/stop() (chapter 1)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start: float | None = None

    def start(self) -> None:
        """Start the clock."""
        self._start = time.perf_counter()

    def stop(self) -> float:
        """Stop the clock, record and return the elapsed seconds."""
        if self._start is None:
            raise RuntimeError("Timer.stop() called before start()")
        self.times.append(time.perf_counter() - self._start)
        self._start = None
        return self.times[-1]

    def __enter__(self) -> Timer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sum(self) -> float:
        """Total of the recorded times."""
        return sum(self.times)

    def avg(self) -> float:
        """Mean of the recorded times."""
        return self.sum() / len(self.times)

    def median(self) -> float:
        """Median of the recorded times (robust on a shared, noisy machine)."""
        return statistics.median(self.times)


def throughput(samples: int, seconds: float) -> float:
    """Samples per second (chapter 1)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return samples / seconds


def measure(fn: Callable[[], Any], *, repeat: int = 3, warmup: int = 1) -> list[float]:
    """Run fn warmup times untimed, then repeat times timed; return the times in seconds (chapter 1)."""
    for _ in range(warmup):
        fn()
    timer = Timer()
    for _ in range(repeat):
        with timer:
            fn()
    return timer.times


class EpochClock:
    """Per-epoch timing for a torch (or any Python) loop: `for epoch in clock.epochs(n): ...` (chapter 1)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def epochs(self, n: int) -> Iterator[int]:
        """Yield 0..n-1 and record how long the loop body took for each."""
        for epoch in range(n):
            start = time.perf_counter()
            yield epoch
            self.times.append(time.perf_counter() - start)


def keras_epoch_timer() -> Any:
    """A Keras callback whose .times lists each epoch's seconds (works for Keras 3 and tf-keras) (chapter 1)."""
    import tensorflow as tf

    class EpochTimer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []
            self._start = 0.0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.times.append(time.perf_counter() - self._start)

    return EpochTimer()


@dataclass(frozen=True)
class ScalingRow:
    """One line of a scaling table: devices, throughput, speed-up over the baseline, efficiency (chapter 1)."""

    devices: int
    samples_per_s: float
    speedup: float
    efficiency: float


def scaling_table(throughputs: Mapping[int, float]) -> list[ScalingRow]:
    """Speed-up and efficiency (speed-up / devices) of each device count over the smallest one (chapter 8)."""
    if not throughputs:
        raise ValueError("scaling_table needs at least one measurement")
    base_n = min(throughputs)
    base = throughputs[base_n] / base_n  # per-device throughput of the baseline
    rows = []
    for n in sorted(throughputs):
        speedup = throughputs[n] / throughputs[base_n]
        rows.append(ScalingRow(n, throughputs[n], speedup, throughputs[n] / (base * n)))
    return rows


def speedup_table(seconds: Mapping[str, float], baseline: str) -> list[tuple[str, float, float]]:
    """(label, seconds, speed-up over baseline) for each measurement, baseline first (chapter 1)."""
    if baseline not in seconds:
        raise KeyError(f"baseline {baseline!r} is not among the measurements {list(seconds)}")
    order = [baseline] + [k for k in seconds if k != baseline]
    return [(k, seconds[k], seconds[baseline] / seconds[k]) for k in order]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain-text table with right-aligned numbers (floats to 2 decimals) (chapter 1)."""
    cells = [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def plot_speedup(devices: Sequence[int], speedups: Sequence[float], *, label: str = "measured",
                 ax: Any = None, title: str = "Speed-up vs number of devices") -> Any:
    """Plot measured speed-up against the ideal (linear) line; returns the matplotlib Axes (chapter 2)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.2))
    top = max(devices)
    ax.plot([1, top], [1, top], "--", color="grey", label="ideal (linear)")
    ax.plot(list(devices), list(speedups), "o-", label=label)
    ax.set_xlabel("devices")
    ax.set_ylabel("speed-up")
    ax.set_title(title)
    ax.legend()
    return ax


def plot_breakdown(labels: Sequence[str], parts: Mapping[str, Sequence[float]], *,
                   ax: Any = None, unit: str = "s per epoch", title: str = "") -> Any:
    """Stacked horizontal bars: for each label, how the time splits into parts (e.g. wait / compute) (chapter 1)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * len(labels)))
    left = [0.0] * len(labels)
    for name, values in parts.items():
        ax.barh(list(labels), list(values), left=left, label=name)
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.legend(loc="lower right")
    return ax
