"""benchmarks/hvd_allreduce.py: the table it prints (no launch here; the benchmark itself is run by
`make bench`); its bandwidths are helpers.ring.bus_bandwidth, tested in test_ring."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gradekit import ROOT

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_table_pairs_the_libraries_and_gives_their_ratio(tmp_path):
    rows = [{"library": lib, "ranks": 4, "mbytes": 16, "median_s": s, "busbw_GBps": bw}
            for lib, s, bw in [("horovod", 0.02, 1.5), ("torch.distributed", 0.01, 3.0)]]
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hvd_allreduce.py"), "--show",
                           str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60, check=True)
    text = done.stdout.splitlines()
    assert len(text) == 3
    assert text[2].split() == ["4", "16", "|", "20.0", "1.50", "|", "10.0", "3.00", "|", "0.50"]
