"""JupyterHub config of a class on one node: the one `make classroom-test` runs and instructors copy.

    PYTHONPATH=<course>/src jupyterhub -f <course>/src/dpc_instructor/hub/jupyterhub_config.py
                                       (as root, in the hub's state folder; the spawner is imported by name)

Users log in with their Linux accounts (PAM); each user's JupyterLab runs as that user, from the
class environment (`make class-env`), in a cgroup with CPU, memory and process limits
(dpc_instructor.hub.spawner). Everything that differs between nodes comes from the environment:

    DPC_CLASS_ENV        the class environment (default /opt/dp-course/env)
    DPC_COURSE_FOLDER    the folder the nbgitpuller link clones into each home (default dp-course-student):
                         its src/ is on the users' PYTHONPATH (the helpers of the release they pulled)
    DPC_HUB_IP, DPC_HUB_PORT         where students connect (default 127.0.0.1:8000; put TLS in front)
    DPC_HUB_API_PORT, DPC_PROXY_API_PORT   the hub's and the proxy's API ports (default 8081, 8001)
    DPC_CHP              configurable-http-proxy (default the one src/dpc_setup/hub.sh installs)
    DPC_HUB_STATE        folder of the hub's database, cookie secret and pid files (default: cwd)
    DPC_HUB_USERS        who may log in, comma-separated (default: members of DPC_HUB_GROUP, dp-course)
    DPC_HUB_ADMINS       hub admins, comma-separated (default none)
    DPC_HUB_CPU, DPC_HUB_MEM, DPC_HUB_PIDS   per-user limits (default 2 cores, 4G, 1024 tasks)
    DPC_HUB_SPAWNER      auto (default: systemd's spawner where systemd runs and jupyterhub-systemdspawner
                         is installed, else the course's CgroupSpawner), systemd, cgroup, or slurm: each
                         server a SLURM job (batchspawner; the guide's page "A class on a SLURM cluster")
    DPC_HUB_TIME         slurm: the job's time limit (default 08:00:00): SLURM ends the server there
    DPC_HUB_GPUS         slurm: GPUs per student (--gres=gpu:N; default 0, none asked)
    DPC_HUB_PARTITION    slurm: the partition (default: the cluster's default one)
    DPC_HUB_NODES        slurm: node=address pairs, comma-separated, for nodes whose SLURM names do not
                         resolve (several slurmd on one machine, as the course's test cluster)
    DPC_HUB_QUEUE_S      slurm: how long a student's spawn may wait in the queue (default 3600 s)
    DPC_HUB_CULL_S       a server idle this long is stopped by jupyterhub-idle-culler, a service of the hub
                         (default 3600 s; 0: never). On SLURM that ends its job and frees its cores
    DPC_HUB_CGROUP       the folder of the users' cgroups, CgroupSpawner (default dp-course-hub)
    DPC_COURSE_ID, DPC_EXCHANGE   nbgrader's course id and exchange folder, passed to every server (default
                         dp-course, /srv/nbgrader/exchange): the class environment's nbgrader_config.py reads them
"""
import importlib.util
import math
import os
import pwd
import shutil
import sys
from pathlib import Path

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (JupyterHub's config loader provides it)


ENV = Path(os.environ.get("DPC_CLASS_ENV", "/opt/dp-course/env"))
COURSE_FOLDER = os.environ.get("DPC_COURSE_FOLDER", "dp-course-student")
STATE = Path(os.environ.get("DPC_HUB_STATE", os.getcwd()))
CHP = os.environ.get("DPC_CHP", str(Path.home() / ".cache/dp-course/hub/npm/node_modules/.bin/configurable-http-proxy"))

# Where the hub listens: loopback unless told (a real node puts a TLS proxy or DPC_HUB_IP in front).
c.JupyterHub.ip = os.environ.get("DPC_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("DPC_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("DPC_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('DPC_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [CHP]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # the servers stop with the hub
c.JupyterHub.cleanup_proxy = True

# Who: Linux accounts through PAM.
c.JupyterHub.authenticator_class = "pam"
users = {u for u in os.environ.get("DPC_HUB_USERS", "").split(",") if u}
if users:
    c.Authenticator.allowed_users = users
else:
    c.PAMAuthenticator.allowed_groups = {os.environ.get("DPC_HUB_GROUP", "dp-course")}
c.Authenticator.admin_users = {u for u in os.environ.get("DPC_HUB_ADMINS", "").split(",") if u}

# Each user's server: JupyterLab of the class environment, as that user, in a limited cgroup: systemd's
# (jupyterhub-systemdspawner, a transient unit per user) on a node that runs systemd, else the course's
# CgroupSpawner, which writes the cgroup itself (containers and nodes without systemd).
SPAWNER = os.environ.get("DPC_HUB_SPAWNER", "auto")
if SPAWNER == "auto":
    SPAWNER = ("systemd" if Path("/run/systemd/system").is_dir() and importlib.util.find_spec("systemdspawner")
               else "cgroup")
PIDS = int(os.environ.get("DPC_HUB_PIDS", "1024"))
if SPAWNER == "systemd":
    c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
    c.SystemdSpawner.unit_extra_properties = {"TasksMax": str(PIDS)}
elif SPAWNER == "cgroup":
    c.JupyterHub.spawner_class = "dpc_instructor.hub.spawner.CgroupSpawner"  # src/ on the hub's PYTHONPATH
    c.CgroupSpawner.pids_limit = PIDS
    c.CgroupSpawner.cgroup_parent = os.environ.get("DPC_HUB_CGROUP", "dp-course-hub")
elif SPAWNER == "slurm":
    # batchspawner (requirements-hub.txt, in the hub's environment and the class environment, whose
    # batchspawner-singleuser starts each server and tells the hub its port). The job asks for the same
    # limits as the cgroups above: Spawner.cpu_limit cores (whole), mem_limit, and the time and GPUs below.
    # Homes and nbgrader's exchange must be on storage every node mounts; the job checks (slurm_job.sh).
    try:
        importlib.import_module("batchspawner")  # registers the hub's /api/batchspawner (the servers' ports)
    except ImportError as e:
        raise ImportError("DPC_HUB_SPAWNER=slurm needs batchspawner in the hub's environment "
                          "(requirements-hub.txt; src/dpc_setup/hub.sh installs it)") from e
    nodes = dict(pair.split("=", 1) for pair in os.environ.get("DPC_HUB_NODES", "").split(",") if pair)
    SLURM = "MultiSlurmSpawner" if nodes else "SlurmSpawner"
    c.JupyterHub.spawner_class = f"batchspawner.{SLURM}"
    slurm = getattr(c, SLURM)
    if nodes:
        slurm.daemon_resolver = nodes
    slurm.batch_script = (Path(__file__).parent / "slurm_job.sh").read_text()
    slurm.req_nprocs = str(math.ceil(float(os.environ.get("DPC_HUB_CPU", "2"))))
    slurm.req_memory = os.environ.get("DPC_HUB_MEM", "4G")
    slurm.req_runtime = os.environ.get("DPC_HUB_TIME", "08:00:00")
    gpus = int(os.environ.get("DPC_HUB_GPUS", "0"))
    slurm.req_gres = f"gpu:{gpus}" if gpus else ""
    slurm.req_partition = os.environ.get("DPC_HUB_PARTITION", "")
    # sbatch, squeue and scancel run as the student (root's hub, no sudo needed on the hub's node).
    slurm.exec_prefix = f"{shutil.which('runuser') or '/usr/sbin/runuser'} -u {{username}} --"
    slurm.start_timeout = int(os.environ.get("DPC_HUB_QUEUE_S", "3600"))  # a queued student waits
else:
    raise ValueError(f"DPC_HUB_SPAWNER must be auto, systemd, cgroup or slurm, not {SPAWNER!r}")
c.Spawner.cmd = [str(ENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.cpu_limit = float(os.environ.get("DPC_HUB_CPU", "2"))
c.Spawner.mem_limit = os.environ.get("DPC_HUB_MEM", "4G")
c.Spawner.start_timeout = 180  # a loaded node starts servers slowly
c.Spawner.http_timeout = 180
# Kernels talk to their server over Unix sockets, not TCP ports: a TCP kernel gets ports its server
# found free and released a moment before, and on a node where classmates' jobs open many
# connections (gloo's full mesh) an outgoing connection can take one in between (seen in the
# classroom test: the kernel died with "Address already in use" and the student's notebook stayed
# "starting"). The sockets live in the user's own runtime folder, on a short path: a Unix socket's
# path has at most 107 bytes (home + this folder + "kernel-<uuid>-ipc-N", 49 bytes).
c.Spawner.args = ["--KernelManager.transport=ipc"]
RUNTIME_FOLDER = ".jupyter-run"


def _runtime_dir(spawner: object) -> str:
    """The user's Jupyter runtime folder (connection files and the kernels' sockets), short enough for them."""
    return str(Path(pwd.getpwnam(spawner.user.name).pw_dir) / RUNTIME_FOLDER)  # type: ignore[attr-defined]


def _pythonpath(spawner: object) -> str:
    """The user's copy of the course's packages (src/ of the folder the nbgitpuller link made)."""
    return str(Path(pwd.getpwnam(spawner.user.name).pw_dir) / COURSE_FOLDER / "src")  # type: ignore[attr-defined]


# Kernels, terminals and `make check` of the release use the class environment (DPC_PYTHON: the
# student Makefile's PY), its console scripts first on the PATH (jupyter, nbgrader, torchrun, horovodrun).
c.Spawner.environment = {
    "DPC_PYTHON": str(ENV / "bin" / "python"),
    "PATH": f"{ENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    "PYTHONPATH": _pythonpath,
    "JUPYTER_RUNTIME_DIR": _runtime_dir,
    # nbgrader's course id and exchange (the class environment's etc/jupyter/nbgrader_config.py reads them)
    "DPC_COURSE_ID": os.environ.get("DPC_COURSE_ID", "dp-course"),
    "DPC_EXCHANGE": os.environ.get("DPC_EXCHANGE", "/srv/nbgrader/exchange"),
}
if SPAWNER == "slurm" and os.environ.get("SLURM_CONF"):  # a cluster whose slurm.conf is not in /etc/slurm
    c.Spawner.environment["SLURM_CONF"] = os.environ["SLURM_CONF"]

# Idle servers stopped: jupyterhub-idle-culler (requirements-hub.txt), started and stopped with the hub, allowed
# exactly what it needs. A server whose kernels and terminals did nothing for DPC_HUB_CULL_S is stopped (its
# notebooks stay in the home); the student starts it again from the hub's page.
CULL_S = int(os.environ.get("DPC_HUB_CULL_S", "3600"))
if CULL_S > 0:
    # The culler judges by the activity the hub knows: the servers report theirs, and the hub reads the proxy's,
    # every 300 s by default. A timeout shorter than that would stop servers in use: all report 4 times per timeout.
    every = min(300, max(5, CULL_S // 4))
    c.JupyterHub.services = [{"name": "idle-culler", "command": [
        sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={CULL_S}", f"--cull-every={every}"]}]
    c.JupyterHub.load_roles = [{"name": "idle-culler", "services": ["idle-culler"],
                                "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}]
    c.JupyterHub.last_activity_interval = every
    c.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(every)
