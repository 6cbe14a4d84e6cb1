"""The sandbox student code runs in (src/dpc_runtime/sandbox.py): what it hides, what it may write, its
network, its limits, and that nothing it starts outlives it. Each test runs a small command in a
real bubblewrap sandbox (seconds); the grading tests run whole labs in it."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from dpc_runtime import sandbox

ROOT = Path(__file__).resolve().parents[1]

WHY = sandbox.unavailable()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"no sandbox here: {WHY}"), pytest.mark.gate]
PY = str(ROOT / ".venv" / "bin" / "python")


def run(code: str, scratch: Path, **kw) -> subprocess.CompletedProcess[str]:
    """Run python code in a sandbox whose only writable folder is scratch."""
    sandbox.hand_over(scratch)
    argv = sandbox.bwrap_argv([PY, "-c", code], writable=[scratch],
                              env={"PATH": "/usr/bin:/bin", "HOME": str(scratch)}, cwd=scratch, **kw)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_hidden_paths_are_not_there_and_the_course_is_read_only(tmp_path):
    done = run("import os, sys\n"
               f"print([p for p in {[str(ROOT / 'solutions'), str(ROOT / 'tests'), str(ROOT / '.git'), str(ROOT / 'tools' / 'grade.py'), str(ROOT / 'build'), str(Path.home() / '.cache')]!r} if os.path.exists(p)])\n"
               f"print(os.path.exists({str(ROOT / 'src' / 'helpers' / 'worker.py')!r}))\n"
               "try:\n"
               f"    open({str(ROOT / 'src' / 'helpers' / 'owned.py')!r}, 'w')\n"
               "except OSError as e:\n"
               "    print(type(e).__name__)\n"
               "open('mine.txt', 'w').write('ok')\n", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["[]", "True", "OSError"]
    assert (tmp_path / "mine.txt").read_text() == "ok"
    assert not (ROOT / "src" / "helpers" / "owned.py").exists()


def test_no_capabilities_so_hidden_paths_cannot_be_uncovered(tmp_path):
    done = run("import ctypes, os\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "print(libc.umount2(b'/tmp', 2), ctypes.get_errno())\n"
               "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])",
               tmp_path)
    assert done.stdout.split() == ["-1", "1", "0000000000000000"], done.stdout + done.stderr  # EPERM


def test_network_is_loopback_only_and_private(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        done = run("import socket\n"
                   "print(sorted(n for _, n in socket.if_nameindex()))\n"
                   f"print(socket.socket().connect_ex(('127.0.0.1', {port})) != 0)\n"
                   "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                   "print(socket.create_connection(s.getsockname(), timeout=5) is not None)", tmp_path)
    finally:
        server.close()
    # Only `lo`; the grader's own loopback (a server on this machine) is out of reach; its own works.
    assert done.stdout.split("\n")[:3] == ["['lo']", "True", "True"], done.stdout + done.stderr


def test_a_detached_process_ends_with_the_sandbox(tmp_path):
    token = uuid.uuid4().hex
    # A grandchild that leaves its session and drops the course's launch marker, then the sandbox ends.
    code = ("import os, subprocess, sys\n"
            "env = {k: v for k, v in os.environ.items() if k != 'DPC_LAUNCH_ID'}\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{token}'],"
            " start_new_session=True, env=env)\n")
    done = run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"outlived its sandbox: {alive}"


def test_a_sandbox_that_starts_sandboxes_starts_every_one(tmp_path):
    """The grader's nbgrader starts each kernel's sandbox from its own (host_proc). A bwrap reads
    /proc/<its child's pid> with the pid of its own PID namespace: with the host's /proc there (no
    such pid on the host, or another process's) two students' kernels never started (`bwrap: open
    /proc/9/ns/ns failed`, and the failed bwrap's child hung on). Its /proc is its own namespace's;
    the nested sandbox has its own too and does not see the host's."""
    inner = sandbox.bwrap_argv([PY, "-c", f"import os; print(os.path.exists({sandbox.HOST_PROC!r}))"],
                               writable=[], nested=True)
    done = run("import os, subprocess\n"
               "print(os.readlink('/proc/self') == str(os.getpid()))\n"
               f"runs = [subprocess.run({inner!r}, capture_output=True, text=True, timeout=20) for _ in range(30)]\n"
               "print(sum(r.returncode == 0 for r in runs), sorted({r.stdout.strip() for r in runs}))\n"
               "print([r.stderr.strip() for r in runs if r.returncode][:1])\n", tmp_path, host_proc=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["True", "30 ['False']", "[]"], done.stdout + done.stderr


@pytest.mark.skipif(not sandbox.cgroups_work(), reason="cgroups are not writable here")
def test_memory_limit_kills_and_is_reported(tmp_path):
    limits = sandbox.Limits(memory=256 << 20)
    cgroup = sandbox.Cgroup(limits)
    try:
        sandbox.hand_over(tmp_path)
        argv = cgroup.wrap(sandbox.bwrap_argv(
            [PY, "-c", "x = bytearray(1 << 30); x[::4096] = b'1' * len(x[::4096]); print('survived')"],
            writable=[tmp_path], env={"PATH": "/usr/bin:/bin"}))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert "survived" not in done.stdout and done.returncode != 0
        assert cgroup.out_of_memory()
    finally:
        cgroup.close()
    assert not any(d.exists() for d in cgroup.dirs), "the cgroup is removed afterwards"


def test_no_cgroup_is_left_behind(monkeypatch):
    # The probe's own cgroup, not a global count: other tests may be grading (with cgroups) meanwhile.
    made: list[sandbox.Cgroup] = []

    class Recorded(sandbox.Cgroup):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sandbox, "Cgroup", Recorded)
    assert sandbox.cgroups_work() in (True, False)
    assert len(made) == 1
    assert not any(d.exists() for d in made[0].dirs), "the probe's cgroup is removed at once"


def test_file_size_limit(tmp_path):
    limits = sandbox.Limits(file_size=1 << 20)
    sandbox.hand_over(tmp_path)
    argv = sandbox.limit_file_size(sandbox.bwrap_argv(
        [PY, "-c", "open('big', 'wb').write(b'0' * (4 << 20))"], writable=[tmp_path],
        env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path), limits)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert (tmp_path / "big").stat().st_size <= 1 << 20


def test_missing_bubblewrap_is_one_clear_refusal(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("DPC_SANDBOX", raising=False)
    with pytest.raises(SystemExit) as err:
        sandbox.require()
    assert str(err.value) == (
        "sandbox: bubblewrap (bwrap) is not installed (as root: apt-get install bubblewrap).\n"
        "Student code must not run with your rights; DPC_SANDBOX=off runs student code with your "
        "rights (only where you accept that risk).")
    monkeypatch.setenv("DPC_SANDBOX", "off")
    sandbox.require()  # the explicit opt-out: no error


HOST_NODES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"]


def host_state() -> dict[str, tuple[int, int, int]]:
    """Mode and owner of the host's device nodes the sandbox shares, and of the course's files."""
    paths = [*HOST_NODES, str(ROOT / "course.yml"), str(ROOT / "src" / "helpers" / "__init__.py")]
    return {p: (s.st_mode, s.st_uid, s.st_gid) for p in paths if Path(p).exists()
            for s in [Path(p).stat()]}


def test_student_code_never_runs_as_root_and_cannot_touch_host_nodes(tmp_path):
    before = host_state()
    done = run("import os\n"
               "print(os.getuid(), os.geteuid(), os.getgid())\n"
               f"for node in {HOST_NODES + [str(ROOT / 'course.yml')]!r}:\n"
               "    for change in (lambda p: os.chmod(p, 0o444), lambda p: os.chown(p, os.getuid(), -1)):\n"
               "        try:\n"
               "            change(node)\n"
               "            print('CHANGED', node)\n"
               "        except OSError:\n"
               "            pass\n"
               "open('mine.txt', 'w').write('ok')\n", tmp_path)
    assert done.returncode == 0, done.stderr
    uid, euid, gid = map(int, done.stdout.split()[:3])
    assert 0 not in (uid, euid, gid), done.stdout
    assert "CHANGED" not in done.stdout
    assert host_state() == before
    assert (tmp_path / "mine.txt").read_text() == "ok"


def test_a_run_that_fills_its_folder_is_stopped_at_the_limit(tmp_path):
    limits = sandbox.Limits(disk=64 << 20, file_size=16 << 20)
    sandbox.hand_over(tmp_path)
    # Many files under the per-file limit: only the folder's total stops it.
    code = ("import itertools\n"
            "for k in itertools.count():\n"
            "    open(f'part{k}', 'wb').write(b'1' * (8 << 20))\n")
    argv = sandbox.bwrap_argv([PY, "-c", code], writable=[tmp_path],
                              env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    done = sandbox.run_limited(argv, tmp_path, {"PATH": "/usr/bin:/bin"}, 120, limits, watch=tmp_path)
    assert done.disk_full, done  # the exit code is whatever the killed sandbox returned
    # stopped within a watch period of the limit (a writer at disk speed overshoots by < 1 GiB)
    assert sandbox.disk_usage(tmp_path) < (64 << 20) + (1 << 30)


def test_tmp_and_shm_are_sized_and_usable(tmp_path):
    done = run("import multiprocessing, os\n"
               "for d in ('/tmp', '/dev/shm'):\n"
               "    st = os.statvfs(d)\n"
               "    open(d + '/mine', 'w').write('ok')\n"
               "    print(st.f_blocks * st.f_frsize)\n"
               "q = multiprocessing.Queue()  # a semaphore in /dev/shm\n"
               "q.put('queued')\n"
               "print(q.get())\n", tmp_path, tmp_size=32 << 20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(32 << 20), str(32 << 20), "queued"]


def test_an_environment_under_tmp_stays_visible(tmp_path, monkeypatch):
    """An environment that lives under /tmp (a hub's, a conda one) is bound after the sandbox's own
    /tmp, so the self-check can start its Python; /tmp stays the sandbox's, writable by anyone."""
    env = Path(tempfile.mkdtemp(prefix="dpc-env-", dir="/tmp")) / "env"
    try:
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
        env.parent.chmod(0o755)
        monkeypatch.setattr(sys, "prefix", str(env))  # as when that environment runs the check
        sandbox.hand_over(tmp_path)
        code = "import os, sys; open('/tmp/mine', 'w').write('ok'); print(sys.prefix, oct(os.stat('/tmp').st_mode))"
        argv = sandbox.bwrap_argv([str(env / "bin" / "python"), "-c", code], writable=[tmp_path],
                                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(env), "0o41777"]
        assert not Path("/tmp/mine").exists() or Path("/tmp/mine").read_text() != "ok"
    finally:
        shutil.rmtree(env.parent, ignore_errors=True)
