"""helpers.ring: chunk boundaries, the simulated ring (exact, N=2..5, uneven sizes, traffic),
the cost model, and the real ring / PS reduce over gloo against dist.all_reduce (one launch)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import helpers
from helpers.ring import (
    Measurement,
    bus_bandwidth,
    chunk_bounds,
    cost_ps,
    cost_ring,
    plot_ring,
    plot_ring_step,
    ps_bytes_at_server,
    ring_bytes_per_worker,
    ring_schedule,
    sent_bytes,
    simulate_ring,
)

pytestmark = pytest.mark.gate  # tests/tiers.py

WORKER = Path(__file__).parent / "workers" / "ring_worker.py"


def test_chunk_bounds_cover_everything_with_uneven_sizes_first():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(0, 3) == [(0, 0)] * 3
    for numel in range(0, 30):
        for n in range(1, 7):
            b = chunk_bounds(numel, n)
            sizes = [hi - lo for lo, hi in b]
            assert b[0][0] == 0 and b[-1][1] == numel and sum(sizes) == numel
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        chunk_bounds(5, 0)


def test_schedule_sends_each_chunk_once_per_phase():
    for n in range(2, 6):
        for t in range(2 * (n - 1)):
            sent = {ring_schedule(r, n, t)[1] for r in range(n)}
            assert sent == set(range(n)), "at every step the workers send N different chunks"
            for r in range(n):  # what r receives is what its left neighbour sends
                assert ring_schedule(r, n, t)[2] == ring_schedule((r - 1) % n, n, t)[1]
        assert ring_schedule(0, n, n - 2)[0] == "reduce-scatter"
        assert ring_schedule(0, n, n - 1)[0] == "all-gather"
    with pytest.raises(ValueError):
        ring_schedule(0, 3, 4)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("numel", [1, 7, 12, 23])
def test_simulation_is_exact(n, numel):
    rng = np.random.default_rng(n * 100 + numel)
    data = [rng.integers(-50, 50, numel).astype(np.int64) for _ in range(n)]
    steps = simulate_ring(data)
    assert len(steps) == 1 + 2 * (n - 1)
    total = np.sum(data, axis=0)
    for buf in steps[-1].buffers:
        np.testing.assert_array_equal(buf, total)
    assert all(c == frozenset(range(n)) for row in steps[-1].who for c in row)
    # After the reduce-scatter, worker r holds the complete sum of chunk (r + 1) mod n.
    rs = steps[n - 1]
    for r in range(n):
        lo, hi = chunk_bounds(numel, n)[(r + 1) % n]
        np.testing.assert_array_equal(rs.buffers[r][lo:hi], total[lo:hi])
        assert rs.who[r][(r + 1) % n] == frozenset(range(n))
    assert data[0].sum() == np.asarray(data[0]).sum()  # inputs untouched


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_simulated_traffic_is_2_n_minus_1_over_n(n):
    numel = 60  # divisible by 2..5
    steps = simulate_ring([np.ones(numel, np.float32)] * n)
    nbytes = numel * 4
    assert sent_bytes(steps, n) == [ring_bytes_per_worker(nbytes, n)] * n
    assert all(tr.dst == (tr.src + 1) % n for st in steps for tr in st.transfers)
    uneven = simulate_ring([np.ones(61, np.float32)] * n)
    assert sum(sent_bytes(uneven, n)) == 2 * (n - 1) * 61 * 4


def test_cost_model_and_bus_bandwidth():
    alpha, beta, s = 1e-5, 1e-9, 1e8
    assert cost_ring(1, s, alpha, beta) == cost_ps(1, s, alpha, beta) == 0.0
    assert cost_ring(2, s, alpha, beta) == pytest.approx(2 * (alpha + s / 2 * beta))
    # ring bandwidth term tends to 2 S beta; the server's grows with N
    assert cost_ring(64, s, 0, beta) < 2 * s * beta < cost_ps(64, s, 0, beta) / 60
    assert ring_bytes_per_worker(100, 4) == 150 and ps_bytes_at_server(100, 4) == 600
    assert bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1e9)
    assert bus_bandwidth(1e9, 2.0, 4) == pytest.approx(0.75e9)
    m = Measurement("ring", 4, 1000, 0.5)
    assert m.algbw == 2000 and m.busbw == pytest.approx(3000)
    with pytest.raises(ValueError):
        bus_bandwidth(1, 0, 2)


def test_plots_draw_every_step():
    import matplotlib

    matplotlib.use("Agg")
    steps = simulate_ring([np.arange(9.0)] * 3)
    fig = plot_ring(steps, 3, cols=3)
    drawn = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in drawn][:2] == ["start", "step 1: reduce-scatter"]
    assert len(drawn) == 5
    ax = plot_ring_step(steps[-1], 3)
    assert ax.get_title() == "step 4: all-gather"


def test_deadlock_guard_lets_a_quick_block_live_on():
    code = ("import time\nfrom helpers.ring import deadlock_guard\n"
            "with deadlock_guard(0.3, 'quick'):\n    pass\ntime.sleep(1.0)\nprint('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr


def test_real_ring_and_ps_match_gloo_all_reduce():
    """One launch of 3 ranks (uneven chunks): float32/float64/int64, empty and tiny sizes, pieces,
    the naive PS reduce, and bytes sent per rank (2(N-1)/N * S, all to the right neighbour)."""
    res = helpers.launch(WORKER, 3, timeout=240, echo=False)
    for r in range(3):
        assert res.lines(r)[-1].startswith(f"ok rank {r} of 3"), res.lines(r)


def test_deadlock_guard_ends_a_hung_rank_with_a_clear_message(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nfrom helpers.ring import deadlock_guard\n"
                      "with deadlock_guard(1, 'the test block'):\n    time.sleep(60)\n")
    with pytest.raises(helpers.LaunchError) as err:
        helpers.launch(script, 1, timeout=60, echo=False)
    assert "DEADLOCK? rank 0: the test block did not finish within 1 s" in str(err.value)
