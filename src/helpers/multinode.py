"""Several "nodes" on one machine, and the SLURM variables a real cluster gives each task (chapter 8).

`launch_nodes` starts one torchrun agent per node (the same command a cluster runs on every
node) that meet at a c10d rendezvous; `horovodrun_hosts` runs horovodrun with a host list;
`slurm_tasks` starts plain processes carrying the SLURM_* variables srun would set, to test a
worker's SLURM → launcher mapping without SLURM. `tf_config_from_slurm` is what
examples/scaling/tf_worker.py calls under srun; `torch_env_from_slurm` spells out the torch mapping
that helpers.worker.start applies, and both take it from helpers.worker.slurm_place, the one SLURM
mapping (unit-tested against the variables a real srun set: tests/test_multinode.py). Every launch
goes through helpers.launch.run_processes: a free port, a timeout, per-rank `[rank N]` output, the
worker protocol's results, one LaunchError naming the rank that stopped taking part, and no process
left behind.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence

import psutil

from dpc_runtime.launch import LaunchResult, console_script, free_port, run_processes, worker_script
from dpc_runtime.worker import slurm_place

# torchrun prefixes worker lines with the *local* rank by default: two nodes would both print
# [rank0]. This template (read by torchrun) makes the prefix the global rank.
PREFIX_TEMPLATE = "[rank${rank}]:"


def torchrun_node_argv(script: str, nnodes: int, nproc_per_node: int, endpoint: str,
                       run_id: str, args: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """The torchrun command of one node of a multi-node job: identical on every node (chapter 8)."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", "--tee=3", "--role=rank",
            script, *args]


def launch_nodes(script: str | os.PathLike[str], nnodes: int = 2, nproc_per_node: int = 1, *,
                 args: Sequence[str] = (), timeout: float = 120.0, idle_timeout: float | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                 echo: bool = True) -> LaunchResult:
    """Run script as a job of nnodes torchrun agents (one process each = one "node") on this machine (chapter 8).

    timeout and idle_timeout as in helpers.launch.
    """
    _check_counts(nnodes=nnodes, nproc_per_node=nproc_per_node)
    script = worker_script(script)
    endpoint = f"localhost:{free_port()}"
    run_id = uuid.uuid4().hex[:12]
    argv = torchrun_node_argv(script, nnodes, nproc_per_node, endpoint, run_id, args)
    extra = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": PREFIX_TEMPLATE}
    return run_processes([(None, argv, {**extra, "DPC_NODE": str(i)}) for i in range(nnodes)],
                         "torchrun", nnodes * nproc_per_node, timeout=timeout, idle_timeout=idle_timeout,
                         env=env, cwd=cwd, echo=echo, stop_on_failure=True)


def local_addresses() -> set[str]:
    """The IPv4 addresses of this machine's interfaces (127.0.0.1 included) (chapter 8)."""
    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET}


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """horovodrun's -H syntax 'a:2,b:2' as [(host, slots)] (slots default to 1) (chapter 8)."""
    out = []
    for item in hosts.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise ValueError(f"bad host entry {item!r} in {hosts!r}: write host:slots, e.g. localhost:2")
        out.append((name, int(slots or 1)))
    return out


def remote_hosts(hosts: str) -> list[str]:
    """The hosts of a -H list that horovodrun would reach over ssh (it runs the others locally) (chapter 8)."""
    mine = local_addresses()
    remote = []
    for name, _ in parse_hosts(hosts):
        try:
            address = socket.gethostbyname(name)
        except socket.gaierror:
            address = None
        if address not in mine:
            remote.append(name)
    return remote


