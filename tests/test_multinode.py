"""helpers.multinode: "nodes" on one machine, SLURM variable mapping, and the slurm/ batch scripts.

Launch tests record every worker's pid (as tests/test_launch.py does) and check that no process
of the launch survives a success, a crash or a timeout.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from test_launch import RANKS, assert_no_orphans  # noqa: E402

from helpers import LaunchError, free_port
from helpers.multinode import (
    horovodrun_hosts,
    launch_nodes,
    parse_hosts,
    remote_hosts,
    slurm_tasks,
    tf_config_from_slurm,
    torch_env_from_slurm,
    torchrun_node_argv,
)
from helpers.worker import place, slurm_place, slurm_tasks_per_node

pytestmark = pytest.mark.gate  # tests/tiers.py

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
if sys.argv[1] == "crash" and task == 1:  # once task 0 runs too (under load it may start seconds later)
    end = time.monotonic() + 60
    while not list(Path(os.environ["DPC_TEST_PIDDIR"]).glob("0-*")) and time.monotonic() < end:
        time.sleep(0.05)
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

# What a REAL `srun -N2 -n4 --label env` printed (SLURM 22.05.8, the two-node cluster of
# src/dpc_setup/cluster.py; SLURM_CONF, ports and pids shortened). No --ntasks-per-node: SLURM puts 3 tasks
# on node1 and 1 on node2, says so in SLURM_STEP_TASKS_PER_NODE=3,1, and sets no
# SLURM_NTASKS_PER_NODE. tests/test_cluster.py checks the same mapping live on the cluster.
SRUN_N2_N4_COMMON = {
    "SLURM_CLUSTER_NAME": "dpc", "SLURM_CONF": "/tmp/dpc-slurm-p2v6zxu4/etc/slurm.conf",
    "SLURM_JOBID": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "env", "SLURM_JOB_CPUS_PER_NODE": "3,1",
    "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root", "SLURM_LABELIO": "1",
    "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_NNODES": "2", "SLURM_NODELIST": "node[1-2]",
    "SLURM_NPROCS": "4", "SLURM_NTASKS": "4", "SLURM_PRIO_PROCESS": "0",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_SRUN_COMM_PORT": "43655", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_LAUNCHER_PORT": "43655", "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "3,1",
    "SLURM_SUBMIT_DIR": "/work/main", "SLURM_SUBMIT_HOST": "vm", "SLURM_TASKS_PER_NODE": "3,1",
    "SLURM_TOPOLOGY_ADDR_PATTERN": "node", "SLURM_UMASK": "0022",
    "SLURM_WORKING_CLUSTER": "dpc:localhost:50437:9728:109"}
SRUN_N2_N4 = [{**SRUN_N2_N4_COMMON, "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node,
               "SLURM_PROCID": str(task), "SLURM_LOCALID": local, "SLURM_NODEID": nodeid,
               "SLURM_CPUS_ON_NODE": cpus, "SLURM_GTIDS": gtids, "SLURM_TASK_PID": str(16775 + task)}
              for task, (node, local, nodeid, cpus, gtids) in enumerate([
                  ("node1", "0", "0", "3", "0,1,2"), ("node1", "1", "0", "3", "0,1,2"),
                  ("node1", "2", "0", "3", "0,1,2"), ("node2", "0", "1", "1", "3")])]
MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_torch_env_and_place_read_a_real_srun_alike():
    """One mapping: torch_env_from_slurm and helpers.worker.place agree on every task of a real srun."""
    want = [("0", "0", "3"), ("1", "1", "3"), ("2", "2", "3"), ("3", "0", "1")]  # rank, local, on node
    for env, (rank, local, local_world) in zip(SRUN_N2_N4, want):
        torch_env = torch_env_from_slurm({**env, **MASTER})
        assert torch_env == {"RANK": rank, "WORLD_SIZE": "4", "LOCAL_RANK": local,
                             "LOCAL_WORLD_SIZE": local_world}
        me = place(env)
        assert (me.source, str(me.rank), str(me.world_size), str(me.local_rank),
                str(me.local_world_size)) == ("slurm", rank, "4", local, local_world)


def test_slurm_place_layouts_and_errors():
    assert slurm_tasks_per_node("3,1") == [3, 1]
    assert slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="cannot read SLURM task counts"):
        slurm_tasks_per_node("2(x)")
    # --ntasks-per-node=4 on 2 nodes: what srun sets then (SLURM_NTASKS_PER_NODE as well)
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", **MASTER}
    assert torch_env_from_slurm(env) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                         "LOCAL_WORLD_SIZE": "4"}
    # a hand-made environment without any layout: tasks spread evenly over SLURM_NNODES
    assert slurm_place({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}).local_world_size == 2
    with pytest.raises(KeyError, match="MASTER_ADDR"):
        torch_env_from_slurm(SRUN_N2_N4[0])
    with pytest.raises(ValueError, match="not in 0..3"):
        torch_env_from_slurm({**SRUN_N2_N4[0], **MASTER, "SLURM_PROCID": "4"})


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
def test_two_nodes_hang_is_found_and_blamed(tmp_path):
    # The watchdog starts once both nodes' ranks have started: a loaded machine's slow start-up
    # is not a hang (a 25 s timeout on the whole launch was).
    with pytest.raises(LaunchError, match="hung: no rank printed a line for 5 s after all 2 had started: "
                                          "rank 1 never reached the communication rank 0 waited for"):
        launch_nodes(RANKS, 2, 1, args=["hang"], echo=False, timeout=150, idle_timeout=5,
                     env={"DPC_TEST_PIDDIR": str(tmp_path)})
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


@pytest.mark.parametrize("script", SLURM, ids=lambda p: p.name)
def test_batch_script_defaults_to_gpus_and_documents_the_cpu_override(script):
    """GPU shape in #SBATCH lines; its header shows the sbatch line that runs it on CPU nodes."""
    text = script.read_text()
    assert re.search(r"^#SBATCH --gpus-per-node=[1-9]", text, re.M), "GPU nodes are the default"
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("# "))
    assert re.search(rf"sbatch --gpus-per-node=0 .*slurm/{script.name}", header), \
        f"{script.name}: document the CPU override (sbatch --gpus-per-node=0 ... slurm/{script.name})"
    assert "SLURM_SUBMIT_DIR" not in text  # runs where sbatch put it (--chdir works), with .venv


def test_solutions_batch_script_runs_make_solutions_on_one_node():
    script = ROOT / "src" / "dpc_maintainer" / "solutions.sbatch"  # the maintainers': needs solutions/
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gpus-per-node=" in text
    assert [ln for ln in text.splitlines() if ln.startswith("make ")] == [
        "make setup", 'make solutions SOLUTIONS_ARGS="${SOLUTIONS_ARGS:-}"']
