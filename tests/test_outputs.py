"""src/dpc_maintainer/outputs.py: committed notebooks carry no run metadata and no machine's paths."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dpc_maintainer import outputs

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
