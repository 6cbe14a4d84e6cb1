"""Every batch script of slurm/ on a real two-node SLURM cluster (src/dpc_setup/cluster.py), on the CPU.

One cluster is brought up for the module (a few seconds); all scripts are submitted at once and
SLURM schedules them, as on a real cluster; each test waits for its own job and reads what every
rank reported (the `DPC-RESULT` lines of helpers.worker). About 1.5 minutes on 2 cores.
Where no cluster can run (no slurm-wlm / munge, or not root) the whole module is skipped with one
reason.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import guardians
import pytest

from dpc_setup import cluster as tool

pytestmark = pytest.mark.gate  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]

WHY = tool.unavailable()
if WHY:
    pytest.skip(f"no SLURM cluster here: {WHY}", allow_module_level=True)

# Every batch script must have a Case: slurm/'s and the maintainers' `make solutions` on SLURM.
SCRIPTS = sorted([p.name for p in (ROOT / "slurm").glob("*.sbatch")] + ["solutions.sbatch"])


def _alive(pid: int) -> bool:
    """True when pid is a live process (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _comm(pid: int) -> str:
    """The process's command name, or '' when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def slurm() -> Iterator[tool.Cluster]:
    """The module's two-node cluster, up once."""
    with tool.cluster() as c:
        yield c


@pytest.fixture(scope="module")
def submitted(slurm: tool.Cluster) -> dict[str, tuple[tool.Case, str]]:
    """Every script of slurm/ submitted at once in its CPU shape: script name -> (case, job id)."""
    return {k.script: (k, slurm.sbatch(k.path, k.options, k.env, k.args))
            for k in tool.cases(slurm.folder)}


@pytest.mark.timeout(120)
def test_srun_places_tasks_as_helpers_worker_reads_them(slurm):
    """srun -N2 -n4: each task's helpers.worker.place() matches where SLURM really put it."""
    code = ("import json, os; from helpers.worker import place; w = place(); "
            "print(json.dumps([w.rank, w.world_size, w.local_rank, w.local_world_size, "
            "os.environ['SLURMD_NODENAME']]))")
    out = slurm.run("srun", "-N2", "-n4", str(ROOT / ".venv" / "bin" / "python"), "-c", code, timeout=90)
    got = sorted(json.loads(line) for line in out.splitlines() if line.startswith("["))
    assert got == [[0, 4, 0, 3, "node1"], [1, 4, 1, 3, "node1"], [2, 4, 2, 3, "node1"],
                   [3, 4, 0, 1, "node2"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", SCRIPTS)
def test_batch_script_runs_on_the_cluster(script, slurm, submitted):
    assert script in submitted, f"slurm/{script} has no Case in src/dpc_setup/cluster.py's cases(): add its CPU shape"
    case, job_id = submitted[script]
    job = slurm.wait(job_id, case.timeout)
    problems = tool.check(case, job)
    tail = "\n".join(job.output.splitlines()[-30:])
    assert not problems, f"{script}: " + "; ".join(problems) + f"\n--- job output ---\n{tail}"
    if case.ranks:  # every rank reported, with the same weights (check() compared the checksums)
        assert sorted(tool.results(job.output)) == list(range(case.ranks))


def test_results_reads_plain_and_horovod_tagged_lines():
    out = ('DPC-RESULT {"rank":1,"checksum":"ab"}\nnoise\n[0]<stdout>:DPC-RESULT {"rank":0,"checksum":"ab"}\n'
           '[0]<stdout>:DPC-RESULT {"rank":0,"world_size":2}\n')
    assert tool.results(out) == {0: {"checksum": "ab", "world_size": 2}, 1: {"checksum": "ab"}}


def test_check_finds_a_missing_rank_and_different_weights():
    case = tool.Case("ddp_srun.sbatch", [], {}, ranks=2)
    line = 'DPC-RESULT {{"rank":{},"checksum":"{}","world_size":2,"node_name":"{}"}}'
    good = tool.Job("1", "COMPLETED", "0:0", "\n".join([line.format(0, "a", "node1"), line.format(1, "a", "node2")]))
    assert tool.check(case, good) == []
    bad = tool.Job("2", "COMPLETED", "0:0", "\n".join([line.format(0, "a", "node1"), line.format(1, "b", "node1")]))
    assert any("weights differ" in p for p in tool.check(case, bad))
    assert any("expected both" in p for p in tool.check(case, bad))
    one = tool.Job("3", "FAILED", "1:0", line.format(0, "a", "node1"))
    assert len(tool.check(case, one)) >= 2  # the failed job and the missing rank 1


@pytest.mark.timeout(180)
def test_two_clusters_at_once_and_nothing_left_after_teardown(tmp_path):
    """A second cluster beside another (own ports and folder); teardown during a running job leaves nothing."""
    script = tmp_path / "sleep.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun sleep 300\n")
    pids: list[int] = []
    with tool.cluster() as a, tool.cluster() as b:
        assert a.folder != b.folder and set(a.ports.values()).isdisjoint(b.ports.values())
        job = a.sbatch(script)
        end = time.monotonic() + 60
        while a.job(job)["JobState"] != "RUNNING" and time.monotonic() < end:
            time.sleep(0.5)
        assert a.job(job)["JobState"] == "RUNNING"
        assert sorted(b.run("srun", "-N2", "hostname", timeout=60).split()) == [os.uname().nodename] * 2
        end = time.monotonic() + 60  # until the job's srun has started its tasks (sleep 300)
        while True:
            pids = [p.pid for c in (a, b) for p in c.procs.values()] + a.marked() + b.marked()
            names = {_comm(p) for p in pids if _alive(p)}
            if "sleep" in names or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert {"munged", "slurmctld", "slurmd", "slurmstepd", "sleep"} <= names, names
        folders = (a.folder, b.folder)
    assert [p for p in pids if _alive(p)] == []
    assert not any(f.exists() for f in folders)


@pytest.mark.timeout(300)
def test_a_kernel_killed_inside_its_slurm_section_leaves_no_daemon(tmp_path):
    """Issue 39: chapter 10's cluster outlived a kernel stopped by a cell timeout. A real kernel brings up
    the cluster as chapter 10 does, submits a job, and is killed (SIGKILL: no finally runs); the
    guardian (dpc_runtime.reaper) then stops every daemon, job step and task of that cluster."""
    from jupyter_client.manager import start_new_kernel

    from dpc_runtime.reaper import marked

    script = tmp_path / "sleep.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun sleep 300\n")
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        code = (f"from dpc_setup import cluster as slurm_cluster\nimport time\n"
                f"with slurm_cluster.cluster() as c:\n"
                f"    job = c.sbatch({str(script)!r})\n"
                f"    while c.job(job)['JobState'] != 'RUNNING':\n        time.sleep(0.2)\n"
                f"    print('UP', c.id, c.folder, flush=True)\n    time.sleep(3600)\n")
        kc.execute(code)
        cluster_id = folder = ""
        end = time.monotonic() + 200
        while not cluster_id and time.monotonic() < end:  # the kernel's printed line is the event
            msg = kc.get_iopub_msg(timeout=max(1, end - time.monotonic()))
            if msg["msg_type"] == "stream" and msg["content"]["text"].startswith("UP "):
                _, cluster_id, folder = msg["content"]["text"].split()
            assert msg["msg_type"] != "error", msg["content"]
        assert cluster_id, "the cluster never came up in the kernel"
        assert marked(tool.MARKER, cluster_id)  # daemons and the job's tasks are running
    finally:
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # the with-block's finally never runs
        kc.stop_channels()
        km.cleanup_resources()
    end = time.monotonic() + 120
    while (marked(tool.MARKER, cluster_id) or Path(folder).exists()) and time.monotonic() < end:
        time.sleep(0.2)  # until the guardian has removed it all (bounded)
    assert marked(tool.MARKER, cluster_id) == []
    assert not Path(folder).exists()
    assert f"removed {folder}" in guardians.take_log(tool.MARKER, cluster_id)
