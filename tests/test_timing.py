"""helpers.timing: timers, throughput, per-epoch clocks, scaling/speed-up tables and plots."""
from __future__ import annotations

import statistics
import time

import matplotlib

matplotlib.use("Agg")  # no display in tests

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

import helpers  # noqa: E402
from helpers import EpochClock, ScalingRow, Timer  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- Timer -------------------------------------------------------------------------------------

def test_timer_start_stop_records_elapsed():
    timer = Timer()
    timer.start()
    time.sleep(0.02)
    elapsed = timer.stop()
    assert timer.times == [elapsed]
    assert 0.015 <= elapsed < 1.0


def test_timer_context_manager_records_each_use():
    timer = Timer()
    for pause in (0.01, 0.03):
        with timer as t:
            assert t is timer
            time.sleep(pause)
    assert len(timer.times) == 2
    assert timer.times[0] >= 0.008
    assert timer.times[1] >= 0.028


def test_timer_records_even_when_the_body_raises():
    timer = Timer()
    with pytest.raises(ZeroDivisionError):
        with timer:
            1 / 0  # noqa: B018
    assert len(timer.times) == 1


def test_timer_statistics():
    timer = Timer()
    timer.times = [1.0, 2.0, 6.0]
    assert timer.sum() == pytest.approx(9.0)
    assert timer.avg() == pytest.approx(3.0)
    assert timer.median() == pytest.approx(2.0)
    timer.times.append(3.0)
    assert timer.median() == pytest.approx(2.5)


def test_timer_stop_before_start_raises():
    with pytest.raises(RuntimeError, match=r"stop\(\) called before start\(\)"):
        Timer().stop()


def test_timer_cannot_stop_twice():
    timer = Timer()
    timer.start()
    timer.stop()
    with pytest.raises(RuntimeError, match="before start"):
        timer.stop()
    assert len(timer.times) == 1


# --- throughput and measure ----------------------------------------------------------------------

def test_throughput():
    assert helpers.throughput(1000, 2.0) == pytest.approx(500.0)
    assert helpers.throughput(3, 0.5) == pytest.approx(6.0)


@pytest.mark.parametrize("seconds", [0, 0.0, -1.5])
def test_throughput_rejects_non_positive_seconds(seconds):
    with pytest.raises(ValueError, match="seconds must be positive"):
        helpers.throughput(10, seconds)


def test_measure_warms_up_then_times():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        time.sleep(0.005)

    times = helpers.measure(fn, repeat=3, warmup=1)
    assert len(calls) == 4
    assert len(times) == 3
    assert all(t >= 0.004 for t in times)


def test_measure_without_warmup():
    count = 0

    def fn():
        nonlocal count
        count += 1

    assert len(helpers.measure(fn, repeat=5, warmup=0)) == 5
    assert count == 5


# --- EpochClock --------------------------------------------------------------------------------

def test_epoch_clock_one_time_per_epoch():
    clock = EpochClock()
    seen = []
    for epoch in clock.epochs(3):
        seen.append(epoch)
        time.sleep(0.01 * (epoch + 1))
    assert seen == [0, 1, 2]
    assert len(clock.times) == 3
    assert clock.times[0] >= 0.008
    assert clock.times[2] >= 0.028


def test_epoch_clock_accumulates_over_loops():
    clock = EpochClock()
    for _ in clock.epochs(2):
        pass
    for _ in clock.epochs(1):
        pass
    assert len(clock.times) == 3


# --- tables ------------------------------------------------------------------------------------

def test_scaling_table_exact_values():
    rows = helpers.scaling_table({4: 300.0, 1: 100.0, 2: 180.0})  # order of the input does not matter
    assert [r.devices for r in rows] == [1, 2, 4]
    assert [r.samples_per_s for r in rows] == [100.0, 180.0, 300.0]
    assert [r.speedup for r in rows] == pytest.approx([1.0, 1.8, 3.0])
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.9, 0.75])
    assert rows[1] == ScalingRow(2, 180.0, pytest.approx(1.8), pytest.approx(0.9))


