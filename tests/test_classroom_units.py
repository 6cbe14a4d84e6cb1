"""The classroom's pure parts, on any machine: the fairness lines, the past-the-limit allocation, the
hub's config, and a kernel on Unix sockets as the hub starts them."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from traitlets.config import Config

from dpc_maintainer import classroom

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_fairness_lines_give_medians_maxima_the_ratio_and_the_goal() -> None:
    r = {"idle_ms": [3.0, 2.0, 4.0], "busy_ms": [50.0, 1500.0, 900.0, 20.0, 700.0], "heavy_run_all_s": 61.2,
         "oom": {"state": "restarting", "after_s": 4.2, "other": "alive, same kernel"}}
    lines = classroom.fairness_lines(r, "06-horovod", "4G")
    assert lines[0] == "fairness: classmate's kernel round trip, class idle: median 3 ms, max 4 ms (n 3)"
    assert lines[1] == ("fairness: classmate's kernel round trip while a student runs 06-horovod (Run All 61.2 s): "
                        "median 700 ms, max 1500 ms (n 5)")
    assert lines[2] == "fairness: busy/idle median ratio 233.3; goal median <= 1000 ms: met"
    assert lines[3] == ("fairness: a kernel that allocates past the 4G limit: restarting after 4.2 s; "
                        "the other student's kernel: alive, same kernel")
    slow = classroom.fairness_lines({"idle_ms": [1.0], "busy_ms": [1200.0]}, "06-horovod", "4G")
    assert slow[-1].endswith("goal median <= 1000 ms: MISSED")
    assert classroom.fairness_lines({}, "06-horovod", "4G") == ["fairness: no measurement"]


def test_the_allocation_past_the_limit_is_half_again_the_limit() -> None:
    code = classroom.past_limit_code("4G")
    ast.parse(code)  # valid Python, sent as one cell
    assert f"np.ones({int(4 * 2**30 * 1.5) // 8}," in code
    assert f"np.ones({int(512 * 2**20 * 1.5) // 8}," in classroom.past_limit_code("512M")
    assert f"np.ones({3000 * 3 // 2 // 8}," in classroom.past_limit_code("3000")


CONFIG = classroom.ROOT / "src/dpc_instructor/hub/jupyterhub_config.py"


def hub_config(monkeypatch: pytest.MonkeyPatch, **env: str) -> Config:
    """The hub's config as JupyterHub loads it (get_config() in the file's namespace), under env."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = Config()
    exec(compile(CONFIG.read_text(), str(CONFIG), "exec"), {"get_config": lambda: cfg, "__file__": str(CONFIG)})
    return cfg


def test_the_hub_config_limits_users_with_the_spawner_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = hub_config(monkeypatch, DPC_HUB_SPAWNER="cgroup", DPC_HUB_PIDS="2048", DPC_HUB_CPU="1.5",
                     DPC_HUB_MEM="3G", DPC_HUB_CGROUP="class-x", DPC_CLASS_ENV="/opt/x/env")
    assert cfg.JupyterHub.spawner_class == "dpc_instructor.hub.spawner.CgroupSpawner"
    assert (cfg.CgroupSpawner.pids_limit, cfg.CgroupSpawner.cgroup_parent) == (2048, "class-x")
    assert (cfg.Spawner.cpu_limit, cfg.Spawner.mem_limit) == (1.5, "3G")
    assert cfg.Spawner.cmd == ["/opt/x/env/bin/jupyterhub-singleuser"]
    assert cfg.Spawner.environment["DPC_PYTHON"] == "/opt/x/env/bin/python"
    user = type("Spawner", (), {"user": type("User", (), {"name": "root"})()})()
    assert cfg.Spawner.environment["PYTHONPATH"](user) == "/root/dp-course-student/src"
    cfg = hub_config(monkeypatch, DPC_HUB_SPAWNER="systemd", DPC_HUB_PIDS="512")
    assert cfg.JupyterHub.spawner_class == "systemdspawner.SystemdSpawner"
    assert cfg.SystemdSpawner.unit_extra_properties == {"TasksMax": "512"}
    with pytest.raises(ValueError, match="DPC_HUB_SPAWNER must be auto, systemd, cgroup or slurm, not 'docker'"):
        hub_config(monkeypatch, DPC_HUB_SPAWNER="docker")


