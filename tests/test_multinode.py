"""helpers.multinode: "nodes" on one machine, SLURM variable mapping, and the slurm/ batch scripts.

Launch tests record every worker's pid (as tests/test_launch.py does) and check that no process
of the launch survives a success, a crash or a timeout.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import LaunchError, free_port
from helpers.multinode import (horovodrun_hosts, launch_nodes, parse_hosts, remote_hosts,
                               slurm_tasks, tf_config_from_slurm, torch_env_from_slurm,
                               torchrun_node_argv)

sys.path.insert(0, str(Path(__file__).parent))
from test_launch import RANKS, assert_no_orphans  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "scaling"
SLURM = sorted((ROOT / "slurm").glob("*.sbatch"))

# A plain-process task for slurm_tasks: records its pid, then behaves as argv[1] says.
TASK = """\
import os, sys, time
from pathlib import Path
task = int(os.environ["SLURM_PROCID"])
Path(os.environ["DPC_TEST_PIDDIR"], f"{task}-{os.getpid()}").touch()
print("task", task, "of", os.environ["SLURM_NTASKS"], "local", os.environ["SLURM_LOCALID"],
      "node", os.environ["SLURM_NODEID"], flush=True)
if sys.argv[1] == "crash" and task == 1:
    raise SystemExit("task 1 fails on purpose")
if sys.argv[1] in ("crash", "hang"):
    time.sleep(600)
