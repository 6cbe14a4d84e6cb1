"""dpc_maintainer.needs: the Needs line from measured seconds, written into a notebook, a class-node run
that leaves no cgroup and no classmate behind (issue 35), and a busy-node run that leaves no hog behind
(issue 43)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from dpc_instructor.hub.cgroups import cgroup_mounts
from dpc_maintainer.needs import HOG, NEEDS, minutes, rewrite_needs, write
from helpers.timing import usable_cores

pytestmark = pytest.mark.gate  # tests/tiers.py

OLD = ("# Chapter\n\n**Needs:** 2 CPU cores, 3 GB of memory, about 1 minute on a 2-core laptop without a GPU "
       "(one GPU: not measured yet).\n\nMore text.")


def test_minutes_are_the_nearest_whole_minute_and_at_least_one():
    assert [minutes(s) for s in (5, 89, 90, 149, 151, 300)] == [1, 1, 2, 2, 3, 5]


def test_an_old_line_gets_the_figures_and_a_new_one_is_measured_again():
    new = rewrite_needs(OLD, idle_s=70, busy_s=130, share=1.5, loaded_s=290, load=8)
    assert new == ("# Chapter\n\n**Needs:** 2 CPU cores, 3 GB of memory, about 1 minute on a 2-core laptop "
                   "without a GPU, about 2 minutes at a class hub's share (1.5 cores, a classmate's launch "
                   "beside it), about 5 minutes on a busy node (load 8 on 2 cores) (one GPU: not measured "
                   "yet).\n\nMore text.")
    again = rewrite_needs(new, idle_s=200, busy_s=290, share=2)  # the busy node not measured this time
    found = NEEDS.search(again)
    assert found and (found["idle"], found["busy"], found["share"], found["gb"]) == ("3", "5", "2", "3")
    assert (found["loaded"], found["load"]) == ("5", "8")
    assert again.endswith("\n\nMore text.")


def test_a_line_with_two_figures_gets_the_busy_nodes_and_keeps_its_own():
    two = ("**Needs:** 2 CPU cores, 3 GB of memory, about 1 minute on a 2-core laptop without a GPU, about 2 "
           "minutes at a class hub's share (1.5 cores, a classmate's launch beside it) (one GPU: about 1 minute).")
    assert not NEEDS.search(two)
    found = NEEDS.search(rewrite_needs(two, loaded_s=420, load=8))
    assert found and (found["idle"], found["busy"], found["share"], found["loaded"], found["gpu"]) == \
        ("1", "2", "1.5", "7", "about 1 minute")


def test_a_notebook_without_a_needs_line_or_a_figure_is_refused():
    with pytest.raises(ValueError, match="no Needs line in the notebook's opening"):
        rewrite_needs("# Chapter\n\nNo line here.", 60, 60, 1.5, 300, 8)
    with pytest.raises(ValueError, match="the Needs line has no busy node's figure yet"):
        rewrite_needs(OLD, idle_s=60, busy_s=60, share=1.5)


def test_write_puts_the_measured_minutes_into_the_notebooks_measured(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": OLD.splitlines(keepends=True)},
                    {"cell_type": "code", "metadata": {}, "source": ["x = 1\n"], "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for name in ("a.ipynb", "b.ipynb"):
        (tmp_path / name).write_text(json.dumps(nb))
    out = tmp_path / "needs"
    for mode, runs in (("idle", {"a.ipynb": 100.0, "b.ipynb": 50.0}), ("class-node", {"a.ipynb": 170.0}),
                       ("busy-node", {"a.ipynb": 530.0})):
        (out / mode).mkdir(parents=True)
        (out / mode / "report.json").write_text(json.dumps({"notebooks": [
            {"notebook": k, "seconds": v, "status": "passed"} for k, v in runs.items()]}))
    (out / "class-node" / "conditions.json").write_text(json.dumps({"cpu": 1.5}))
    (out / "busy-node" / "conditions.json").write_text(json.dumps({"load": 8}))
    with pytest.raises(ValueError, match="no class hub's figure yet"):
        write(out, root=tmp_path)  # b.ipynb: measured idle only, and its line has no other figure
    assert json.loads((tmp_path / "a.ipynb").read_text()) == nb  # nothing written when one line cannot be
    (out / "idle" / "report.json").write_text(json.dumps({"notebooks": [
        {"notebook": "a.ipynb", "seconds": 100.0, "status": "passed"},
        {"notebook": "b.ipynb", "seconds": 50.0, "status": "failed"}]}))
    table = write(out, root=tmp_path)
    assert table.splitlines()[2] == "| a.ipynb | 100 s | 170 s | 530 s | 1.70 | 5.30 |" and len(table.splitlines()) == 3
    a = "".join(json.loads((tmp_path / "a.ipynb").read_text())["cells"][0]["source"])
    assert ("about 2 minutes on a 2-core laptop without a GPU, about 3 minutes at a class hub's share (1.5 "
            "cores, a classmate's launch beside it), about 9 minutes on a busy node (load 8 on 2 cores)") in a
    assert json.loads((tmp_path / "b.ipynb").read_text()) == nb  # its run failed: left as it was


def _groups() -> list[Path]:
    v2, v1 = cgroup_mounts()
    return [p for m in ([v2] if v2 else list(v1.values())) for p in m.glob("dpc-needs-*")]


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
@pytest.mark.timeout(300)
def test_a_class_node_run_leaves_no_cgroup_and_no_classmate_behind(tmp_path):
    # No notebook matches: the runner ends at once (before the classmate's first launch could end: two
    # ranks importing torch), the classmate is stopped, and the run says it had no classmate beside it.
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.needs", "measure", "--mode", "class-node",
                           "--only", "no-such-notebook", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the classmate's launch never finished once" in done.stderr
    conditions = json.loads((tmp_path / "class-node" / "conditions.json").read_text())
    assert conditions["cpu"] == 1.5 and conditions["classmate_launches"] == 0
    assert conditions["classmate_cpu"] == max(0.5, len(os.sched_getaffinity(0)) - 1.5)
    # Removing a cgroup kills what is in it first: none left means no classmate's rank was left either.
    assert not _groups(), "the run's cgroups were left"
    mates = [p for p in psutil.process_iter(["cmdline"]) if "classmate" in (p.info["cmdline"] or [])]
    assert not mates, "the classmate's loop was left running"


@pytest.mark.timeout(300)
def test_a_busy_node_run_leaves_no_hog_behind(tmp_path):
    # No notebook matches: the runner ends at once; the hogs it started are stopped and said.
    load = int(usable_cores()) + 2  # two hogs beside the notebook's threads
    done = subprocess.run([sys.executable, "-m", "dpc_maintainer.needs", "measure", "--mode", "busy-node",
                           "--load", str(load), "--only", "no-such-notebook", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    conditions = json.loads((tmp_path / "busy-node" / "conditions.json").read_text())
    assert conditions["load"] == load and len(conditions["hog_pids"]) == conditions["hogs"] == 2, done.stderr
    hogs = [p for p in psutil.process_iter(["pid", "cmdline"])
            if p.info["pid"] in conditions["hog_pids"] and (p.info["cmdline"] or [])[-1:] == [HOG]]
    assert not hogs, "the run's CPU hogs were left running"
