"""Time things: a timer, throughput, per-epoch clocks, interleaved repeats, speed-up tables and a speed-up plot
(chapters 1, 2, 8), an α-β fit of all-reduce times (chapters 5, 6), and whether the machine is calm enough to
time a comparison at all (chapters 1, 2, 5, 6, 8, 11)."""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .devices import cpu_cores

_K = TypeVar("_K")


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


def measure_interleaved(variants: Mapping[_K, Callable[[], Any]], *, repeat: int = 3,
                        warmup: int = 1) -> dict[_K, list[float]]:
    """Time variants in rounds, each round's order the reverse of the last, after warmup rounds (chapters 1, 2).

    Returns {name: seconds of each round}. Interleaved, a burst of other work hits every variant alike.
    A variant that returns a float reports its own time (an epoch timer's); any other is timed around
    the call."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[_K, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            got = variants[name]()
            took = time.perf_counter() - start
            times[name].append(float(got) if isinstance(got, float) else took)
    return times


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float], n: int) -> tuple[float, float]:
    """α (seconds per message) and β (seconds per byte) of ring all-reduce times on n ranks (chapters 5, 6).

    The model T = 2(n-1)·α + 2(n-1)/n·S·β, fitted by least squares over the sizes S; neither below 0."""
    if n < 2 or len(nbytes) != len(seconds) or not nbytes:
        raise ValueError(f"fit_alpha_beta needs n >= 2 and one time per size, got n={n}, "
                         f"{len(nbytes)} sizes, {len(seconds)} times")
    if len(set(nbytes)) < 2:  # one size: all of it is bandwidth
        slope, intercept = statistics.mean(seconds) / statistics.mean(nbytes), 0.0
    else:
        slope, intercept = statistics.linear_regression(list(map(float, nbytes)), list(map(float, seconds)))
    return max(intercept, 0.0) / (2 * (n - 1)), max(slope, 0.0) / (2 * (n - 1) / n)


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


# --- Is the machine calm enough to time a comparison? (chapters 1, 2, 5, 6, 8, 11) --------------
#
# A comparison of two timings (overlap against after, 2 ranks against 1) holds only if nothing else
# took the cores in between. On a shared node the kernel may have fewer cores than it has ranks, and
# classmates' jobs come and go. The thresholds below say when a difference of the size the chapters
# compare (tens of per cent) can no longer be told from what the machine did.

CALIBRATION_WORK = 300_000  # iterations of the fixed pure-Python loop: about 15 ms on a laptop core
# The loop ran 2x slower than its best: half our core went to someone else. Not lower: on the course's
# 2-core cloud VM, idle, the same warm loop took 12 ms for minutes and 20 ms for others (the host's
# clock and scheduling), so 1.5 called an idle machine busy; a smaller share of our core taken by
# others' threads shows in the load figures below.
CALIBRATION_LIMIT = 2.0
CALIBRATION_WARMUP = 5  # untimed runs first: a core that idled (the kernel waiting for its ranks) ran the loop 1.5x slower for its first few runs
LOAD_LIMIT = 1.25  # (other runnable threads + our ranks) per CPU: past 1.25, every thread waits a fifth of the time
STEAL_LIMIT = 0.05  # share of the CPU time our VM wanted that the hypervisor gave away: past 5 %, our clock runs, we do not
SPREAD_LIMIT = 0.25  # the repeats' spread (interquartile range / median): past 25 %, differences of that size are noise


def relative_spread(values: Sequence[float]) -> float:
    """Interquartile range over the median of repeated timings, 0.0 for fewer than two (chapters 1, 2, 5, 6, 8, 11)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(values)


