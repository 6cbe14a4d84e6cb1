"""src/dpc_maintainer/run_all.py (`make bench`): the ratios of every benchmark against their goals, one plot
of all the all-reduce bandwidths, and a failing benchmark reported without hiding the others."""
from __future__ import annotations

import json

import pytest

from dpc_maintainer import run_all

pytestmark = pytest.mark.gate  # tests/tiers.py

RING = {"goal": 0.8, "goal_mb": [16, 64],
        "ratios": [{"n": 2, "mb": 1.0, "ring_over_gloo": 1.1, "ps_over_gloo": 1.8},
                   {"n": 2, "mb": 16.0, "ring_over_gloo": 0.82, "ps_over_gloo": 0.86}],
        "rows": [{"method": m, "n": 2, "bytes": mb * 2**20, "busbw": bw * 1e9}
                 for m, bw in [("ring", 0.5), ("gloo", 0.6), ("ps", 0.4)] for mb in (1, 16)]}
HVD = {"rows": [{"library": lib, "ranks": 2, "mbytes": mb, "busbw_GBps": bw}
                for lib, bw in [("horovod", 0.1), ("torch.distributed", 0.4)] for mb in (1, 16)]}


def test_ring_ratios_at_the_goal_sizes_only():
    rows = run_all.ratio_rows("ring_allreduce", RING)
    assert [(r["what"], r["ratio"], r["goal"]) for r in rows] == [
        ("course ring / gloo, 2 ranks, 16 MB", 0.82, 0.8),
        ("parameter server / gloo, 2 ranks, 16 MB", 0.86, None)]


def test_horovod_ratio_against_torch_distributed():
    rows = run_all.ratio_rows("hvd_allreduce", HVD)
    assert [(r["what"], r["ratio"]) for r in rows] == [
        ("Horovod / torch.distributed (gloo), 2 ranks, 16 MB", 0.25)]


def test_generic_ratios_and_one_plot(tmp_path):
    rows = run_all.ratio_rows("input_pipeline", {"ratios": [{"what": "a vs b", "ratio": 2.0, "goal": 1.8}]})
    assert rows == [{"benchmark": "input_pipeline", "what": "a vs b", "ratio": 2.0, "goal": 1.8}]
    curves = run_all.bandwidth_curves({"ring_allreduce": RING, "hvd_allreduce": HVD})
    assert {c[0] for c in curves} == {"course ring", "gloo all_reduce", "parameter server",
                                      "Horovod allreduce (gloo, own run)"}
    assert run_all.plot_bandwidth({"ring_allreduce": RING, "hvd_allreduce": HVD}, tmp_path).exists()


def test_a_crashing_benchmark_is_reported_and_fails_the_run(tmp_path, monkeypatch):
    (tmp_path / "boom.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "fine.py").write_text(
        "import json, sys\njson.dump({'ratios': [{'what': 'x', 'ratio': 1.5, 'goal': 2.0}]}, "
        "open(sys.argv[sys.argv.index('--json') + 1], 'w'))\n")
    monkeypatch.setattr(run_all, "BENCH", tmp_path)
    monkeypatch.setattr(run_all, "BENCHMARKS", {"boom": ("boom.py", []), "fine": ("fine.py", [])})
    assert run_all.main(["--out", str(tmp_path / "out")]) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"]["boom"].startswith("failed (exit 3)")
    assert summary["ratios"] == [{"benchmark": "fine", "what": "x", "ratio": 1.5, "goal": 2.0}]
    assert ">= 2.0x: NOT met" in (tmp_path / "out" / "summary.md").read_text()
    assert run_all.main(["--out", str(tmp_path / "out"), "--only", "fine"]) == 0
    assert run_all.main(["--out", str(tmp_path / "out"), "--only", "fine", "--strict"]) == 1


def test_ddp_ratio_against_its_goal_and_the_ceiling():
    rows = run_all.ratio_rows("ddp_scaling", {"speedup_2_vs_1": 1.5, "ceiling_2_independent": 1.8,
                                              "goal": 1.7})
    assert [(r["ratio"], r["goal"]) for r in rows] == [(1.5, 1.7), (1.8, None)]


def test_summary_only_reads_earlier_results(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ring_allreduce.json").write_text(json.dumps(RING))
    assert run_all.main(["--out", str(out), "--summary-only", "--only", "ring_allreduce"]) == 0
    assert "course ring / gloo, 2 ranks, 16 MB | 0.82x | >= 0.8x: met" in (out / "summary.md").read_text()
    assert run_all.main(["--out", str(out), "--summary-only", "--only", "mirrored"]) == 1


FIRST_PARTY = ("helpers", "dpc_runtime", "dpc_setup", "dpc_instructor", "dpc_maintainer")


def first_party_imports(path):
    """(line, module, name or None) of every import of the course's own packages in a script."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in FIRST_PARTY]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in FIRST_PARTY:
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def test_every_benchmark_and_example_imports_what_exists():
    """Every import of the course's packages in benchmarks/ and examples/ (inside functions too) names a
    module or a name that exists: a stale one (helpers.launch, a module no more: `make bench` failed,
    issue 56) fails here, not in front of a student."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = sorted([*(root / "benchmarks").glob("*.py"), *(root / "examples").rglob("*.py")])
    assert len(scripts) >= 10, scripts
    stale = []
    for path in scripts:
        for line, module, name in first_party_imports(path):
            try:
                imported = importlib.import_module(module)
            except ImportError as err:
                stale.append(f"{path.relative_to(root)}:{line}: {module}: {err}")
                continue
            if name is not None and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    stale.append(f"{path.relative_to(root)}:{line}: {module} has no {name}")
    assert not stale, "\n".join(stale)