def test_on_slurm_each_server_is_a_job_with_the_same_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """DPC_HUB_SPAWNER=slurm: batchspawner's spawner, asking SLURM for the cgroups' limits (whole cores), the time
    and GPUs; nodes named by several slurmd on one machine resolved; slurm.conf passed to the jobs; and the batch
    script, rendered as batchspawner renders it (Jinja2), asks for exactly that and checks the shared storage."""
    import sys
    import types

    import jinja2

    monkeypatch.setitem(sys.modules, "batchspawner", None)  # an environment without it: import fails
    with pytest.raises(ImportError, match="DPC_HUB_SPAWNER=slurm needs batchspawner in the hub's environment"):
        hub_config(monkeypatch, DPC_HUB_SPAWNER="slurm")
    monkeypatch.setitem(sys.modules, "batchspawner", types.ModuleType("batchspawner"))  # the hub's environment has it
    cfg = hub_config(monkeypatch, DPC_HUB_SPAWNER="slurm", DPC_HUB_CPU="1.5", DPC_HUB_MEM="3G", DPC_HUB_GPUS="1",
                     DPC_HUB_TIME="02:00:00", DPC_HUB_NODES="node1=127.0.0.1,node2=localhost",
                     SLURM_CONF="/tmp/x/slurm.conf")
    assert cfg.JupyterHub.spawner_class == "batchspawner.MultiSlurmSpawner"
    slurm = cfg.MultiSlurmSpawner
    assert (slurm.req_nprocs, slurm.req_memory, slurm.req_runtime, slurm.req_gres) == ("2", "3G", "02:00:00", "gpu:1")
    assert slurm.daemon_resolver == {"node1": "127.0.0.1", "node2": "localhost"}
    assert slurm.exec_prefix.endswith("runuser -u {username} --")
    assert cfg.Spawner.environment["SLURM_CONF"] == "/tmp/x/slurm.conf"
    script = jinja2.Template(slurm.batch_script).render(
        username="ann", homedir="/home/ann", keepvars="PATH,SLURM_CONF", nprocs="2", memory="3G",
        runtime="02:00:00", gres="gpu:1", partition="", options="", prologue="", epilogue="",
        cmd="batchspawner-singleuser /opt/x/env/bin/jupyterhub-singleuser")
    for line in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=3G", "#SBATCH --time=02:00:00", "#SBATCH --gres=gpu:1",
                 "#SBATCH --export=PATH,SLURM_CONF", "#SBATCH --job-name=jupyterhub-ann",
                 "srun --cpus-per-task=2 batchspawner-singleuser /opt/x/env/bin/jupyterhub-singleuser"):
        assert line in script.splitlines(), line
    assert "#SBATCH --partition" not in script and "cannot see" in script
    cfg = hub_config(monkeypatch, DPC_HUB_SPAWNER="slurm", DPC_HUB_NODES="", DPC_HUB_GPUS="0")
    assert cfg.JupyterHub.spawner_class == "batchspawner.SlurmSpawner" and cfg.SlurmSpawner.req_gres == ""


def test_idle_servers_are_culled_by_a_service_of_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = hub_config(monkeypatch, DPC_HUB_CULL_S="120")
    (service,) = cfg.JupyterHub.services
    assert service["name"] == "idle-culler" and service["command"][1:] == [
        "-m", "jupyterhub_idle_culler", "--timeout=120", "--cull-every=30"]
    (role,) = cfg.JupyterHub.load_roles
    assert role["services"] == ["idle-culler"] and "delete:servers" in role["scopes"]
    # the activity it judges by is reported 4 times per timeout (the hub's and the servers' default: every 300 s)
    assert cfg.JupyterHub.last_activity_interval == 30 and cfg.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == "30"
    assert hub_config(monkeypatch, DPC_HUB_CULL_S="3600").JupyterHub.last_activity_interval == 300
    assert "services" not in hub_config(monkeypatch, DPC_HUB_CULL_S="0").JupyterHub


