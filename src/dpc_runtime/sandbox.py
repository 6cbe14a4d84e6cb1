"""Run untrusted code (a student's notebook, its kernel, every rank it launches) in a sandbox.

The sandbox is Debian's `bubblewrap` (`bwrap`, no daemon; apt-get install bubblewrap):
- its own network namespace: loopback only (the labs' rendezvous ports are private to it);
- its own PID namespace, and its own /proc of it: when the sandbox ends, every process in it ends
  with it, even one that left its session or dropped the course's launch marker;
- a file system built from a whitelist: the system folders and the course's `.venv`, `src/` and
  `examples/` read-only, and writable only the folders named by the caller (its scratch);
  `solutions/`, `tests/`, the grader's copy of the source, the gradebook, other students and
  `.git` are simply not there;
- never root: started by root, the sandboxed command runs as an unprivileged user (`nobody`, or
  DPC_SANDBOX_USER), without capabilities (setpriv); so nothing it reaches, through any path, lets it
  change a file or device node of the host it does not own (the writable folders are handed to
  that user first: `hand_over`). Started by anyone else, it runs as them, with no capabilities;
- a clean environment;
- limits on memory and process count (a cgroup of its own, where the machine lets us create one),
  the size of any file written (RLIMIT_FSIZE), the space its /tmp may take (a sized tmpfs), the
  space its writable folder may take (a watcher in `run_limited` stops it there) and, by the
  caller, wall time.

`src/dpc_instructor/grading/job.py` runs each student's `nbgrader autograde` in one sandbox and each kernel in a second,
tighter one (the kernel cannot read nbgrader's database, which holds the hidden tests);
`src/dpc_runtime/check.py` (a student's self-check) runs the notebook in one. What sandboxed code
wrote or a student handed in is read and copied (as root, by the grader) only as folders and
regular files, never through a link: open_regular, read_regular, copy_regular.
"""
from __future__ import annotations

import fnmatch
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpc_runtime.cpuwait import SAMPLE_S, CpuWaits
from dpc_runtime.launch import MARKER, kill_launch  # one process-tree killer for the course