def test_scaling_table_baseline_is_smallest_count():
    rows = helpers.scaling_table({2: 200.0, 4: 300.0})
    assert [r.speedup for r in rows] == pytest.approx([1.0, 1.5])
    # efficiency relative to the baseline's per-device throughput (100 per device)
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.75])


def test_scaling_table_empty():
    with pytest.raises(ValueError, match="at least one measurement"):
        helpers.scaling_table({})


def test_speedup_table_baseline_first():
    table = helpers.speedup_table({"parallel": 2.0, "serial": 8.0, "prefetch": 4.0}, "serial")
    assert [label for label, _, _ in table] == ["serial", "parallel", "prefetch"]
    assert table[0] == ("serial", 8.0, 1.0)
    assert table[1] == ("parallel", 2.0, pytest.approx(4.0))
    assert table[2] == ("prefetch", 4.0, pytest.approx(2.0))


def test_speedup_table_unknown_baseline():
    with pytest.raises(KeyError, match="baseline 'gpu' is not among the measurements"):
        helpers.speedup_table({"serial": 1.0}, "gpu")


def test_format_table_alignment():
    text = helpers.format_table(["devices", "speed-up"], [[1, 1.0], [16, 12.345]])
    assert text.splitlines() == [
        "devices  speed-up",
        "-------  --------",
        "      1      1.00",
        "     16     12.35",
    ]


def test_format_table_wide_cells_widen_columns():
    lines = helpers.format_table(["n", "s"], [["serial", 123.456]]).splitlines()
    assert lines == [
        "     n       s",
        "------  ------",
        "serial  123.46",
    ]
    assert len({len(ln) for ln in lines}) == 1


# --- plots -------------------------------------------------------------------------------------