def cpu_quota(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores the cgroup CPU quota of this process allows (v2 cpu.max, v1 cfs quota), None if unlimited (chapters 8, 11).

    The quota of a cgroup also binds every cgroup inside it, so the smallest one from this process's
    cgroup up to the root counts."""
    quotas: list[float] = []
    table = proc / "self" / "cgroup"
    for entry in table.read_text().splitlines() if table.is_file() else []:  # none on macOS
        _, controllers, path = entry.split(":", 2)
        files: tuple[str, ...]
        if controllers == "":  # v2: the unified hierarchy
            places, files = [cgroup_root], ("cpu.max",)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            places, files = [cgroup_root / controllers, cgroup_root / "cpu"], ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for top in dict.fromkeys(places):
            for depth in range(len(parts), -1, -1):  # this cgroup, then its parents
                folder = top.joinpath(*parts[:depth])
                if not all((folder / f).is_file() for f in files):
                    continue
                if files == ("cpu.max",):
                    quota, period = (folder / "cpu.max").read_text().split()[:2]
                else:
                    quota, period = ((folder / f).read_text().strip() for f in files)
                if quota not in ("max", "-1"):
                    quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def usable_cores(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup"),
                 affinity: int | None = None) -> float:
    """Cores this process may use: the CPUs it may run on (affinity), capped by its cgroup's quota (chapters 1, 2, 5, 6, 8, 11)."""
    if affinity is None:
        affinity = cpu_cores()
    quota = cpu_quota(proc, cgroup_root)
    return float(affinity) if quota is None else min(float(affinity), quota)


def _loadavg(proc: Path) -> tuple[float, int]:
    """The 1-minute load average and the threads runnable right now (this reader included; 1 where unknown)."""
    if not (proc / "loadavg").is_file():  # macOS: the load, but no count of runnable threads
        return (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0), 1
    fields = (proc / "loadavg").read_text().split()
    return float(fields[0]), int(fields[3].split("/")[0])


def _stat(proc: Path) -> tuple[int, float, float]:
    """The machine's CPUs, and its busy and stolen CPU-seconds since boot, from /proc/stat (zeros where absent)."""
    if not (proc / "stat").is_file():
        return os.cpu_count() or 1, 0.0, 0.0
    lines = (proc / "stat").read_text().splitlines()
    cpus = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in lines[0].split()[1:9])
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return cpus, (user + nice + system + irq + softirq) / tick, steal / tick