ROOT = Path(__file__).resolve().parents[2]
# Read-only parts of the course a notebook may use (the kernel imports helpers; chapters' workers).
COURSE_READ = [ROOT / ".venv", ROOT / "src", ROOT / "examples", ROOT / "nbgrader_config.py", ROOT / "course.yml"]
SYSTEM_READ = ["/usr", "/etc", "/opt", "/var/lib/dpkg/alternatives"]
SYSTEM_LINKS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
INSTALL = "as root: apt-get install bubblewrap"
OFF_HINT = "DPC_SANDBOX=off runs student code with your rights (only where you accept that risk)"
# Where a sandbox that starts sandboxes also sees the host's /proc (see _base_args: host_proc).
HOST_PROC = "/run/dpc-host-proc"
# The course's interpreter, kernels' and the self-check's: the one running this (make's PY: .venv's
# python unless PY=... or DPC_PYTHON names another environment).
PYTHON = sys.executable


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use: memory (bytes), processes+threads, bytes of any one file written,
    bytes in its writable folder (`disk`) and in its /tmp (`tmp`)."""

    memory: int = 8 << 30
    pids: int = 4096
    file_size: int = 512 << 20
    disk: int = 2 << 30
    tmp: int = 1 << 30


def sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) sandboxed code runs as when this process is root (DPC_SANDBOX_USER, default
    nobody); None when it is not root (the code then runs as the caller, without capabilities)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("DPC_SANDBOX_USER", "nobody")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SystemExit(f"sandbox: no user {name!r} to run student code as (DPC_SANDBOX_USER); "
                         f"student code never runs as root") from None
    if entry.pw_uid == 0:
        raise SystemExit(f"sandbox: DPC_SANDBOX_USER={name} is root; student code never runs as root")
    return entry.pw_uid, entry.pw_gid


def hand_over(folder: Path) -> None:
    """Make folder (and all in it) the sandbox user's, so that sandboxed code may write there
    (nothing to do when this process is not root)."""
    user = sandbox_user()
    if user is None:
        return
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, *user, follow_symlinks=False)


class Refused(Exception):
    """Why a file is not read or copied (one line: what it is and why)."""


def file_kind(mode: int) -> str:
    """What a file of this mode is, in words."""
    for test, word in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(top: int, parts: Sequence[str]) -> int:
    """An open descriptor of the regular file top/parts[0]/..., reached without following any link.

    What untrusted code wrote or handed in is read only this way (the grader's intake, and every
    copy it makes: copy_regular). top is an open folder; every step is looked at (lstat), then
    opened with O_NOFOLLOW relative to the last, and the file looked at again once open (non-blocking:
    something swapped in between is caught there). A symbolic link, a named pipe, a device, a
    socket or a hard link (a second name of some other file) raises Refused, and nothing it names
    is read; a missing file raises FileNotFoundError.
    """
    where = "/".join(parts)
    fd = os.dup(top)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if not last and stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(where)  # a file where a folder was looked for: not there
            if stat.S_ISLNK(st.st_mode) or (not last and not stat.S_ISDIR(st.st_mode)):
                raise Refused(f"{'/'.join(parts[:i + 1])} is {file_kind(st.st_mode)}: only regular "
                              f"files and folders are read")
            if last and not stat.S_ISREG(st.st_mode):
                raise Refused(f"{where} is {file_kind(st.st_mode)}, not a regular file")
            try:
                nfd = os.open(part, _OPEN | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except OSError as err:
                raise Refused(f"{'/'.join(parts[:i + 1])} cannot be read ({err.strerror})") from None
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{where} is {file_kind(st.st_mode)}, not a regular file")
        if st.st_nlink > 1:
            raise Refused(f"{where} is a hard link (one more name of a file elsewhere): hand in a copy")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(top: int, parts: Sequence[str], limit: int) -> bytes:
    """The bytes of the regular file top/parts[0]/... (open_regular: no link followed, only a
    regular file read); over limit bytes raises Refused."""
    fd = open_regular(top, parts)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Refused(f"{'/'.join(parts)} is over the {limit >> 20} MiB a notebook may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def copy_regular(src: Path, dest: Path, ignore: Sequence[str] = ()) -> list[str]:
    """Copy src (a regular file, or a folder and all in it) to dest; return one line for each entry
    not copied.

    Every copy the grader makes as root goes this way: folders and regular files only, each opened
    with open_regular, so no link is followed (a relative link into the job's folder, a link to any
    folder the sandbox user could read) and no pipe, socket or device is opened; such an entry is
    skipped, and nothing it names is copied. Files keep their permission bits and times; names
    matching an `ignore` pattern (fnmatch, as shutil.ignore_patterns) are left out silently.
    src's own parent folders are the caller's (followed as given); dest's folders are made.
    """
    refused: list[str] = []
    parent = os.open(src.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if stat.S_ISDIR(os.stat(src.name, dir_fd=parent, follow_symlinks=False).st_mode):
            fd = os.open(src.name, _FOLDER, dir_fd=parent)
            try:
                _copy_folder(fd, dest, "", ignore, refused)
            finally:
                os.close(fd)
        else:
            _copy_file(parent, src.name, dest, "", refused)
    finally:
        os.close(parent)
    return refused


_FOLDER = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def _copy_folder(fd: int, dest: Path, where: str, ignore: Sequence[str], refused: list[str]) -> None:
    """Copy the open folder fd to dest (see copy_regular); `where`: its path in the copy ('' or
    ending in '/'), for the lines refused."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(os.listdir(fd)):
        if any(fnmatch.fnmatch(name, pattern) for pattern in ignore):
            continue
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(mode):
            _copy_file(fd, name, dest / name, where, refused)
            continue
        try:
            sub = os.open(name, _FOLDER, dir_fd=fd)
        except OSError as err:
            refused.append(f"{where}{name} cannot be read ({err.strerror})")
            continue
        try:
            _copy_folder(sub, dest / name, f"{where}{name}/", ignore, refused)
        finally:
            os.close(sub)


