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