def _own_cpu_seconds() -> float:
    """CPU-seconds of this process and of its children that ended (the ranks it launched)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _time_loop(work: int = CALIBRATION_WORK) -> float:
    """Seconds a fixed pure-Python loop of work iterations takes."""
    start = time.perf_counter()
    total = 0
    for i in range(work):
        total += i * i % 7
    return time.perf_counter() - start


class Calibration:
    """A fixed pure-Python loop, timed; it remembers its best time in this process (chapters 8, 11)."""

    def __init__(self, loop: Callable[[], float] = _time_loop, warmup: int = CALIBRATION_WARMUP) -> None:
        self.loop, self.warmup = loop, warmup
        self.best = math.inf

    def run(self, repeat: int = 5, between: Callable[[], None] | None = None) -> float:
        """Run the loop `warmup` times untimed, then time it repeat times (calling between() before
        each); return the median, keep the best."""
        for _ in range(self.warmup):
            self.loop()
        times = []
        for _ in range(repeat):
            if between is not None:
                between()
            times.append(self.loop())
        self.best = min(self.best, *times)
        return statistics.median(times)


CALIBRATION = Calibration()  # the kernel's own: its best time is the best this process has seen


def _cores(n: float) -> str:
    return f"{n:g} core" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class MachineCheck:
    """What the machine did around a measurement, and whether a timing comparison can be trusted (chapters 1, 2, 5, 6, 8, 11).

    cores: cores this kernel may use (affinity and cgroup quota); cpus: the machine's CPUs; load: the
    1-minute load average (shown, not judged: it lags a minute and counts this notebook's own ranks);
    running: other threads runnable right now (median of samples, the worst of before and after);
    others: CPUs other processes kept busy during the measurement on average (the machine's busy time
    less this kernel's and its ranks'); the larger of running and others is what other work wants;
    steal: share of the CPU time the machine wanted that its hypervisor gave to other VMs;
    calibration: the fixed loop's time over its best in this process; need: cores the measurement
    wants to itself. It judges the machine only: the repeats' spread is the result's noise, which the
    verdicts (compare_verdict, gap_verdict, model_verdict, sweep_verdict) judge."""

    cores: float
    cpus: int
    load: float
    running: float
    others: float
    steal: float
    calibration: float
    need: float

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why the machine was too busy for a comparison (its cores, other work, steal, the fixed loop); empty when calm."""
        found = []
        if self.cores < self.need:
            found.append(f"{_cores(self.cores)} for {self.need:g} ranks")
        busy = max(self.running, self.others)
        if (busy + self.need) / self.cpus > LOAD_LIMIT:
            found.append(f"other work wanted {busy:.1f} of the {self.cpus} CPUs")
        if self.steal > STEAL_LIMIT:
            found.append(f"the hypervisor stole {self.steal:.0%} of the CPU time")
        if self.calibration > CALIBRATION_LIMIT:
            found.append(f"a fixed loop ran {self.calibration:.1f}x slower than its best")
        return tuple(found)

    @property
    def calm(self) -> bool:
        """True when no figure says the machine was too busy."""
        return not self.reasons

    def line(self, what: str, more: str = "more repeats") -> str:
        """One line for the student: the figures, then calm, or too busy with why and what to do."""
        figures = (f"machine: {_cores(self.cores)} for this kernel, load {self.load:.1f}, "
                   f"others want {max(self.running, self.others):.1f} of {self.cpus} CPUs, "
                   + (f"steal {self.steal:.0%}, " if self.steal >= 0.01 else "")
                   + f"calibration {self.calibration:.1f}x its best")
        if self.calm:
            return f"{figures}: calm enough for {what}"
        return (f"{figures}: too busy for {what} ({'; '.join(self.reasons)}); rerun with {more} "
                "when the machine is calmer, or read the model's prediction")


class MachineWatch:
    """Watch the machine around a measurement: `watch = MachineWatch(need=2).start()`, measure, `watch.stop()` (chapters 1, 2, 5, 6, 8, 11).

    Also `with MachineWatch(need=2) as watch: ...`, then `watch.result`. start() and stop() each time
    a fixed loop a few times and sample the load; stop() returns a MachineCheck."""

    def __init__(self, need: float = 1, *, proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup"),
                 affinity: int | None = None, calibration: Calibration | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 own_cpu: Callable[[], float] = _own_cpu_seconds) -> None:
        self.need, self.proc, self.cgroup_root, self.affinity = need, proc, cgroup_root, affinity
        self.calibration = CALIBRATION if calibration is None else calibration
        self.clock, self.own_cpu = clock, own_cpu
        self.result: MachineCheck | None = None
        self._before: tuple[float, float, float, float, float, float] | None = None

    def _sample(self) -> tuple[float, float]:
        """The calibration's median and the median number of other runnable threads, sampled between its runs."""
        running: list[int] = []
        loop = self.calibration.run(between=lambda: running.append(_loadavg(self.proc)[1] - 1))
        return loop, statistics.median(running)

    def start(self) -> MachineWatch:
        """Read the machine's counters and calibrate, before the measurement; returns the watch."""
        loop, running = self._sample()
        _, busy, steal = _stat(self.proc)
        self._before = (loop, running, self.clock(), busy, steal, self.own_cpu())
        return self

    def stop(self) -> MachineCheck:
        """Read the counters and calibrate again, after the measurement; the verdict over the whole interval."""
        if self._before is None:
            raise RuntimeError("MachineWatch.stop() called before start()")
        loop0, running0, wall0, busy0, steal0, own0 = self._before
        loop1, running1 = self._sample()
        cpus, busy1, steal1 = _stat(self.proc)
        wall, own = max(self.clock() - wall0, 1e-9), self.own_cpu() - own0
        spent = (busy1 - busy0) + (steal1 - steal0)
        self.result = MachineCheck(
            cores=usable_cores(self.proc, self.cgroup_root, self.affinity), cpus=max(cpus, 1),
            load=_loadavg(self.proc)[0], running=max(running0, running1, 0.0),
            others=max(0.0, (busy1 - busy0 - own) / wall), steal=(steal1 - steal0) / spent if spent > 0 else 0.0,
            calibration=max(loop0, loop1) / self.calibration.best, need=self.need)
        return self.result

    def __enter__(self) -> MachineWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _not_judged(what: str) -> str:
    """The verdicts' line when the machine, not the numbers, decided: its line says why."""
    return f"not judged: the machine was too busy for {what} (the machine line says why)"


def tied_with_best(medians: Mapping[float, float], spreads: Mapping[float, float]) -> list[float]:
    """The points of a measured curve that this run cannot tell from its minimum (chapter 11).

    medians: point (a bucket cap, a batch size) -> median time; spreads: point -> relative spread of its
    repeats. A point ties with the best when the gap between their medians is within their two noise
    bands (spread x median each) together."""
    best = min(medians, key=lambda k: medians[k])
    noise = {k: spreads[k] * medians[k] for k in medians}
    return sorted(k for k in medians if medians[k] - medians[best] <= noise[k] + noise[best])


def sweep_verdict(medians: Mapping[float, float], spreads: Mapping[float, float], predicted_best: float,
                  check: MachineCheck, what: str, more: str) -> str:
    """One line on a sweep for its minimum, from this run's numbers and machine (chapter 11): the lesson
    shows (both ends lie above the measured best by more than the spread, and the best, as far as the
    spread can tell, includes the model's best point or a neighbour of it), the numbers cannot tell (an
    end ties with the best: no minimum between the ends is shown), or it came out the other way on a
    calm machine. On a busy machine (not check.calm) it judges nothing: the machine line
    (check.line) says why and what to change; a wide spread alone is judged here, cap by cap."""
    if not check.calm:
        return _not_judged(what)
    points = sorted(medians)
    tied = tied_with_best(medians, spreads)
    shown = ", ".join(f"{k:g}" for k in tied)
    ends = [end for end in (points[0], points[-1]) if end in tied]
    if tied in ([points[0]], [points[-1]]):  # the best alone, at an end: the curve only falls towards it
        return (f"the other way, on a calm machine: the step keeps falling towards the end cap {tied[0]:g}, beyond "
                f"the spread, with no minimum between the ends (the model's best: {predicted_best:g}); likely cause: "
                f"per-bucket costs the model does not count (the hook, its thread, the copies)")
    if ends:
        which = " and ".join(f"{k:g}" for k in ends)
        return (f"cannot tell: the end(s) {which} lie within the repeats' spread of the best ({shown}), so this "
                f"run shows no minimum between the ends; {more}")
    at = points.index(predicted_best)
    if set(points[max(0, at - 1):at + 2]) & set(tied):
        return (f"the lesson shows: the measured best ({shown}, within the spread) is at or next to the model's "
                f"{predicted_best:g}, and the curve rises towards both ends")
    return (f"the other way, on a calm machine: the measured best ({shown}) is more than one step from the "
            f"model's {predicted_best:g}, beyond the spread; likely cause: per-bucket costs the model does not "
            f"count (the hook, its thread, the copies), which move the best towards bigger buckets")


def compare_verdict(slow: Sequence[float], fast: Sequence[float], check: MachineCheck, *, claim: str,
                    what: str, more: str, cause: str) -> str:
    """One line judging a timed comparison on this run's repeats and machine (chapters 1, 2, 5, 6, 7, 8; lab 1).

    Its lesson is that `fast` takes less time than `slow`: gap_verdict on the repeats' medians and
    relative spreads."""
    return gap_verdict(statistics.median(slow), relative_spread(slow), statistics.median(fast), relative_spread(fast),
                       check, claim=claim, what=what, more=more, cause=cause)


def gap_verdict(slow: float, slow_spread: float, fast: float, fast_spread: float, check: MachineCheck, *,
                claim: str, what: str, more: str, cause: str) -> str:
    """One line judging a timed comparison from two medians and their relative spreads (chapter 11; compare_verdict's rule).

    Its lesson is that `fast` takes less time than `slow`: the lesson shows (the gap between the medians
    is wider than their two noise bands, spread x median each, in the direction of the claim), the
    numbers cannot tell (the gap is within the bands: say what to raise, `more`), or it came out the
    other way on a calm machine (with the likely `cause`). On a busy machine (not check.calm) it
    judges nothing: the machine line (check.line) says why and what to change; a wide spread of the
    repeats alone is judged here (it widens the bands)."""
    if not check.calm:
        return _not_judged(what)
    noise = slow_spread * slow + fast_spread * fast
    ratio = f"{slow / fast:.2f}x" if fast > 0 else "no time"
    if slow - fast > noise:
        return f"the lesson shows: {claim} ({ratio}, beyond the repeats' spread)"
    if fast - slow > noise:
        return (f"the other way, on a calm machine ({ratio}, beyond the repeats' spread): not what the text "
                f"says ({claim}); likely cause: {cause}")
    return f"cannot tell: the difference ({ratio}) is within the repeats' spread; {more}"


def model_verdict(measured: float, spread: float, predicted: float, check: MachineCheck, *, what: str, more: str,
                  above: str, below: str) -> str:
    """One line judging a measured time against a model's prediction for it (lab 11; chapter 11's model).

    measured: the median of the repeats; spread: their relative spread. The lesson shows (the
    prediction lies within the measurement's noise band, spread x median, and that band is narrow), the
    numbers cannot tell (the band is wider than SPREAD_LIMIT: a prediction well off would lie in it
    too; `more`), or the prediction missed on a calm machine (beyond the band; the likely cause,
    `above` or `below` as the measurement lies). On a busy machine it judges nothing."""
    if not check.calm:
        return _not_judged(what)
    ratio = f"measured / predicted {measured / predicted:.2f}" if predicted > 0 else "no prediction"
    if abs(measured - predicted) <= spread * measured:
        if spread > SPREAD_LIMIT:
            return (f"cannot tell: the prediction lies within the steps' spread ({ratio}), but the steps spread "
                    f"{spread:.0%}, so one far off would too; {more}")
        return f"the lesson shows: the prediction lies within the steps' spread of the measurement ({ratio})"
    cause = above if measured > predicted else below
    return (f"the prediction missed, on a calm machine ({ratio}, beyond the steps' spread of {spread:.0%}); "
            f"likely cause: {cause}")
