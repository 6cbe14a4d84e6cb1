"""Run untrusted code (a student's notebook, its kernel, every rank it launches) in a sandbox.

The sandbox is Debian's `bubblewrap` (`bwrap`, no daemon; apt-get install bubblewrap):
- its own network namespace: loopback only (the labs' rendezvous ports are private to it);
- its own PID namespace: when the sandbox ends, every process in it ends with it, even one that
  left its session or dropped the course's launch marker;
- a file system built from a whitelist: the system folders and the course's `.venv`, `src/` and
  `examples/` read-only, and writable only the folders named by the caller (its scratch);
  `solutions/`, `tests/`, the grader's copy of the source, the gradebook, other students and
  `.git` are simply not there;
- no capabilities (root inside cannot remount what is hidden), a clean environment;
- limits on memory and process count (a cgroup of its own, where the machine lets us create one),
  the size of any file written (RLIMIT_FSIZE) and, by the caller, wall time.

`src/dpc_instructor/grade.py` runs each student's `nbgrader autograde` in one sandbox and each kernel in a second,
tighter one (the kernel cannot read nbgrader's database, which holds the hidden tests);
`src/dpc_runtime/check.py` (a student's self-check) runs the notebook in one.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpc_runtime.launch import MARKER, kill_launch  # one process-tree killer for the course

ROOT = Path(__file__).resolve().parents[2]
# Read-only parts of the course a notebook may use (the kernel imports helpers; chapters' workers).
COURSE_READ = [ROOT / ".venv", ROOT / "src", ROOT / "examples", ROOT / "nbgrader_config.py", ROOT / "course.yml"]
SYSTEM_READ = ["/usr", "/etc", "/opt", "/var/lib/dpkg/alternatives"]
SYSTEM_LINKS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
INSTALL = "as root: apt-get install bubblewrap"
OFF_HINT = "DPC_SANDBOX=off runs student code with your rights (only where you accept that risk)"
# The course's interpreter: kernels and the self-check run with it.
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use: memory (bytes), processes+threads, bytes of any one file written."""

    memory: int = 8 << 30
    pids: int = 4096
    file_size: int = 512 << 20


def disabled() -> bool:
    """True when the instructor turned the sandbox off (DPC_SANDBOX=off)."""
    return os.environ.get("DPC_SANDBOX", "").lower() in {"off", "0", "no", "false"}