"""


@pytest.fixture
def task_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "task.py"  # not in tmp_path: that holds the pids
    path.write_text(TASK)
    return path


# --- host lists (horovodrun -H) -------------------------------------------------------------------

def test_parse_hosts():
    assert parse_hosts("localhost:2,127.0.0.1:2") == [("localhost", 2), ("127.0.0.1", 2)]
    assert parse_hosts("node1") == [("node1", 1)]
    for bad in ("", "a:x", "a:0", "a:2,,b:2", ":2"):
        with pytest.raises(ValueError, match="bad host entry"):
            parse_hosts(bad)


def test_loopback_names_are_local_and_others_remote():
    assert remote_hosts("localhost:2,127.0.0.1:2") == []
    assert remote_hosts("localhost:1,no-such-host.invalid:1") == ["no-such-host.invalid"]


def test_horovodrun_hosts_refuses_what_would_need_ssh(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("")
    with pytest.raises(ValueError, match="ssh"):
        horovodrun_hosts(script, "localhost:1,no-such-host.invalid:1")
    with pytest.raises(ValueError, match="offer only 2 slot"):
        horovodrun_hosts(script, "localhost:1,127.0.0.1:1", np=3)


# --- SLURM -> launcher variables ------------------------------------------------------------------

SLURM_ENV = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_NTASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "gpu01", "MASTER_PORT": "29500"}


def test_torch_env_from_slurm():
    assert torch_env_from_slurm(SLURM_ENV) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                               "LOCAL_WORLD_SIZE": "4"}
    with pytest.raises(KeyError, match="MASTER_ADDR"):
        torch_env_from_slurm({k: v for k, v in SLURM_ENV.items() if k != "MASTER_ADDR"})
    with pytest.raises(ValueError, match="not in 0..7"):
        torch_env_from_slurm({**SLURM_ENV, "SLURM_PROCID": "8"})


def test_tf_config_from_slurm():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "TF_WORKERS": "gpu01:12345,gpu02:12345"}
    assert json.loads(tf_config_from_slurm(env)) == {
        "cluster": {"worker": ["gpu01:12345", "gpu02:12345"]}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError, match="one host:port per task"):
        tf_config_from_slurm({**env, "SLURM_NTASKS": "3"})
    with pytest.raises(KeyError, match="TF_WORKERS"):
        tf_config_from_slurm({"SLURM_PROCID": "0"})


# --- torchrun "nodes" -------------------------------------------------------------------------------

def test_torchrun_node_argv_is_the_same_on_every_node():
    argv = torchrun_node_argv("w.py", 2, 4, "host:29500", "job7", ["--x"], python="py")
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
            "--rdzv-endpoint=host:29500", "--rdzv-id=job7"} <= set(argv)
    assert argv[-2:] == ["w.py", "--x"]
    assert not any(a.startswith("--node-rank") for a in argv)  # the rendezvous assigns it


@pytest.mark.parametrize("bad", [0, True, 1.5])
def test_launch_nodes_bad_counts(bad):
    with pytest.raises(ValueError, match="integer >= 1"):
        launch_nodes(RANKS, bad)


@pytest.mark.timeout(240)
def test_two_nodes_meet_and_all_reduce(tmp_path, capsys):
    result = launch_nodes(RANKS, 2, 1, args=["ok"], env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert result.nprocs == 2 and len(result.commands) == 2
    assert result.commands[0] == result.commands[1]  # one command, run once per node
    for r in (0, 1):  # the global rank tags each line, although each node has local rank 0
        assert f"rank {r} sum 3" in result.lines(r)
    assert "[rank 1] rank 1 sum 3" in capsys.readouterr().out
    assert_no_orphans(tmp_path)


@pytest.mark.timeout(240)
def test_two_nodes_crash_names_the_rank_and_stops_both(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch_nodes(RANKS, 2, 1, args=["crash"], echo=False, timeout=180,
                     env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert_no_orphans(tmp_path)
    assert info.value.ranks == [1]
    assert "fails on purpose" in str(info.value)


@pytest.mark.timeout(180)
def test_two_nodes_hang_times_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchError, match="timed out after 25 s"):
        launch_nodes(RANKS, 2, 1, args=["hang"], echo=False, timeout=25,
                     env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert time.monotonic() - start < 90
    assert_no_orphans(tmp_path)


# --- srun-like tasks ------------------------------------------------------------------------------

def test_slurm_tasks_set_what_srun_sets(tmp_path, task_script):
    result = slurm_tasks(task_script, 4, ntasks_per_node=2, args=["ok"],
                         env={"DPC_TEST_PIDDIR": str(tmp_path)}, echo=False)
    assert [result.lines(t) for t in range(4)] == [
        ["task 0 of 4 local 0 node 0"], ["task 1 of 4 local 1 node 0"],
        ["task 2 of 4 local 0 node 1"], ["task 3 of 4 local 1 node 1"]]
    assert_no_orphans(tmp_path, {0, 1, 2, 3})


def test_slurm_tasks_crash_stops_the_others(tmp_path, task_script):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        slurm_tasks(task_script, 2, args=["crash"], env={"DPC_TEST_PIDDIR": str(tmp_path)},
                    echo=False, timeout=120)
    assert time.monotonic() - start < 60  # task 0 would sleep 600 s: it was stopped
    assert info.value.ranks == [1]
    assert "fails on purpose" in str(info.value)
    assert_no_orphans(tmp_path)


def test_slurm_tasks_hang_times_out(tmp_path, task_script):
    with pytest.raises(LaunchError, match="timed out after 5 s") as info:
        slurm_tasks(task_script, 2, args=["hang"], env={"DPC_TEST_PIDDIR": str(tmp_path)},
                    echo=False, timeout=5)
    assert info.value.ranks == [0, 1]
    assert_no_orphans(tmp_path)


@pytest.mark.timeout(240)
def test_ddp_worker_under_srun_variables():
    """What slurm/ddp_srun.sbatch does on 2 nodes: srun's variables, MASTER_* exported, no torchrun."""
    env = {"MASTER_ADDR": "localhost", "MASTER_PORT": str(free_port())}
    result = slurm_tasks(EXAMPLES / "ddp_worker.py", 2, args=["train", "--epochs", "1"], env=env,
                         echo=False, timeout=200)
    for t in (0, 1):
        assert any(ln.startswith(f"rank {t} of 2: local_rank 0, node {t},") for ln in result.lines(t))
        assert "weights identical on all ranks: True" in result.lines(t)[-1]
        assert result.report(t)["same_weights"] is True, result.report(t)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovodrun_two_hosts_on_one_machine():
    result = horovodrun_hosts(EXAMPLES / "hvd_worker.py", "localhost:1,127.0.0.1:1", echo=False,
                              timeout=240)
    for r in (0, 1):
        assert any(f"cross_rank {r} of 2" in ln for ln in result.lines(r))
        assert f"rank {r}: weights identical on all ranks: True" in result.lines(r)
        got = result.report(r)  # what hvd_worker.py reported
        assert got["cross_rank"] == r and got["same_weights"] is True, got


# --- the batch scripts --------------------------------------------------------------------------------

def test_there_is_a_batch_script_per_launcher():
    assert {p.name for p in SLURM} >= {"torchrun.sbatch", "horovod.sbatch", "tf_multiworker.sbatch"}


@pytest.mark.parametrize("script", [p for p in SLURM if p.name != "solutions.sbatch"],
                         ids=lambda p: p.name)
def test_batch_script_is_valid_bash_and_runs_files_that_exist(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=" in text
    assert 'scontrol show hostnames "${SLURM_JOB_NODELIST}"' in text
    ran = re.findall(r"\b(examples/\S+\.py)\b", "\n".join(
        ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    assert ran, f"{script.name} runs no worker of examples/"
    for rel in ran:
        assert (ROOT / rel).is_file(), f"{script.name} runs {rel}, which does not exist"
    assert os.access(ROOT / ran[0], os.R_OK)


def test_solutions_batch_script_runs_make_solutions_on_one_node():
    script = ROOT / "slurm" / "solutions.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gres=gpu:" in text
    assert [ln for ln in text.splitlines() if ln.startswith("make ")] == ["make setup", "make solutions"]