def horovodrun_hosts(script: str | os.PathLike[str], hosts: str, np: int | None = None, *,
                     args: Sequence[str] = (), timeout: float = 180.0,
                     env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                     echo: bool = True) -> LaunchResult:
    """Run `horovodrun -np N -H hosts --gloo python script`; refuse hosts that would need ssh (chapter 8)."""
    slots = sum(s for _, s in parse_hosts(hosts))
    np = slots if np is None else np
    _check_counts(np=np)
    if np > slots:
        raise ValueError(f"np={np} but the hosts {hosts!r} offer only {slots} slot(s)")
    remote = remote_hosts(hosts)
    if remote:
        raise ValueError(f"hosts {remote} are not this machine: horovodrun would start their ranks "
                         "over ssh (needs passwordless ssh and the same environment there)")
    script = worker_script(script)
    argv = [console_script("horovodrun"), "-np", str(np), "-H", hosts, "--gloo", "--gloo-timeout-seconds",
            "60", sys.executable, script, *args]
    return run_processes([(None, argv, {})], "horovodrun", np, timeout=timeout, env=env, cwd=cwd,
                         echo=echo, stop_on_failure=False)


def slurm_tasks(script: str | os.PathLike[str], ntasks: int = 2, *, ntasks_per_node: int = 1,
                args: Sequence[str] = (), timeout: float = 120.0,
                env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                echo: bool = True) -> LaunchResult:
    """Start ntasks processes with the SLURM_* variables srun gives its tasks (no SLURM needed) (chapter 8)."""
    _check_counts(ntasks=ntasks, ntasks_per_node=ntasks_per_node)
    script = worker_script(script)
    nnodes = -(-ntasks // ntasks_per_node)
    host = socket.gethostname()
    layout = ",".join(str(min(ntasks_per_node, ntasks - n * ntasks_per_node)) for n in range(nnodes))
    procs = []
    for task in range(ntasks):
        slurm = {"SLURM_PROCID": str(task), "SLURM_NTASKS": str(ntasks),
                 "SLURM_LOCALID": str(task % ntasks_per_node),
                 "SLURM_NODEID": str(task // ntasks_per_node), "SLURM_NNODES": str(nnodes),
                 "SLURM_NTASKS_PER_NODE": str(ntasks_per_node), "SLURM_STEP_TASKS_PER_NODE": layout,
                 "SLURM_TASKS_PER_NODE": layout, "SLURM_JOB_NODELIST": host,
                 "SLURM_JOB_ID": "0"}
        procs.append((task, [sys.executable, script, *args], slurm))
    return run_processes(procs, "tf", ntasks, timeout=timeout, env=env, cwd=cwd, echo=echo,
                         stop_on_failure=True)


def torch_env_from_slurm(environ: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE for torch.distributed from srun's SLURM_* variables (chapter 8)."""
    need = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT"]
    missing = [k for k in need if k not in environ]
    if missing:
        raise KeyError(f"missing {missing}: srun sets the SLURM_* ones, the batch script must "
                       "export MASTER_ADDR (first host of the job) and MASTER_PORT")
    me = slurm_place(environ)  # the same mapping helpers.worker.start() applies under srun
    return {"RANK": str(me.rank), "WORLD_SIZE": str(me.world_size), "LOCAL_RANK": str(me.local_rank),
            "LOCAL_WORLD_SIZE": str(me.local_world_size)}


def tf_config_from_slurm(environ: Mapping[str, str]) -> str:
    """TF_CONFIG for task SLURM_PROCID, from TF_WORKERS ('host:port,...' one per task, set by the batch script) (chapter 8)."""
    if "SLURM_PROCID" not in environ or "TF_WORKERS" not in environ:
        raise KeyError("need SLURM_PROCID (set by srun) and TF_WORKERS (host:port of every task, "
                       "exported by the batch script)")
    workers = [w.strip() for w in environ["TF_WORKERS"].split(",") if w.strip()]
    index = int(environ["SLURM_PROCID"])
    ntasks = int(environ.get("SLURM_NTASKS", len(workers)))
    if len(workers) != ntasks or not 0 <= index < ntasks:
        raise ValueError(f"TF_WORKERS lists {len(workers)} worker(s) but SLURM_NTASKS={ntasks} "
                         f"and SLURM_PROCID={index}: one host:port per task")
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


# --- machinery ------------------------------------------------------------------------------------

def _check_counts(**counts: int) -> None:
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}={n!r}: must be an integer >= 1")
