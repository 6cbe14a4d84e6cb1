"""benchmarks/hvd_allreduce.py: the bus-bandwidth definition and the table (no launch here; the
benchmark itself is run by `make bench`)."""
from __future__ import annotations

import importlib.util

from gradekit import ROOT

spec = importlib.util.spec_from_file_location("hvd_allreduce", ROOT / "benchmarks" / "hvd_allreduce.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_bus_factor_is_the_ring_traffic_per_rank():
    assert bench.bus_factor(2) == 1.0
    assert bench.bus_factor(4) == 1.5
    assert bench.bus_factor(8) == 2 * 7 / 8


def test_table_pairs_the_libraries_and_gives_their_ratio():
    rows = [{"library": lib, "ranks": 4, "mbytes": 16, "median_s": s, "busbw_GBps": bw}
            for lib, s, bw in [("horovod", 0.02, 1.5), ("torch.distributed", 0.01, 3.0)]]
    text = bench.table(rows).splitlines()
    assert len(text) == 3
    assert text[2].split() == ["4", "16", "|", "20.0", "1.50", "|", "10.0", "3.00", "|", "0.50"]