def _copy_file(folder: int, name: str, dest: Path, where: str, refused: list[str]) -> None:
    """Copy the regular file folder/name to dest (see copy_regular)."""
    try:
        fd = open_regular(folder, [name])
    except FileNotFoundError:
        return
    except Refused as why:
        refused.append(f"{where}{why}")
        return
    try:
        st = os.fstat(fd)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(out, "wb") as f:
            while chunk := os.read(fd, 1 << 20):
                f.write(chunk)
            f.flush()
            os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)


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
    # The grader's nbgrader starts each kernel's sandbox from its own, unprivileged (nested).
    nested = bwrap_argv([bwrap, *_base_args([], net=False), "--", "true"], writable=[], host_proc=True)
    done = subprocess.run(nested, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return (f"bwrap cannot start a sandbox inside a sandbox, unprivileged "
                f"({done.stderr.strip() or done.returncode}); user namespaces must be allowed "
                f"(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)")
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


def _parents(paths: Sequence[Path | str]) -> list[str]:
    """The folders above paths, outermost first, but / and the system folders: bwrap would make
    them with their host's mode (/root, pytest's /tmp/pytest-of-root: 0700), which an unprivileged
    sandbox user could not walk through."""
    found: set[str] = set()
    for path in paths:
        for parent in Path(path).parents:
            if str(parent) != "/" and not any(str(parent).startswith(s + "/") for s in SYSTEM_READ):
                found.add(str(parent))
    binds = {str(p) for p in paths}
    return sorted(found - binds, key=lambda p: (p.count("/"), p))


def _base_args(extra_read: Sequence[Path], net: bool, tmp_size: int = Limits.tmp,
               writable: Sequence[Path] = (), host_proc: bool = False) -> list[str]:
    """bwrap arguments for the whitelisted file system, namespaces and no capabilities (the
    folders above every bound path made walkable: `_parents`).

    host_proc: for a sandbox that starts sandboxes (only for trusted code: the grader's nbgrader).
    Its /proc is its own, of its own PID namespace, as in every sandbox: a nested bwrap reads
    /proc/<pid of its child> with the pid it knows, so a /proc of another namespace (the host's)
    makes it fail (`bwrap: open /proc/N/ns/ns failed`) whenever no process of the host has that
    number, and read some other process's when one does. The kernel lets an unprivileged (nested)
    sandbox mount a /proc only where one is already fully visible, and bwrap's own covers parts of
    it: so the host's /proc is bound, read-write as the kernel requires, at HOST_PROC as well (the
    nested sandboxes do not see it; the trusted code may)."""
    args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "localhost", "--cap-drop", "ALL"]
    if not net:
        args.append("--unshare-net")
    # /tmp and /dev/shm (multiprocessing's semaphores, DataLoader workers): sized, anyone's, sticky
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(tmp_size), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(tmp_size), "--tmpfs", "/dev/shm", "--tmpfs", "/run"]
    if host_proc:
        args += ["--bind", "/proc", HOST_PROC]
    system = [s for s in SYSTEM_READ if os.path.isdir(s)]
    read: list[Path] = []
    base = Path(sys.base_prefix).resolve()
    if not any(str(base).startswith(p + "/") or str(base) == p for p in SYSTEM_READ):
        read.append(base)  # a Python outside /usr (pyenv, conda)
    env = Path(sys.prefix).resolve()
    if env != base and not env.is_relative_to(ROOT):
        read.append(env)  # the environment running this (PY=... of make)
    read += [p for p in extra_read if p.exists()]
    for parent in _parents([*system, *read, *writable]):
        args += ["--perms", "0755", "--dir", parent]
    for folder in system:
        args += ["--ro-bind", folder, folder]
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    for gpu in sorted(Path("/dev").glob("nvidia*")):  # GPUs, where the machine has them
        args += ["--dev-bind", str(gpu), str(gpu)]
    for path in read:
        args += ["--ro-bind", str(path), str(path)]
    return args