def test_kernels_use_unix_sockets_in_a_short_runtime_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TCP ports for kernels (a port found free and released can be taken before the kernel binds
    it): the servers start kernels with ipc transport, and a kernel so started, with its sockets in a
    runtime folder as long as the longest home (a 32-character user name), answers."""
    from jupyter_client.manager import KernelManager

    cfg = hub_config(monkeypatch, DPC_CLASS_ENV="/opt/x/env")
    assert cfg.Spawner.args == ["--KernelManager.transport=ipc"]
    user = type("Spawner", (), {"user": type("User", (), {"name": "root"})()})()
    assert cfg.Spawner.environment["JUPYTER_RUNTIME_DIR"](user) == "/root/.jupyter-run"
    runtime = tmp_path / ("h" * max(1, len("/home/") + 32 - len(str(tmp_path)) - 1)) / ".jupyter-run"
    runtime.mkdir(parents=True)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    assert len(str(runtime)) >= len("/home/" + "u" * 32 + "/.jupyter-run")
    km = KernelManager(transport="ipc", kernel_name="python3")
    km.start_kernel()
    try:
        client = km.client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        assert client.execute_interactive("x = 6 * 7", timeout=60)["content"]["status"] == "ok"
        client.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


def test_a_class_of_one_runs_and_fairness_needs_a_classmate() -> None:
    from dpc_maintainer.classroom.cli import wrong_arguments

    assert wrong_arguments(["05-ring-allreduce"], 1) == ""
    assert wrong_arguments(["05-ring-allreduce"], 0).startswith("--students must be at least 1")
    assert wrong_arguments(["05-ring-allreduce"], 1, fairness=True).startswith("--fairness needs --students 2")
    assert wrong_arguments(["05-ring-allreduce"], 2, fairness=True) == ""
    assert wrong_arguments(["05-ring-allreduce"], 6, queue=True).startswith("--queue needs --spawner slurm")
    assert wrong_arguments(["05-ring-allreduce"], 6, queue=True, spawner="slurm") == ""
    assert wrong_arguments(["no-such-lab"], 2) == "no lab labs/no-such-lab"


def test_one_hand_in_path_names_the_class_course_and_exchange_everywhere(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """The hub passes nbgrader's course id and exchange to every server; the class environment's nbgrader config
    reads them (so `make submit`, `make feedback` and the Assignments tab agree); outside a hub `make submit`
    refuses with one line and hands in nothing."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    cfg = hub_config(monkeypatch, DPC_COURSE_ID="ml-101", DPC_EXCHANGE="/srv/x/exchange")
    assert (cfg.Spawner.environment["DPC_COURSE_ID"], cfg.Spawner.environment["DPC_EXCHANGE"]) == \
        ("ml-101", "/srv/x/exchange")
    env = tmp_path / "env"
    subprocess.run(["bash", str(root / "src/dpc_setup/class_env.sh"), "--student-lab-config", str(env)],
                   check=True, capture_output=True, env={**os.environ, "PYTHON": "python3"})
    written = env / "etc/jupyter/nbgrader_config.py"
    nb = Config()
    exec(compile(written.read_text(), str(written), "exec"), {"get_config": lambda: nb})
    assert (nb.CourseDirectory.course_id, nb.Exchange.root) == ("ml-101", "/srv/x/exchange")
    makefile = root / "src/dpc_instructor/student_files/Makefile"
    (tmp_path / "labs" / "05-ring-allreduce").mkdir(parents=True)
    bare = {k: v for k, v in os.environ.items() if k != "DPC_PYTHON"}
    out = subprocess.run(["make", "-s", "-f", str(makefile), "submit", "LAB=05-ring-allreduce"], cwd=tmp_path,
                         capture_output=True, text=True, env=bare)
    assert out.returncode == 2
    assert out.stdout.strip() == ("make submit hands in to a class's JupyterHub; this is not one (DPC_PYTHON is "
                                  "unset): nothing handed in")
    out = subprocess.run(["make", "-s", "-f", str(makefile), "submit", "LAB=05-ring"], cwd=tmp_path,
                         capture_output=True, text=True, env=bare)
    assert (out.returncode, out.stdout.strip()) == (2, "no lab labs/05-ring; labs: 05-ring-allreduce")


def test_the_launches_a_student_starts_are_seen_with_the_job_they_run_in(tmp_path: Path) -> None:
    """jobs.watch_launches samples the students' processes: a launcher (here a command line with a name of its own,
    as other tests' launchers run beside it; the class's: torch.distributed.run) started with a SLURM job's
    variables is recorded with that job and node."""
    import os
    import subprocess
    import sys
    import time
    import types
    import uuid

    from dpc_maintainer.classroom import jobs
    from dpc_maintainer.classroom.common import Account

    assert b"torch.distributed.run" in jobs.LAUNCHERS
    name = f"dpc-test-launcher-{uuid.uuid4().hex}"

    me = Account("me", "", str(tmp_path), uid=os.getuid())
    room = types.SimpleNamespace(students=[me])
    code = "import time; time.sleep(60)"
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node2"}
    with jobs.watch_launches(room, (name.encode(),)) as seen:  # type: ignore[arg-type]
        p = subprocess.Popen([sys.executable, "-c", code, name], env=env)
        try:
            deadline = time.monotonic() + 60
            while not seen["me"] and time.monotonic() < deadline:
                time.sleep(0.1)  # until the sampler saw it (an event), with a deadline
            assert jobs.environ(p.pid)["SLURM_JOB_ID"] == "42"
            assert jobs.ancestors(p.pid)[0] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()  # its parent
        finally:
            p.kill()
            p.wait()
    assert seen["me"] == {("42", "node2")}
    assert jobs.environ(p.pid) == {}  # gone: nothing, no error


def test_a_lost_node_takes_every_process_below_its_job_steps() -> None:
    """faults: a process's descendants (what a lost node's job steps ran) and the job a slurmstepd serves."""
    import os
    import subprocess
    import sys

    from dpc_maintainer.classroom import faults

    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print(c.pid, flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(p.stdout.readline())  # type: ignore[union-attr]
        assert faults.descendants(os.getpid()).count(p.pid) == 1
        assert grandchild in faults.descendants(p.pid) and grandchild in faults.descendants(os.getpid())
        assert faults.step_of(p.pid) == "" and faults.step_of(2**22 + 1) == ""  # no slurmstepd; no process
    finally:
        p.kill()
        p.wait()
        os.kill(grandchild, 9)


def test_a_student_is_queued_when_the_page_said_pending_for_half_a_culling() -> None:
    """faults.served_at_once: a job that starts at once may show 'Pending in queue' for a moment; one that waited
    for a culled server showed it for about a minute; a loaded machine makes either slower to reach JupyterLab."""
    from dpc_maintainer.classroom import faults

    res = {"a": {"pending_s": None, "to_lab_s": 75.0}, "b": {"pending_s": 1.5, "to_lab_s": 20.0},
           "c": {"pending_s": faults.CULL_S * 0.9, "to_lab_s": 95.0}}
    assert faults.served_at_once(res) == (["a", "b"], ["c"])