def unavailable() -> str | None:
    """Why a sandbox cannot be made on this machine (None when it can): one line with the fix."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return f"bubblewrap (bwrap) is not installed ({INSTALL})"
    try:
        done = subprocess.run([bwrap, *_base_args([], net=False), "--", "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap does not run here: {err}"
    if done.returncode != 0:
        return (f"bwrap cannot create namespaces here ({done.stderr.strip() or done.returncode}); "
                f"user namespaces must be allowed (sysctl kernel.unprivileged_userns_clone=1) or "
                f"run as root")
    return None


def require() -> None:
    """Exit with one clear message unless a sandbox can be made (or DPC_SANDBOX=off is set)."""
    if disabled():
        print("sandbox: OFF (DPC_SANDBOX=off): student code runs with your rights", file=sys.stderr)
        return
    why = unavailable()
    if why:
        raise SystemExit(f"sandbox: {why}.\nStudent code must not run with your rights; "
                         f"{OFF_HINT}.")


def _base_args(extra_read: Sequence[Path], net: bool) -> list[str]:
    """bwrap arguments for the whitelisted file system, namespaces and no capabilities."""
    args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "localhost", "--cap-drop", "ALL"]
    if not net:
        args.append("--unshare-net")
    for system in SYSTEM_READ:
        if os.path.isdir(system):
            args += ["--ro-bind", system, system]
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    base = Path(sys.base_prefix).resolve()
    if not any(str(base).startswith(p + "/") or str(base) == p for p in SYSTEM_READ):
        args += ["--ro-bind", str(base), str(base)]  # a Python outside /usr (pyenv, conda)
    env = Path(sys.prefix).resolve()
    if env != base and not env.is_relative_to(ROOT):
        args += ["--ro-bind", str(env), str(env)]  # the environment running this (PY=... of make)
    for dev in sorted(Path("/dev").glob("nvidia*")):  # GPUs, where the machine has them
        args += ["--dev-bind", str(dev), str(dev)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for path in extra_read:
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    return args


def bwrap_argv(argv: list[str], writable: list[Path], read: Sequence[Path] = (), net: bool = False,
               caps: bool = False, env: dict[str, str] | None = None,
               setenv: dict[str, str] | None = None, cwd: Path | None = None) -> list[str]:
    """The command that runs argv in a sandbox: course + system read-only, writable only `writable`."""
    args = [shutil.which("bwrap") or "bwrap", *_base_args([*COURSE_READ, *read], net)]
    if caps:  # only for the grader's own nbgrader process, which starts the kernel's sandbox
        args.remove("--cap-drop")
        args.remove("ALL")
    for path in writable:
        args += ["--bind", str(path), str(path)]
    if env is not None:
        args.append("--clearenv")
        for key, value in env.items():
            args += ["--setenv", key, value]
    for key, value in (setenv or {}).items():
        args += ["--setenv", key, value]
    if cwd is not None:
        args += ["--chdir", str(cwd)]
    return [*args, "--", *argv]


class Cgroup:
    """A memory + pids cgroup for one sandbox (v2, or v1's memory and pids), where we may make one."""

    def __init__(self, limits: Limits) -> None:
        self.name = f"dpc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dirs: list[Path] = []
        self.procs: list[Path] = []
        v2 = Path("/sys/fs/cgroup")
        v1 = {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids")}
        try:
            if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
                d = v2 / self.name
                d.mkdir()
                self.dirs.append(d)
                (d / "memory.max").write_text(str(limits.memory))
                (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
                (d / "pids.max").write_text(str(limits.pids))
                self.procs.append(d / "cgroup.procs")
            elif all((p / "cgroup.procs").exists() for p in v1.values()):
                for kind, p in v1.items():
                    d = p / self.name
                    d.mkdir()
                    self.dirs.append(d)
                    self.procs.append(d / "cgroup.procs")
                (v1["memory"] / self.name / "memory.limit_in_bytes").write_text(str(limits.memory))
                (v1["pids"] / self.name / "pids.max").write_text(str(limits.pids))
        except OSError:
            self.close()
            self.dirs, self.procs = [], []

    @property
    def active(self) -> bool:
        """Whether memory and process limits are enforced."""
        return bool(self.procs)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv, started from a shell that first moves itself into this cgroup."""
        if not self.active:
            return argv
        moves = "; ".join(f"echo $$ > '{p}'" for p in self.procs)
        return ["/bin/sh", "-c", f'{moves}; exec "$@"', "sh", *argv]

    def out_of_memory(self) -> bool:
        """Whether the memory limit was hit (some process was or would have been OOM-killed)."""
        for d in self.dirs:
            for name, key in (("memory.events", "oom_kill "), ("memory.oom_control", "oom_kill ")):
                f = d / name
                if f.exists():
                    for line in f.read_text().splitlines():
                        if line.startswith(key) and int(line.split()[1]) > 0:
                            return True
        return False

    def kill_all(self) -> None:
        """Kill every process still in the cgroup."""
        for _ in range(50):
            pids = {int(x) for p in self.procs if p.exists() for x in p.read_text().split()}
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)

    def close(self) -> None:
        """Kill what is left, then remove the cgroup."""
        self.kill_all()
        for d in self.dirs:
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def clean_env(home: Path, tmp: Path) -> dict[str, str]:
    """The environment sandboxed code gets: the basics, and the caller's DPC_/OMP_/OPENBLAS_ settings."""
    env = {"PATH": f"{Path(PYTHON).parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
           "JUPYTER_CONFIG_DIR": str(home / ".jupyter"), "IPYTHONDIR": str(home / ".ipython"),
           "TMPDIR": str(tmp), "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT / "src")}
    for key, value in os.environ.items():
        if key.startswith(("DPC_", "OMP_", "OPENBLAS_")) or key in {"CI", "TZ"}:
            env[key] = value
    return env


@dataclass(frozen=True)
class Outcome:
    """How a limited run ended: exit code (-1: stopped at its time limit), output, memory exhausted."""

    code: int
    output: str
    out_of_memory: bool


def run_limited(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                limits: Limits = Limits(), capture: bool = True) -> Outcome:
    """Run argv in its own session and cgroup, files capped; kill everything it started at the end."""

    launch_id = uuid.uuid4().hex
    cgroup = Cgroup(limits)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cgroup.wrap(limit_file_size(argv, limits)), cwd=cwd, stdout=pipe,
                            stderr=subprocess.STDOUT if capture else None, text=True,
                            start_new_session=True, env={**env, MARKER: launch_id})
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out, code = "", -1
    finally:
        kill_launch(launch_id, [proc])  # kernels and ranks too: they carry the marker
        out_of_memory = cgroup.out_of_memory()  # read before close() removes the cgroup
        cgroup.close()  # kills whatever is left in it
    return Outcome(code, out or "", out_of_memory)


def cgroups_work() -> bool:
    """Whether this machine lets us make the memory and process cgroup (made and removed at once)."""
    probe = Cgroup(Limits())
    try:
        return probe.active
    finally:
        probe.close()


def limit_file_size(argv: list[str], limits: Limits) -> list[str]:
    """argv under RLIMIT_FSIZE: no file it writes grows past limits.file_size."""
    return [sys.executable, "-c",
            "import os, resource, sys; n = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); os.execvp(sys.argv[2], sys.argv[2:])",
            str(limits.file_size), *argv]


def kernel_spec(folder: Path, writable: list[Path], read: Sequence[Path] = (),
                setenv: dict[str, str] | None = None) -> Path:
    """Write a `python3` kernelspec under folder/kernels whose kernel runs in a sandbox of its own.

    Put folder on JUPYTER_PATH: nbgrader and nbclient then start every kernel through it.
    Interrupts go by message (a signal would reach bwrap, not the kernel).
    """
    import json

    argv = bwrap_argv([PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                      writable=writable, read=list(read), net=True, setenv=setenv)
    # Not --die-with-parent: jupyter_client starts kernels from a helper thread, and the kernel would
    # die with that thread. The grader's own sandbox (a PID namespace) still ends every process.
    argv.remove("--die-with-parent")
    # ipykernel exits when its parent looks like init (PID 1): inside a PID namespace it always
    # does. Without JPY_PARENT_PID it does not watch its parent (the sandbox ends it instead).
    argv[1:1] = ["--unsetenv", "JPY_PARENT_PID"]
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": "Python 3 (sandboxed)", "language": "python",
        "interrupt_mode": "message", "metadata": {"debugger": False}}, indent=1))
    return spec