def bwrap_argv(argv: list[str], writable: list[Path], read: Sequence[Path] = (), net: bool = False,
               env: dict[str, str] | None = None,
               setenv: dict[str, str] | None = None, cwd: Path | None = None,
               tmp_size: int = Limits.tmp, nested: bool = False, host_proc: bool = False
               ) -> list[str]:
    """The command that runs argv in a sandbox: course + system read-only, writable only `writable`.

    Started by root, argv runs as `sandbox_user()` with no capabilities (root sets the sandbox up,
    setpriv drops to that user before argv starts). `nested`: the command is started by that
    user already (the grader's nbgrader starting a kernel), so it stays that user.
    """
    args = [shutil.which("bwrap") or "bwrap",
            *_base_args([*COURSE_READ, *read], net, tmp_size, writable, host_proc)]
    user = None if nested else sandbox_user()
    if user is not None:  # root's setpriv needs its capabilities to drop to the user
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
    return [*args, "--", *(argv if nested else as_sandbox_user(argv))]


def as_sandbox_user(argv: list[str]) -> list[str]:
    """argv run as `sandbox_user()` with no capabilities and no way back (setpriv), when this
    process is root; argv itself otherwise."""
    user = sandbox_user()
    if user is None:
        return argv
    uid, gid = user
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={gid}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *argv]


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
    """How a limited run ended: exit code (-1: stopped at its time limit), output, memory
    exhausted, stopped for filling its folder (`disk_full`), and what its threads ran and waited for
    a CPU over time (`cpu`)."""

    code: int
    output: str
    out_of_memory: bool
    disk_full: bool = False
    cpu: CpuWaits | None = None


def disk_usage(folder: Path) -> int:
    """Bytes the files under folder take on disk (links not followed)."""
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def run_limited(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                limits: Limits = Limits(), capture: bool = True, watch: Path | None = None,
                sample_cpu: bool = False) -> Outcome:
    """Run argv in its own session and cgroup, files capped; kill everything it started at the end.

    `watch`: a folder the run may fill up to limits.disk bytes; a watcher stops the run there
    (and it ends with disk_full). `sample_cpu`: the watcher also samples what the run's threads
    ran and waited for a CPU (dpc_runtime.cpuwait), for the outcome's `cpu` (the grader's)."""

    launch_id = uuid.uuid4().hex
    cgroup = Cgroup(limits)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cgroup.wrap(limit_file_size(argv, limits)), cwd=cwd, stdout=pipe,
                            stderr=subprocess.STDOUT if capture else None, text=True,
                            start_new_session=True, env={**env, MARKER: launch_id})
    full = threading.Event()
    ended = threading.Event()
    cpu = CpuWaits(proc.pid) if sample_cpu else None

    def watcher() -> None:
        while not ended.wait(SAMPLE_S):
            if cpu is not None:
                cpu.sample()
            if watch is not None and disk_usage(watch) > limits.disk:
                full.set()
                kill_launch(launch_id, [proc])
                cgroup.kill_all()
                return

    guard = threading.Thread(target=watcher, daemon=True)
    if watch is not None or cpu is not None:
        guard.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out, code = "", -1
    finally:
        ended.set()
        if guard.is_alive():
            guard.join()
        if cpu is not None:
            cpu.sample()  # the last threads before they are stopped
        kill_launch(launch_id, [proc])  # kernels and ranks too: they carry the marker
        out_of_memory = cgroup.out_of_memory()  # read before close() removes the cgroup
        cgroup.close()  # kills whatever is left in it
    return Outcome(code, out or "", out_of_memory, full.is_set(), cpu)


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

    Put folder on JUPYTER_PATH: nbgrader and nbclient then start every kernel through it. The
    kernel has no network but its own loopback, so its client must use IPC sockets
    (KernelManager.transport = "ipc") in a folder of `writable`: its runtime folder.
    The one starting it is the sandbox's user already (see grading/job.py): it stays that user.
    Interrupts go by message (a signal would reach bwrap, not the kernel).
    """
    import json

    argv = bwrap_argv([PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                      writable=writable, read=list(read), net=False, setenv=setenv, nested=True)
    # Not --die-with-parent: jupyter_client starts kernels from a helper thread, and the kernel would
    # die with that thread. The kernel's PID namespace ends every process it started with it, and
    # the grader's cgroup and launch marker end the kernel.
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