def test_plot_speedup_returns_axes_with_ideal_and_measured():
    ax = helpers.plot_speedup([1, 2, 4], [1.0, 1.8, 3.0], label="mirrored")
    assert isinstance(ax, Axes)
    ideal, measured = ax.get_lines()
    assert list(ideal.get_xdata()) == [1, 4]
    assert list(ideal.get_ydata()) == [1, 4]
    assert list(measured.get_ydata()) == [1.0, 1.8, 3.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ideal (linear)", "mirrored"]
    assert ax.get_xlabel() == "devices"


def test_plot_speedup_on_given_axes():
    _, ax = plt.subplots()
    assert helpers.plot_speedup([1, 2], [1.0, 1.5], ax=ax, title="t") is ax
    assert ax.get_title() == "t"


def test_plot_breakdown_stacks_parts():
    ax = helpers.plot_breakdown(["serial", "parallel"], {"wait": [3.0, 1.0], "compute": [2.0, 2.0]})
    assert isinstance(ax, Axes)
    bars = ax.patches
    assert len(bars) == 4
    widths = [b.get_width() for b in bars]
    lefts = [b.get_x() for b in bars]
    assert widths == [3.0, 1.0, 2.0, 2.0]
    assert lefts == [0.0, 0.0, 3.0, 1.0]  # compute starts where wait ends
    assert ax.get_xlabel() == "s per epoch"


# --- Keras -------------------------------------------------------------------------------------

def test_keras_epoch_timer_one_time_per_epoch(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # read when TensorFlow is first imported
    import tensorflow as tf

    timer = helpers.keras_epoch_timer()
    assert isinstance(timer, tf.keras.callbacks.Callback)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    model.fit(x, x.sum(1), batch_size=16, epochs=3, verbose=0, callbacks=[timer])
    assert len(timer.times) == 3
    assert all(t > 0 for t in timer.times)
    assert statistics.fmean(timer.times) < 30


# --- is the machine calm enough to time a comparison? ------------------------------------------
#
# Every figure comes from fake /proc and cgroup files and fake calibration times: nothing here
# depends on how busy the machine running the tests is.

from helpers.timing import (  # noqa: E402
    CALIBRATION_LIMIT,
    CALIBRATION_WARMUP,
    LOAD_LIMIT,
    STEAL_LIMIT,
    Calibration,
    MachineCheck,
    MachineWatch,
    cpu_quota,
    usable_cores,
)

pytestmark = pytest.mark.gate  # tests/tiers.py

TICK = __import__("os").sysconf("SC_CLK_TCK")


def fake_proc(tmp_path, *, cgroup="0::/user.slice/kernel\n", load="0.30 0.20 0.10 1/300 4242", cpus=2,
              busy=0, steal=0):
    """A /proc with self/cgroup, loadavg and stat (busy and stolen CPU-seconds since boot) under tmp_path."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "loadavg").write_text(load + "\n")
    per = [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cpus)]
    total = f"cpu  {int(busy * TICK)} 0 0 {10**6} 0 0 0 {int(steal * TICK)} 0 0"
    (proc / "stat").write_text("\n".join([total, *per, "intr 0", "ctxt 0"]) + "\n")
    return proc


def cgroup_file(root, path, name, text):
    folder = root.joinpath(*[p for p in path.split("/") if p])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watch_around(tmp_path, *, need=2, loop_times=(0.010,) * 10, affinity=2, wall=10.0, own=0.0,
                 after=None, calibration=None, **before):
    """Run a MachineWatch over fake files: `before` describes /proc at start(), `after` at stop()."""
    proc = fake_proc(tmp_path, **before)
    clock, cpu = FakeClock(), {"s": 50.0}
    times = iter(loop_times)
    watch = MachineWatch(need, proc=proc, cgroup_root=tmp_path / "cgroup", affinity=affinity,
                         calibration=calibration or Calibration(loop=lambda: next(times), warmup=0),
                         clock=clock, own_cpu=lambda: cpu["s"]).start()
    clock.now += wall
    cpu["s"] += own
    fake_proc(tmp_path, **{**before, **(after or {})})
    return watch.stop()


def test_relative_spread():
    assert helpers.relative_spread([]) == 0.0
    assert helpers.relative_spread([0.1]) == 0.0
    assert helpers.relative_spread([1.0, 1.0, 1.0]) == 0.0
    # quartiles (inclusive) of 1..5 are 2 and 4, the median 3
    assert helpers.relative_spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2 / 3)


def test_cpu_quota_cgroup_v2(tmp_path):
    root = tmp_path / "cgroup"
    proc = fake_proc(tmp_path, cgroup="0::/user.slice/jupyter-ada\n")
    assert cpu_quota(proc, root) is None  # no cpu.max anywhere: unlimited
    cgroup_file(root, "/user.slice/jupyter-ada", "cpu.max", "max 100000\n")
    assert cpu_quota(proc, root) is None
    cgroup_file(root, "/user.slice/jupyter-ada", "cpu.max", "150000 100000\n")
    assert cpu_quota(proc, root) == pytest.approx(1.5)
    cgroup_file(root, "/user.slice", "cpu.max", "100000 100000\n")  # a parent's quota binds the child
    assert cpu_quota(proc, root) == pytest.approx(1.0)


def test_cpu_quota_cgroup_v1(tmp_path):
    root = tmp_path / "cgroup"
    proc = fake_proc(tmp_path, cgroup="4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    cgroup_file(root, "/cpu,cpuacct/docker/abc", "cpu.cfs_period_us", "100000\n")
    cgroup_file(root, "/cpu,cpuacct/docker/abc", "cpu.cfs_quota_us", "-1\n")
    assert cpu_quota(proc, root) is None
    cgroup_file(root, "/cpu,cpuacct/docker/abc", "cpu.cfs_quota_us", "200000\n")
    assert cpu_quota(proc, root) == pytest.approx(2.0)
    # inside a container the path may not exist below the mount: its root's files count
    proc = fake_proc(tmp_path, cgroup="3:cpu,cpuacct:/not/here\n")
    cgroup_file(root, "/cpu", "cpu.cfs_period_us", "50000\n")
    cgroup_file(root, "/cpu", "cpu.cfs_quota_us", "75000\n")
    assert cpu_quota(proc, root) == pytest.approx(1.5)


def test_usable_cores_is_the_smaller_of_affinity_and_quota(tmp_path):
    root = tmp_path / "cgroup"
    proc = fake_proc(tmp_path, cgroup="0::/k\n")
    assert usable_cores(proc, root, affinity=4) == 4.0
    cgroup_file(root, "/k", "cpu.max", "150000 100000\n")
    assert usable_cores(proc, root, affinity=4) == 1.5
    assert usable_cores(proc, root, affinity=1) == 1.0
    assert usable_cores(proc, root) <= 1.5  # this machine's affinity, capped by the fake quota


def test_calibration_keeps_its_best_and_returns_the_median():
    times = iter([0.03, 0.01, 0.02, 0.05, 0.04, 0.02, 0.02, 0.02, 0.02, 0.02])
    cal = Calibration(loop=lambda: next(times), warmup=0)
    seen = []
    assert cal.run(between=lambda: seen.append(1)) == pytest.approx(0.03)
    assert (cal.best, len(seen)) == (0.01, 5)
    assert cal.run() == pytest.approx(0.02)
    assert cal.best == 0.01


def test_the_warm_up_runs_are_not_timed():
    # A core that idled runs the loop slower for its first few runs: those are run, not counted.
    times = iter([0.05] * CALIBRATION_WARMUP + [0.01] * 5)
    cal = Calibration(loop=lambda: next(times))
    assert (cal.run(), cal.best) == (0.01, 0.01)
    assert next(times, None) is None


def test_a_real_calibration_loop_takes_a_moment():
    cal = Calibration()
    assert 0 < cal.run(repeat=1) < 5
    assert cal.best > 0


def test_calm_machine(tmp_path):
    check = watch_around(tmp_path, busy=1000, after={"busy": 1004, "load": "0.50 0.2 0.1 1/300 1"}, own=4.0)
    assert check == MachineCheck(cores=2.0, cpus=2, load=0.5, running=0, others=0.0, steal=0.0, calibration=1.0,
                                 need=2)
    assert check.calm and check.reasons == ()
    line = check.line("the overlap comparison")
    assert line == ("machine: 2 cores for this kernel, load 0.5, others want 0.0 of 2 CPUs, "
                    "calibration 1.0x its best: calm enough for the overlap comparison")


def test_loaded_machine(tmp_path):
    # 9 runnable threads (the reader is one), and others kept 1.8 CPUs busy over the 10 s: 22 s of
    # the machine's busy time, 4 of them ours.
    check = watch_around(tmp_path, load="7.20 6.0 5.0 9/300 1", busy=1000, after={"busy": 1022}, own=4.0,
                         loop_times=[0.010] * 5 + [0.023] * 5)
    assert (check.running, check.others, check.load) == (8, pytest.approx(1.8), 7.2)
    assert check.calibration == pytest.approx(2.3)
    assert not check.calm
    assert check.reasons == ("other work wanted 8.0 of the 2 CPUs", "a fixed loop ran 2.3x slower than its best")
    line = check.line("the overlap comparison", more="more repeats (STEPS=20)")
    assert line.startswith("machine: 2 cores for this kernel, load 7.2, others want 8.0 of 2 CPUs, "
                           "calibration 2.3x its best: too busy for the overlap comparison (")
    assert line.endswith("); rerun with more repeats (STEPS=20) when the machine is calmer, "
                         "or read the model's prediction")
    assert "\n" not in line


def test_others_count_only_what_this_process_did_not_spend(tmp_path):
    # the machine was busy 15 s of 10 s wall time, and all of it was ours (kernel and ranks): calm
    check = watch_around(tmp_path, busy=500, after={"busy": 515}, own=15.0, need=2)
    assert check.others == 0.0 and check.calm


def test_quota_limited_kernel(tmp_path):
    cgroup_file(tmp_path / "cgroup", "/user.slice/jupyter-ada", "cpu.max", "150000 100000\n")
    check = watch_around(tmp_path, cgroup="0::/user.slice/jupyter-ada\n", affinity=16, cpus=16, need=2)
    assert check.cores == 1.5
    assert check.reasons == ("1.5 cores for 2 ranks",)
    assert check.line("the overlap comparison").startswith("machine: 1.5 cores for this kernel, load 0.3")
    assert watch_around(tmp_path, affinity=1, need=2).reasons[0] == "1 core for 2 ranks"
    # one rank fits
    assert watch_around(tmp_path, cgroup="0::/user.slice/jupyter-ada\n", affinity=16, cpus=16, need=1).calm


def test_steal(tmp_path):
    # the hypervisor took 1 s of the 11 s the machine's CPUs wanted to run
    check = watch_around(tmp_path, busy=100, steal=20, after={"busy": 110, "steal": 21}, own=10.0)
    assert check.steal == pytest.approx(1 / 11)
    assert check.reasons == ("the hypervisor stole 9% of the CPU time",)
    assert "steal 9%, " in check.line("x")


def test_thresholds_sit_where_the_comment_says():
    base = dict(cores=2.0, cpus=4, load=0.0, running=0.0, others=0.0, steal=0.0, calibration=1.0, need=2)
    assert MachineCheck(**{**base, "calibration": CALIBRATION_LIMIT}).calm
    assert not MachineCheck(**{**base, "calibration": CALIBRATION_LIMIT + 0.01}).calm
    assert MachineCheck(**{**base, "steal": STEAL_LIMIT}).calm
    assert not MachineCheck(**{**base, "steal": STEAL_LIMIT + 0.01}).calm
    assert MachineCheck(**{**base, "others": 4 * LOAD_LIMIT - 2}).calm
    assert not MachineCheck(**{**base, "others": 4 * LOAD_LIMIT - 1.9}).calm


def test_watch_as_a_context_manager(tmp_path):
    times = iter([0.01] * 10)
    with MachineWatch(1, proc=fake_proc(tmp_path), cgroup_root=tmp_path / "cg", affinity=2,
                      calibration=Calibration(loop=lambda: next(times), warmup=0)) as watch:
        assert watch.result is None
    assert watch.result is not None and watch.result.calm


def test_stop_before_start_raises(tmp_path):
    with pytest.raises(RuntimeError, match=r"stop\(\) called before start\(\)"):
        MachineWatch(proc=fake_proc(tmp_path)).stop()


def test_without_proc_or_cgroups_the_watch_still_answers(tmp_path):
    # macOS has no /proc: the affinity alone, no quota, nothing known of others, the calibration still timed
    times = iter([0.01] * 10)
    check = MachineWatch(1, proc=tmp_path / "none", cgroup_root=tmp_path / "none", affinity=4,
                         calibration=Calibration(loop=lambda: next(times), warmup=0), own_cpu=lambda: 0.0).start().stop()
    assert (check.cores, check.running, check.others, check.steal, check.calibration) == (4.0, 0, 0.0, 0.0, 1.0)
    assert check.cpus >= 1 and check.calm


def test_the_real_machine_gives_figures():
    check = MachineWatch(need=1).start().stop()  # its verdict depends on the machine: only its shape here
    assert check.cores > 0 and check.cpus >= 1 and check.calibration >= 1.0
    assert check.line("a comparison").startswith("machine: ")


# --- measure_interleaved and fit_alpha_beta (chapters 1, 2, 5, 6) ------------------------------

def test_measure_interleaved_warms_up_then_reverses_the_order_each_round():
    calls: list[str] = []
    variants = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = helpers.timing.measure_interleaved(variants, repeat=3, warmup=1)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] + ["c", "b", "a"] + ["a", "b", "c"]
    assert list(times) == ["a", "b", "c"] and all(len(t) == 3 and min(t) >= 0 for t in times.values())


def test_measure_interleaved_takes_a_variants_own_time_when_it_returns_one():
    times = helpers.timing.measure_interleaved({"own": lambda: 7.5, "timed": lambda: None}, repeat=2, warmup=0)
    assert times["own"] == [7.5, 7.5]
    assert all(0 <= t < 7.5 for t in times["timed"])


def test_fit_alpha_beta_recovers_the_model_it_was_given():
    alpha, beta, n = 30e-6, 1 / 2e9, 4
    sizes = [2**20, 4 * 2**20, 16 * 2**20]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta for s in sizes]
    a, b = helpers.timing.fit_alpha_beta(sizes, times, n)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_fit_alpha_beta_never_negative_and_one_size_is_all_bandwidth():
    # times that fall with size (noise) would give a negative slope: clipped to 0
    a, b = helpers.timing.fit_alpha_beta([1e6, 2e6], [2e-3, 1e-3], 2)
    assert a > 0 and b == 0.0
    a, b = helpers.timing.fit_alpha_beta([1e6], [1e-3], 2)
    assert a == 0.0 and b == pytest.approx(1e-3 / 1e6)
    with pytest.raises(ValueError):
        helpers.timing.fit_alpha_beta([1e6, 2e6], [1e-3], 2)
    with pytest.raises(ValueError):
        helpers.timing.fit_alpha_beta([1e6], [1e-3], 1)


# --- sweep_verdict: the result judged, not only the machine (chapter 11's bucket-size sweep) -------------

CALM = MachineCheck(cores=2, cpus=2, load=0.3, running=0.0, others=0.0, steal=0.0, calibration=1.0, need=2)
CAPS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]


def _curve(*ms, spread=0.02):
    return dict(zip(CAPS, ms)), dict.fromkeys(CAPS, spread)


def test_tied_with_best_uses_both_noise_bands():
    from helpers.timing import tied_with_best

    medians, spreads = _curve(130, 100, 104, 101, 110, 120)
    assert tied_with_best(medians, spreads) == [0.5, 1.0, 2.0]  # 104 - 100 <= 2.08 + 2.0; 110 - 100 > 2.2 + 2
    assert tied_with_best(*_curve(130, 100, 104, 101, 110, 120, spread=0.0)) == [0.5]


def test_sweep_verdict_says_which_of_three_things_the_numbers_show():
    from helpers.timing import sweep_verdict

    say = lambda curve, best: sweep_verdict(*curve, best, CALM, "the sweep", "STEPS=10")  # noqa: E731
    shows = say(_curve(130, 100, 104, 101, 110, 120), 1.0)
    assert shows.startswith("the lesson shows: the measured best (0.5, 1, 2, within the spread) is at or next to "
                            "the model's 1, and the curve rises towards both ends"), shows
    assert say(_curve(130, 100, 104, 101, 110, 120), 4.0).startswith("the lesson shows")  # 2 is next to 4
    flat = say(_curve(104, 100, 103, 101, 102, 103, spread=0.03), 1.0)
    assert flat == ("cannot tell: the end(s) 0.25 and 8 lie within the repeats' spread of the best (0.25, 0.5, 1, 2, "
                    "4, 8), so this run shows no minimum between the ends; STEPS=10"), flat
    one_end = say(_curve(130, 100, 104, 101, 110, 101.5), 1.0)
    assert one_end.startswith("cannot tell: the end(s) 8 lie within"), one_end
    falling = say(_curve(100, 110, 120, 125, 130, 135), 4.0)
    assert falling.startswith("the other way, on a calm machine: the step keeps falling towards the end cap 0.25"), falling
    far = say(_curve(130, 100, 110, 115, 120, 125), 4.0)
    assert far.startswith("the other way, on a calm machine: the measured best (0.5) is more than one step "
                          "from the model's 4"), far


def test_sweep_verdict_on_a_busy_machine_judges_nothing():
    from helpers.timing import sweep_verdict

    busy = MachineCheck(cores=2, cpus=2, load=6.0, running=4.0, others=3.5, steal=0.0, calibration=2.5, need=2)
    line = sweep_verdict(*_curve(100, 110, 120, 125, 130, 135), 4.0, busy, "the sweep", "CAPS_MB=[0.5, 2, 8]")
    assert line == "not judged: the machine was too busy for the sweep (the machine line says why)"


# --- compare_verdict: one timed comparison judged (chapters 1, 2, 5, 6, 8) ----------------------------------


def test_compare_verdict_says_which_of_three_things_the_numbers_show():
    from helpers.timing import compare_verdict

    def say(slow, fast):
        return compare_verdict(slow, fast, CALM, claim="the pipeline is faster", what="the pipelines",
                               more="raise REPEATS", cause="a core busy elsewhere")

    # medians 2.0 and 1.0, bands (interquartile ranges) 0.1 and 0.05: a gap of 1.0 is beyond them
    assert say([1.9, 2.0, 2.1], [0.95, 1.0, 1.05]) == (
        "the lesson shows: the pipeline is faster (2.00x, beyond the repeats' spread)")
    # medians 1.1 and 1.0, bands 0.1 and 0.05: a gap of 0.1 is within them
    assert say([1.0, 1.1, 1.2], [0.95, 1.0, 1.05]) == (
        "cannot tell: the difference (1.10x) is within the repeats' spread; raise REPEATS")
    assert say([0.95, 1.0, 1.05], [1.9, 2.0, 2.1]) == (
        "the other way, on a calm machine (0.50x, beyond the repeats' spread): not what the text says (the "
        "pipeline is faster); likely cause: a core busy elsewhere")
    assert say([2.0], [1.0]).startswith("the lesson shows")  # one repeat each: no band, the gap decides


def test_compare_verdict_on_a_busy_machine_judges_nothing():
    from helpers.timing import compare_verdict

    busy = MachineCheck(cores=2, cpus=2, load=6.0, running=4.0, others=3.5, steal=0.0, calibration=2.5, need=2)
    line = compare_verdict([0.95, 1.0, 1.05], [1.9, 2.0, 2.1], busy, claim="x", what="the pipelines",
                           more="m", cause="c")
    assert line == "not judged: the machine was too busy for the pipelines (the machine line says why)"


def test_one_rule_for_verdicts_on_synthetic_runs():
    """The machine line judges the machine, a verdict judges the result: spread alone never makes a machine busy,
    "not judged" comes only from a busy machine, and a calm machine with a clear gap shows the lesson."""
    from helpers.timing import compare_verdict, model_verdict, sweep_verdict

    def both(check, slow, fast):
        return check.line("the pipelines"), compare_verdict(slow, fast, check, claim="x", what="the pipelines",
                                                            more="raise REPEATS", cause="c")

    # spread-only: nobody else wanted the cores, only this run's repeats varied (a 100 % spread)
    line, verdict = both(CALM, [1.0, 1.5, 2.0], [0.5, 1.2, 1.6])
    assert line.endswith(": calm enough for the pipelines") and "spread" not in line
    assert verdict == "cannot tell: the difference (1.25x) is within the repeats' spread; raise REPEATS"
    assert both(CALM, [2.9, 3.0, 3.1], [1.0, 1.4, 1.5])[1].startswith("the lesson shows")  # beyond even wide bands
    assert sweep_verdict(*_curve(104, 100, 103, 101, 102, 103, spread=0.3), 1.0, CALM, "the sweep",
                         "STEPS=10").startswith("cannot tell")
    assert model_verdict(0.042, 0.6, 0.0366, CALM, what="w", more="m", above="a", below="b").startswith("cannot tell")
    # busy: other work on the cores; the numbers would be decisive, and still nothing is judged
    busy = MachineCheck(cores=2, cpus=2, load=6.0, running=4.0, others=3.5, steal=0.0, calibration=2.5, need=2)
    line, verdict = both(busy, [1.9, 2.0, 2.1], [0.95, 1.0, 1.05])
    assert ": too busy for the pipelines (other work wanted 4.0 of the 2 CPUs; " in line
    assert verdict == "not judged: the machine was too busy for the pipelines (the machine line says why)"
    # calm and decisive
    line, verdict = both(CALM, [1.9, 2.0, 2.1], [0.95, 1.0, 1.05])
    assert line.endswith("calm enough for the pipelines")
    assert verdict == "the lesson shows: x (2.00x, beyond the repeats' spread)"


def test_no_committed_output_calls_a_machine_busy_for_its_spread_or_judges_nothing_on_a_calm_one():
    """The chapters' and labs' committed outputs follow the rule: no machine line names the repeats' spread as a
    reason, and a "not judged" verdict only follows a machine line that said the machine was too busy."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    notebooks = sorted((root / "course").glob("*.ipynb")) + sorted((root / "solutions").glob("*/*.ipynb"))
    assert len(notebooks) > 10
    for nb in notebooks:
        text = "".join("".join(out.get("text", "")) if isinstance(out.get("text", ""), list) else out.get("text", "")
                       for cell in json.loads(nb.read_text())["cells"] for out in cell.get("outputs", ()))
        assert not re.search(r"too busy for [^\n]*\(the repeats spread", text), nb.name
        for m in re.finditer(r"not judged: the machine was too busy for (.+?) \(the machine line says why\)", text):
            before = text[:m.start()]
            assert f"too busy for {m.group(1)} (" in before, (nb.name, m.group(0))


def test_model_verdict_says_which_of_three_things_the_numbers_show():
    from helpers.timing import model_verdict

    def say(measured, spread, predicted, check=CALM):
        return model_verdict(measured, spread, predicted, check, what="the prediction", more="a larger STEPS",
                             above="costs the model leaves out", below="slower compute-only steps")

    assert say(0.040, 0.10, 0.037) == ("the lesson shows: the prediction lies within the steps' spread of the "
                                       "measurement (measured / predicted 1.08)")
    assert say(0.042, 0.26, 0.0366) == ("cannot tell: the prediction lies within the steps' spread (measured / "
                                        "predicted 1.15), but the steps spread 26%, so one far off would too; "
                                        "a larger STEPS")
    assert say(0.050, 0.05, 0.037) == ("the prediction missed, on a calm machine (measured / predicted 1.35, beyond "
                                       "the steps' spread of 5%); likely cause: costs the model leaves out")
    assert say(0.030, 0.05, 0.037).endswith("likely cause: slower compute-only steps")
    busy = MachineCheck(cores=2, cpus=2, load=6.0, running=4.0, others=3.5, steal=0.0, calibration=2.5, need=2)
    assert say(0.050, 0.05, 0.037, busy) == (
        "not judged: the machine was too busy for the prediction (the machine line says why)")


def test_gap_verdict_on_medians_and_spreads_is_compare_verdicts_rule():
    from helpers.timing import compare_verdict, gap_verdict, relative_spread

    slow, fast = [1.9, 2.0, 2.1], [0.95, 1.0, 1.05]
    kw = dict(claim="overlap hides communication", what="the overlap comparison", more="m", cause="c")
    assert gap_verdict(2.0, relative_spread(slow), 1.0, relative_spread(fast), CALM, **kw) == \
        compare_verdict(slow, fast, CALM, **kw)
    assert gap_verdict(1.05, 0.04, 1.0, 0.02, CALM, **kw).startswith("cannot tell")  # 0.05 < 0.042 + 0.02
    assert gap_verdict(1.0, 0.01, 1.1, 0.01, CALM, **kw).startswith("the other way, on a calm machine (0.91x")
