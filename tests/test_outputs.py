"""src/dpc_maintainer/outputs.py: committed notebooks carry no run metadata and no machine's paths."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpc_maintainer import outputs

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]


def notebook(text: str) -> dict:
    return {"metadata": {"papermill": {"duration": 1}}, "cells": [
        {"cell_type": "code", "metadata": {"papermill": {}, "execution": {"x": 1}, "tags": ["t"]},
         "source": "", "outputs": [
             {"output_type": "stream", "name": "stderr", "text": [text]},
             {"output_type": "error", "ename": "E", "evalue": text, "traceback": [text]},
             {"output_type": "execute_result", "data": {"text/plain": text, "image/png": "AAAA"}}]}]}


def test_scrub_makes_the_checkout_relative_and_drops_run_metadata():
    root = Path("/home/someone/dp-course")
    nb = outputs.scrub(notebook(f'File "{root}/course/runs/10/train.py", line 3\n'), root)
    outs = nb["cells"][0]["outputs"]
    assert outs[0]["text"] == ['File "course/runs/10/train.py", line 3\n']
    assert outs[1]["evalue"] == 'File "course/runs/10/train.py", line 3\n'
    assert outs[2]["data"] == {"text/plain": 'File "course/runs/10/train.py", line 3\n', "image/png": "AAAA"}
    assert nb["metadata"] == {} and nb["cells"][0]["metadata"] == {"tags": ["t"]}
    assert outputs.leaks(nb, root) == []
    untagged = {"metadata": {}, "cells": [{"cell_type": "markdown", "metadata": {"tags": []}, "source": ""}]}
    assert outputs.scrub(untagged, root)["cells"][0]["metadata"] == {}  # papermill's empty tags go


def test_leaks_sees_any_checkout_but_not_urls_or_system_paths():
    here = Path("/nowhere")
    assert outputs.leaks(notebook("  /work/main/.venv/lib/python3.11/site-packages/torch/x.py\n"), here) == [0]
    assert outputs.leaks(notebook("see /srv/a/b/course/runs/x.py"), here) == [0]
    assert outputs.leaks(notebook("https://github.com/tensorflow/models/tools/x.py /usr/lib/python3/x.py"), here) == []


def test_committed_notebooks_show_no_checkout_path():
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.outputs", "check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# Committed before outputs were stamped (dpc_maintainer.outputs.stamp) and not re-executed since:
# a notebook leaves this list when it is run and written back; none may join it.
UNSTAMPED: set[str] = set()  # every chapter and solution is stamped (stop 29)


def test_committed_outputs_belong_to_the_code_above_them():
    unstamped = set()
    for path in outputs.committed():
        nb = json.loads(path.read_text())
        name = str(path.relative_to(ROOT))
        if not outputs.stamped(nb):
            unstamped.add(name)
            continue
        assert not outputs.stale(nb), f"{name}: cells {outputs.stale(nb)} were not run from the code above them"
    assert unstamped <= UNSTAMPED, f"written back without stamps: {sorted(unstamped - UNSTAMPED)}"
    assert UNSTAMPED <= unstamped, f"stamped now, take them off UNSTAMPED: {sorted(UNSTAMPED - unstamped)}"


def test_a_hand_edited_code_cell_makes_it_and_every_later_output_stale():
    path = ROOT / "solutions/02-mirrored-strategy/mirrored-strategy.ipynb"
    nb = json.loads(path.read_text())
    assert outputs.stamped(nb) and outputs.stale(nb) == []
    ran = [i for i, c in enumerate(nb["cells"]) if outputs.executed(c)]
    edited = ran[3]
    nb["cells"][edited]["source"] = nb["cells"][edited]["source"] + ["\n# a comment, added by hand\n"]
    assert outputs.stale(nb) == [i for i in ran if i >= edited]
    markdown = json.loads(path.read_text())
    first_md = next(i for i, c in enumerate(markdown["cells"]) if c["cell_type"] == "markdown")
    markdown["cells"][first_md]["source"] = ["prose only\n"]
    assert outputs.stale(markdown) == []  # prose is not what produced an output
    assert outputs.stale(outputs.stamp(nb)) == []  # a writeback after the run stamps it again
