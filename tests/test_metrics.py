"""dpc_runtime.metrics (helpers.metrics.record in the chapters): key numbers reach src/dpc_maintainer/solutions.py only when it asks for them."""
from __future__ import annotations

from dpc_runtime import metrics


def test_record_writes_when_asked_and_returns_the_value(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv(metrics.ENV, str(path))
    assert metrics.record("speedup", 1.23456789) == 1.23456789
    metrics.record("devices", "4 x CPU")
    metrics.record("speedup", 2.0)
    assert metrics.read(str(path)) == {"speedup": 2.0, "devices": "4 x CPU"}  # last value wins
    metrics.record("ratio", 1.23456789)
    assert metrics.read(str(path))["ratio"] == 1.235  # 4 significant digits in the report


def test_record_is_silent_in_a_students_kernel(tmp_path, monkeypatch):
    monkeypatch.delenv(metrics.ENV, raising=False)
    assert metrics.record("x", 1) == 1
    assert metrics.read(str(tmp_path / "none.jsonl")) == {}
