"""src/dpc_maintainer/solutions.py (`make solutions`): parameters per hardware, declared sections skipped with a
reason, a report per notebook, and a non-zero exit when a notebook fails."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from dpc_maintainer import solutions

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {"ci": {"N": 2}, "gpu": {"N_DEVICES": "gpus", "KIND": "gpu"},
            "sections": {"RUN_TORCH_SYNCBN": {"gpus": 2, "what": "torch.nn.SyncBatchNorm"}}}


def hw(gpus: int) -> solutions.Hardware:
    return solutions.Hardware(2, gpus, ["H200"] * gpus, f"{gpus} GPUs")


def test_cpu_machine_skips_the_two_gpu_section_and_says_why():
    p = solutions.plan("nb.ipynb", SETTINGS, hw(0), ci=True)
    assert p.parameters == {"N": 2, "RUN_TORCH_SYNCBN": False}
    assert p.skipped == {"RUN_TORCH_SYNCBN": "torch.nn.SyncBatchNorm needs 2 GPU(s); this machine has 0"}


def test_one_gpu_gets_gpu_parameters_but_still_skips():
    p = solutions.plan("nb.ipynb", SETTINGS, hw(1), ci=False)
    # N_DEVICES keeps the notebook's default: logical GPUs carved from the one GPU
    assert p.parameters == {"KIND": "gpu", "RUN_TORCH_SYNCBN": False}
    assert "has 1" in p.skipped["RUN_TORCH_SYNCBN"]


def test_a_section_whose_default_is_none_is_left_to_the_notebook_without_gpus():
    # A run with the defaults stays one (outputs.writeback refuses injected parameters).
    p = solutions.plan("nb.ipynb", SETTINGS, hw(0), ci=False, default={"RUN_TORCH_SYNCBN": None})
    assert p.parameters == {}
    assert "has 0" in p.skipped["RUN_TORCH_SYNCBN"]
    p = solutions.plan("nb.ipynb", SETTINGS, hw(2), ci=False, default={"RUN_TORCH_SYNCBN": None})
    assert p.parameters["RUN_TORCH_SYNCBN"] is True


def test_defaults_are_read_from_the_parameters_cell(tmp_path):
    path = notebook(tmp_path / "nb.ipynb", "N = 10\nRUN_X = None  # auto\nSIZES = [1, 2]\nF = len([])",
                    "M = 3")
    assert solutions.defaults(path) == {"N": 10, "RUN_X": None, "SIZES": [1, 2]}


def test_four_gpus_run_everything():
    p = solutions.plan("nb.ipynb", SETTINGS, hw(4), ci=False)
    assert p.parameters == {"N_DEVICES": 4, "KIND": "gpu", "RUN_TORCH_SYNCBN": True}
    assert p.skipped == {}


def notebook(path: Path, *sources: str, metrics: dict | None = None) -> Path:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells[0].metadata["tags"] = ["parameters"]
    if metrics:
        nb.cells[-1].metadata[solutions.METRICS] = metrics
    nbformat.write(nb, path)
    return path


def test_runs_notebooks_reports_and_fails_on_error(tmp_path):
    (tmp_path / "nbs").mkdir()  # the kernels run there, not where the command was started
    good = notebook(tmp_path / "nbs" / "good.ipynb", "N = 10\nRUN_TORCH_SYNCBN = True",
                    "print(f'{N} squared is {N * N}; 2 N is {2 * N}; odd: {N % 2 == 1}')\n"
                    "print('sync bn' if RUN_TORCH_SYNCBN else 'sync bn skipped')",
                    metrics={"squares": r"squared is (\d+)", "times_{}": r"(\d) N is (\d+)",
                             "odd": r"odd: (\w+)", "absent": r"never printed (\d+)"})
    bad = notebook(tmp_path / "nbs" / "bad.ipynb", "N = 1", "raise ValueError(f'broken with N={N}')")
    manifest = tmp_path / "notebooks.yml"
    manifest.write_text(f"{good}:\n  ci: {{N: 3}}\n  sections:\n    RUN_TORCH_SYNCBN: "
                        f"{{gpus: 2, what: torch SyncBN}}\n{bad}:\n  ci: {{N: 4}}\n")
    out = tmp_path / "out"
    # --out relative to where make runs: the kernels run beside their notebooks
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.solutions", "--ci",
                           "--manifest", str(manifest), "--out", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    by_name = {r["notebook"]: r for r in report["notebooks"]}
    assert by_name["good.ipynb"]["status"] == "passed"
    # read from what the cell printed, by the regexes of its metadata; nothing for what it did not print
    assert by_name["good.ipynb"]["metrics"] == {"squares": 9, "times_2": 6, "odd": True}
    assert by_name["good.ipynb"]["skipped"] == {
        "RUN_TORCH_SYNCBN": "torch SyncBN needs 2 GPU(s); this machine has 0"}
    executed = nbformat.read(out / "good.ipynb", as_version=4)
    assert "sync bn skipped" in executed.cells[-1].outputs[0]["text"]
    assert by_name["bad.ipynb"]["status"] == "failed"
    assert "ValueError: broken with N=4" in by_name["bad.ipynb"]["error"]
    md = (out / "report.md").read_text()
    assert "1 passed, 1 failed." in md and "RUN_TORCH_SYNCBN: torch SyncBN needs 2 GPU(s)" in md


def test_unknown_selection_is_one_clear_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.solutions", "--only", "nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no notebook in" in done.stderr and "matches 'nope'" in done.stderr


def test_reported_reads_the_printed_values_named_in_cell_metadata():
    cell = {"cell_type": "code", "metadata": {solutions.METRICS: {
        "diff": r"max \|difference\|: (\S+)", "without_{}": r"^\s*(rng|sampler)\s+(\S+)"}},
        "outputs": [{"output_type": "stream", "name": "stdout",
                     "text": ["max |difference|: 0.000123456\n", "   rng  0.18  masks\n", "sampler  2.5e-07\n"]}]}
    plain = {"cell_type": "code", "metadata": {}, "outputs": [{"output_type": "stream", "text": "diff: 7\n"}]}
    assert solutions.reported({"cells": [plain, cell]}) == {"diff": 0.0001235, "without_rng": 0.18,
                                                            "without_sampler": 2.5e-07}
