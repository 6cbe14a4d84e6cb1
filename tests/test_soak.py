"""src/dpc_maintainer/soak.py (`make soak`): the worker files it extracts, the legacy exit it can put back,
and one real (small) soak on a loaded machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpc_maintainer import soak

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gate
def test_writefiles_extracts_the_workers_of_a_notebook():
    files = soak.writefiles(ROOT / "solutions/07-ddp-syncbn/ddp-syncbn.ipynb")
    assert "runs/07/check.py" in files and "runs/07/lab_setup.py" in files
    assert not any(body.startswith("%%writefile") for body in files.values())


@pytest.mark.gate
def test_legacy_puts_back_the_old_ending_only():
    src = "x = 1\nif x:\n    finish()  # the end\nreport(a=1)\n"
    old = soak.legacy(src)
    assert "finish(" not in old and "report(a=1)" in old
    assert "    if _dist.is_initialized():\n        _dist.barrier()\n        _dist.destroy_process_group()" in old


@pytest.mark.gate
def test_summary_counts_failures_by_kind():
    outcomes = [soak.Outcome("a", 1.0, notes=1), soak.Outcome("a", 3.0, "hang"), soak.Outcome("b", 2.0)]
    lines = soak.summary(outcomes)
    assert lines[-1] == "soak: 3 launches, 1 failed"
    assert lines[1].split() == ["a", "2", "1", "2.0", "3.0", "1", "hang:", "1"]


@pytest.mark.full
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_small_soak_under_a_cpu_hog(tmp_path):
    """Every launch passes beside the hog, and the soak leaves nothing in the temporary folder."""
    out, temp = tmp_path / "soak.json", tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.soak", "--only", "ch5 ring check",
                           "--rounds", "1", "--burst", "2", "--hog", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=580, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(temp.iterdir()) == [], "the soak's folder (dpc-soak-*) is removed at its end"
    assert done.stdout.rstrip().splitlines()[-1] == "soak: 5 launches, 0 failed"  # 3 (weight 3) + 2
    data = json.loads(out.read_text())
    assert [o["kind"] for o in data["outcomes"]].count("ch5 ring check (torchrun 3)") == 3
    assert data["hog"] == 2
