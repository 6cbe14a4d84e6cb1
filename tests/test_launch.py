"""helpers.launch: real launches and their failure modes (crash, hang, interrupt), never leaving orphans.

Every worker records '<rank>-<pid>' in $DPC_TEST_PIDDIR (tests/workers/ranks.py), so after each
launch the test can check that none of its processes is still running.
"""
from __future__ import annotations

import _thread
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

import helpers
from dpc_runtime import launch as launch_module
from helpers import LaunchError

WORKERS = Path(__file__).parent / "workers"
RANKS = WORKERS / "ranks.py"


def recorded(piddir: Path) -> dict[int, list[int]]:
    """rank -> pids of the workers that recorded themselves in piddir."""
    found: dict[int, list[int]] = {}
    for f in piddir.iterdir():
        rank, pid = f.name.split("-")
        found.setdefault(int(rank), []).append(int(pid))
    return found


def _running(pid: int, piddir: Path) -> bool:
    """True if pid is a live (non-zombie) process of that launch (not a recycled pid)."""
    if not psutil.pid_exists(pid):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.environ().get("DPC_TEST_PIDDIR") == str(piddir)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def assert_no_orphans(piddir: Path, ranks: set[int] = frozenset({0, 1})) -> None:
    """Every recorded worker is gone, and so is any other process of that launch (e.g. torchrun)."""
    pids = recorded(piddir)
    assert ranks <= set(pids), f"workers did not record themselves: {pids}"
    alive = [pid for rank_pids in pids.values() for pid in rank_pids if _running(pid, piddir)]
    for proc in psutil.process_iter():
        try:
            if (proc.pid not in alive and proc.status() != psutil.STATUS_ZOMBIE
                    and proc.environ().get("DPC_TEST_PIDDIR") == str(piddir)):
                alive.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    assert not alive, f"orphans left running: {[(p, _cmd(p)) for p in alive]}"


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "?"


@pytest.mark.gate
def test_orphan_check_sees_a_live_worker(tmp_path):
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "DPC_TEST_PIDDIR": str(tmp_path)})
    try:
        (tmp_path / f"0-{proc.pid}").touch()
        with pytest.raises(AssertionError, match="orphans left running"):
            assert_no_orphans(tmp_path, {0})
    finally:
        proc.kill()
        proc.wait()
    assert_no_orphans(tmp_path, {0})


# --- arguments ---------------------------------------------------------------------------------

@pytest.mark.gate
def test_unknown_launcher():
    with pytest.raises(ValueError, match=r"launcher='mpirun': use one of"):
        helpers.launch(RANKS, 2, launcher="mpirun", args=["ok"])


@pytest.mark.gate
@pytest.mark.parametrize("nprocs", [0, -1, True, 2.0])
def test_bad_nprocs(nprocs):
    with pytest.raises(ValueError, match="ask for at least 1 process"):
        helpers.launch(RANKS, nprocs, args=["ok"])


@pytest.mark.gate
def test_missing_script(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        helpers.launch(tmp_path / "nope.py", 2)


@pytest.mark.gate
def test_free_port_is_bindable():
    import socket

    port = helpers.free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# --- torchrun ----------------------------------------------------------------------------------

@pytest.mark.gate
@pytest.mark.timeout(180)
def test_torchrun_ok(tmp_path, capsys):
    result = helpers.launch(RANKS, 2, args=["ok"], env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert result.nprocs == 2
    assert result.seconds > 0
    for r in (0, 1):
        assert f"rank {r} ready" in result.lines(r)
        assert f"rank {r} sum 3" in result.lines(r)
    assert result.lines(5) == []
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 sum 3" in out
    assert "[rank 1] rank 1 sum 3" in out
    assert_no_orphans(tmp_path)


@pytest.mark.gate
def test_torchrun_leaves_no_log_folder_behind(tmp_path):
    """torchrun keeps a copy of each rank's output (--tee) under a log folder; without --log-dir it
    makes one in the temp folder (torchelastic_*) and never removes it: on a class hub, one per
    launch per student. The launch gives torchrun its own (PET_LOG_DIR) and removes it."""
    temp, pids = tmp_path / "tmp", tmp_path / "pids"
    temp.mkdir()
    pids.mkdir()
    helpers.launch(RANKS, 2, args=["ok"], env={"DPC_TEST_PIDDIR": str(pids), "TMPDIR": str(temp)},
                   echo=False)
    assert list(temp.iterdir()) == []
    assert_no_orphans(pids)


@pytest.mark.gate
@pytest.mark.timeout(180)
def test_torchrun_crash_names_the_rank(tmp_path):
    with pytest.raises(LaunchError) as info:
        helpers.launch(RANKS, 2, args=["crash"], env={"DPC_TEST_PIDDIR": str(tmp_path)}, echo=False)
    assert_no_orphans(tmp_path)
    err = info.value
    assert err.ranks == [1]
    assert "rank 1 failed" in str(err)
    assert "fails on purpose" in str(err)
    assert any("fails on purpose" in ln for ln in err.tails[1])
    # What the failed launch left behind (chapter 10, lab 10): rank 1's own exit and lines, rank 0's too
    left = err.result
    assert left is not None and left.nprocs == 2 and left.seconds > 0
    assert left.exit_codes[1] == 1, left.exit_codes
    assert any("fails on purpose" in ln for ln in left.lines(1))
    assert left.lines(0) and left.exit_codes.get(0) != 1, (left.exit_codes, left.lines(0))


@pytest.mark.gate
@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["hang", "hang-own-sigterm"])
def test_torchrun_hang_names_the_rank_that_never_came(tmp_path, mode):
    # The hang is declared after 5 s of silence once both ranks have started, however long
    # starting took on a loaded machine (a 20 s timeout on the whole launch failed there). The
    # stacks are asked for before the ranks are stopped: a rank's dump as it is stopped is cut when a
    # second SIGTERM (torchrun's, after the launcher's) arrives during it (rank 0's was missing once
    # in CI), and there is none when the rank has a SIGTERM handler of its own (hang-own-sigterm).
    start = time.monotonic()
    with pytest.raises(LaunchError, match="hung") as info:
        helpers.launch(RANKS, 2, args=[mode], timeout=150, idle_timeout=5, echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path)})
    elapsed = time.monotonic() - start
    assert_no_orphans(tmp_path)
    # Rank 0 waits in the all-reduce; rank 1 sleeps elsewhere: rank 1 is the one to name.
    assert info.value.ranks == [1]
    assert elapsed >= 5
    assert ("hung: no rank printed a line for 5 s after all 2 had started: rank 1 never reached the "
            "communication rank 0 waited for" in str(info.value))
    assert "(stopped while busy in ranks.py:" in str(info.value) and "time.sleep(600)" in str(info.value)
    # Both ranks' stacks, as data: rank 1 innermost in the worker's own file, rank 0 inside torch
    stacks = info.value.result.stacks
    assert any(t and Path(t[0][0]).name == "ranks.py" for t in stacks[1]), stacks[1]
    assert not any(t and Path(t[0][0]).name == "ranks.py" for t in stacks[0]), stacks[0]


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_a_launch_that_times_out_while_a_rank_is_starting_says_so(tmp_path):
    # Rank 1 never calls start(); idle_timeout never fires (not every rank started), timeout does.
    with pytest.raises(LaunchError, match="timed out after 20 s") as info:
        helpers.launch(RANKS, 2, args=["late-start"], timeout=20, idle_timeout=1, echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert_no_orphans(tmp_path, ranks=set())
    assert 1 in info.value.ranks
    assert "rank 1 had not started yet" in str(info.value) or \
        "ranks 0, 1 had not started yet" in str(info.value)


@pytest.mark.gate
@pytest.mark.timeout(200)
def test_a_rank_that_never_started_is_blamed_not_the_one_that_timed_out_waiting(tmp_path):
    # Rank 1 sleeps before start() (no stack dump to read); rank 0 gives up waiting for it at
    # start-up after 3 s and raises: the one to name is rank 1.
    with pytest.raises(LaunchError) as info:
        helpers.launch(RANKS, 2, args=["late-start"], timeout=150, echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path), "DPC_TEST_START_TIMEOUT": "3"})
    assert_no_orphans(tmp_path, ranks=set())
    assert info.value.ranks == [1], str(info.value)
    assert "rank 1 never started" in str(info.value)
    assert "Rank 0 then failed waiting for it" in str(info.value)


@pytest.mark.gate
@pytest.mark.timeout(300)
def test_long_reports_come_back_whole(tmp_path):
    # Through torchrun's --tee, a 300 KB report line came back cut into 64 KiB pieces glued to other
    # ranks' lines, and was lost in 4 launches of 8; the protocol's own file carries it whole.
    for _ in range(3):
        result = helpers.launch(RANKS, 2, args=["big-report"], echo=False, timeout=240,
                                env={"DPC_TEST_PIDDIR": str(tmp_path)})
        for r in (0, 1):
            assert result.report(r) == {"big": "x" * 300_000}
        assert not any("x" * 100 in ln for r in (0, 1) for ln in result.lines(r))
    assert_no_orphans(tmp_path)


@pytest.mark.gate
def test_an_idle_timeout_must_be_positive():
    with pytest.raises(ValueError, match="idle_timeout=0: give a number of seconds above 0, or None"):
        helpers.launch(RANKS, 2, idle_timeout=0)


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_results_come_back_through_the_protocol(tmp_path, capsys):
    result = helpers.launch(RANKS, 2, args=["ok"], env={"DPC_TEST_PIDDIR": str(tmp_path)})
    for r in (0, 1):
        assert result.report(r) == {"sum": 3.0, "backend": "gloo", "device": "cpu"}
        assert not any(ln.startswith("DPC-") for ln in result.lines(r))
    assert result.notes == []
    assert "DPC-" not in capsys.readouterr().out  # the protocol's lines are not echoed
    with pytest.raises(LookupError, match="rank 5 reported nothing"):
        result.report(5)


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_an_abort_after_every_rank_finished_is_a_note_not_a_failure(tmp_path, capsys):
    # The "terminate called without an active exception" case: the work is done and reported.
    result = helpers.launch(RANKS, 2, args=["abort-after-done"], env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert result.report(1)["sum"] == 3.0
    assert result.notes == ["every rank finished its work and reported its results; afterwards, "
                            "while shutting down, rank 1 was ended by SIGABRT. The results are "
                            "complete: this is not a failure of the script."]
    assert "[launch] note: every rank finished its work" in capsys.readouterr().out
    assert_no_orphans(tmp_path)


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_the_same_abort_without_the_protocol_is_a_failure(tmp_path):
    # Without the protocol the launcher cannot know the work was done: this is why every script
    # of the course ends with helpers.worker.finish().
    with pytest.raises(LaunchError) as info:
        helpers.launch(RANKS, 2, args=["no-protocol-abort"], echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert info.value.ranks == [1], (str(info.value), info.value.result.exit_codes)
    assert_no_orphans(tmp_path)


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_a_rank_that_leaves_early_is_named_not_its_victim(tmp_path):
    # Rank 1 exits with code 0 before the all-reduce; rank 0 fails with "Connection reset by peer".
    with pytest.raises(LaunchError) as info:
        helpers.launch(RANKS, 2, args=["early-exit"], echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path)})
    assert_no_orphans(tmp_path)
    assert info.value.ranks == [1]
    message = str(info.value)
    assert message.startswith("torchrun with 2 process(es): rank 1 stopped taking part: rank 1 ended "
                              "early without finishing (exit code 0, no error). Rank 0 then failed "
                              "waiting for it.")
    assert "--- rank 0, waiting for it, ended with ---" in message


@pytest.mark.gate
@pytest.mark.timeout(120)
def test_a_process_that_left_its_launch_ends_with_it(tmp_path):
    """A rank's grandchild in a session of its own, with an empty environment (no marker to find it
    by), is adopted by the launching process and stopped when the launch returns: it never writes."""
    stray = tmp_path / "stray"
    (tmp_path / "pids").mkdir()
    helpers.launch(RANKS, 2, args=["stray"], env={"DPC_TEST_PIDDIR": str(tmp_path / "pids"),
                                                  "DPC_TEST_STRAY": str(stray)}, echo=False)
    pid = int(Path(f"{stray}.pid").read_text())
    try:
        gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    assert gone, f"the stray {pid} still runs: {_cmd(pid)}"
    assert not Path(f"{stray}.forged").exists()
    assert pid not in {c.pid for c in psutil.Process().children()}, "the stray was not reaped"


@pytest.mark.gate
def test_keyboard_interrupt_kills_the_launch(tmp_path):
    # A shell that starts the suite in the background (`make test &`) ignores SIGINT, and Python
    # then keeps ignoring it: interrupt_main() would do nothing. Ctrl-C's handler, as in a terminal.
    # Ctrl-C comes once both workers are up (they record themselves), however slow the machine is.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()

    def press_ctrl_c_once_both_ranks_run() -> None:
        while not stop.is_set():
            if {0, 1} <= set(recorded(tmp_path)):
                _thread.interrupt_main()
                return
            stop.wait(0.1)

    watcher = threading.Thread(target=press_ctrl_c_once_both_ranks_run, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            helpers.launch(RANKS, 2, args=["hang"], timeout=110, echo=False,
                           env={"DPC_TEST_PIDDIR": str(tmp_path)})
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    assert_no_orphans(tmp_path)


# --- plain processes with TF_CONFIG --------------------------------------------------------------

@pytest.mark.gate
def test_tf_launcher_ok(tmp_path, capsys):
    result = helpers.launch(RANKS, 2, launcher="tf", args=["tf-ok"],
                            env={"DPC_TEST_PIDDIR": str(tmp_path)})
    for r in (0, 1):
        assert result.lines(r) == [f"worker {r} of 2"]
    out = capsys.readouterr().out
    assert "[rank 0] worker 0 of 2" in out and "[rank 1] worker 1 of 2" in out
    assert_no_orphans(tmp_path)


@pytest.mark.gate
def test_tf_launcher_crash_stops_waiting_peers(tmp_path):
    with pytest.raises(LaunchError) as info:
        helpers.launch(RANKS, 2, launcher="tf", args=["tf-crash"], timeout=120, echo=False,
                       env={"DPC_TEST_PIDDIR": str(tmp_path)})
    # Rank 1 crashes as soon as it starts; on a loaded machine rank 0 may be stopped before it got
    # as far as recording itself. Either way no process of the launch is left (the scan by marker).
    assert_no_orphans(tmp_path, ranks={1})
    assert info.value.ranks == [1]
    assert "rank 1 failed" in str(info.value)  # stopped for the crash, not at the 120 s timeout
    assert "fails on purpose" in str(info.value)


@pytest.mark.gate
def test_tf_launcher_keeps_crashed_workers_last_lines(tmp_path, monkeypatch):
    # The crashed worker's final line arrives after the launcher noticed it was still running:
    # make reading slow so that the worker has exited by the time the launcher checks again.
    script = tmp_path / "last_words.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('about to fail', flush=True)\n"
        "    time.sleep(0.3)\n"
        "    raise SystemExit('the real reason')\n"
        "time.sleep(600)\n"
    )
    original = launch_module._Stream.line

    def slow_line(self, rank, text):
        original(self, rank, text)
        if text == "about to fail":
            time.sleep(1.5)

    monkeypatch.setattr(launch_module._Stream, "line", slow_line)
    with pytest.raises(LaunchError) as info:
        helpers.launch(script, 2, launcher="tf", echo=False, timeout=60)
    assert info.value.ranks == [1]
    assert info.value.tails[1] == ["about to fail", "the real reason"]
    assert "the real reason" in str(info.value)


# --- horovodrun --------------------------------------------------------------------------------

@pytest.mark.gate
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["hvd_torch.py", "hvd_keras.py"])
def test_horovodrun_ranks_agree(script):
    result = helpers.launch(WORKERS / script, 2, launcher="horovodrun", timeout=240, echo=False)
    for r in (0, 1):
        assert f"rank {r} of 2: weights identical on all ranks: True" in result.lines(r)


# --- a classroom node: many launches at once -----------------------------------------------------

@pytest.mark.full
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_twenty_concurrent_launches(tmp_path):
    dirs = [tmp_path / f"launch{i}" for i in range(20)]
    for d in dirs:
        d.mkdir()

    def one(piddir: Path) -> helpers.LaunchResult:
        return helpers.launch(RANKS, 2, args=["ok"], echo=False, timeout=300,
                              env={"DPC_TEST_PIDDIR": str(piddir)})

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(one, d) for d in dirs]
        errors = [f.exception() for f in futures]
    assert errors == [None] * 20, "\n\n".join(str(e) for e in errors if e)
    for f, d in zip(futures, dirs):
        result = f.result()
        for r in (0, 1):
            assert f"rank {r} sum 3" in result.lines(r)
        assert_no_orphans(d)


@pytest.mark.gate
def test_a_reaped_root_whose_pid_was_reused_is_left_alone():
    """kill_launch at the end of every launch and grading run: a root already reaped names a free
    PID, on a busy machine soon another process's (PIDs wrap at pid_max, 32768 here). A grader's
    kernel died so in a CI run beside twenty launches. That process must not be killed."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # reaped: its PID is free
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        done.pid = bystander.pid  # what PID reuse does: the old root's number now names a stranger
        launch_module.kill_launch("no-such-launch", [done], grace=1.0)
        assert bystander.poll() is None, "kill_launch killed a process that only reused a root's PID"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.gate
def test_ranks_planned_for_the_cpu_never_see_a_gpu(tmp_path, monkeypatch, capsys):
    # Issue 34: on a GPU machine, torch's PowerSGD hook called torch.cuda.synchronize with the CPU
    # ranks' device because CUDA was available. A machine with 1 GPU and 2 ranks (a patched count):
    # the ranks run on the CPU, the GPU hidden from them, and the launch says so once.
    monkeypatch.setattr(launch_module, "visible_gpus", lambda environ=None: 1)
    monkeypatch.setattr(launch_module, "_said", set())
    result = helpers.launch(RANKS, 2, args=["env"], timeout=120, env={"DPC_TEST_PIDDIR": str(tmp_path)})
    for r in (0, 1):
        assert result.report(r) == {"cuda_visible": "", "rank_device": "cpu", "device": "cpu", "cuda": False}
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[launch]")]
    assert said == ["[launch] 2 rank(s): gloo on cpu (1 GPU(s) for 2 ranks: NCCL needs one GPU per rank, "
                    "so the GPU is hidden from the ranks (devices='gpu' shares it over gloo))"]
    assert_no_orphans(tmp_path)


@pytest.mark.gate
def test_ranks_sharing_a_gpu_are_told_so(tmp_path, monkeypatch):
    # devices='gpu' on the same machine: the GPU stays visible and start() is told to use it (on this
    # CPU machine torch finds no GPU, so start() keeps the rank on the CPU).
    monkeypatch.setattr(launch_module, "visible_gpus", lambda environ=None: 1)
    result = helpers.launch(RANKS, 2, args=["env"], timeout=120, echo=False, devices="gpu",
                            env={"DPC_TEST_PIDDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0"})
    assert result.report(1)["rank_device"] == "shared"
    assert result.report(1)["cuda_visible"] == "0"


@pytest.mark.gate
def test_a_rank_that_asks_for_gloo_by_name_never_sees_a_gpu(tmp_path, monkeypatch):
    # Chapter 11's workers call start("gloo") and keep their tensors on the CPU. On a machine with a GPU
    # per rank the launcher leaves the GPUs visible (a patched count, and the mask it would keep), so
    # start() itself hides them before torch touches CUDA: PowerSGD's hook cannot reach a GPU.
    monkeypatch.setattr(launch_module, "visible_gpus", lambda environ=None: 2)
    result = helpers.launch(RANKS, 2, args=["env"], timeout=120, echo=False,
                            env={"DPC_TEST_PIDDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1"})
    for r in (0, 1):
        assert result.report(r)["rank_device"] == "cuda"  # what the launcher said: one GPU per rank
        assert result.report(r)["cuda_visible"] == ""  # what start("gloo") made of it
        assert result.report(r)["device"] == "cpu"


@pytest.mark.gate
def test_visible_gpus_reads_the_mask(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: a)'\necho 'GPU 1: NVIDIA H100 (UUID: b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    assert launch_module.visible_gpus({}) == 2
    assert launch_module.visible_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert launch_module.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0


@pytest.mark.gate
def test_a_rank_still_importing_inside_start_is_not_blamed_for_one_that_never_came():
    # The wrong blame of a loaded machine, replayed without the load: the timeout came while rank 0,
    # inside start() (its stack dump registered), was still importing torch — busy, by its stack —
    # and rank 1 had not reached start() (no stack). 673d1f3 named rank 0 ("never reached the
    # communication rank 1 waited for"); the one that never came is rank 1.
    stream = launch_module._Stream("torchrun", 2, echo=False)
    stream.stacks[0] = [[("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
                         ("/x/site-packages/torch/__init__.py", 2100, "<module>"),
                         ("/x/dpc_runtime/worker.py", 208, "start")]]
    err = stream.hang_error(20, [0, 1])
    assert err.ranks == [1], str(err)
    assert "timed out after 20 s; still running: ranks 0, 1; rank 1 had not started yet" in str(err)


@pytest.mark.gate
def test_a_launch_before_horovod_is_built_says_how_to_build_it(monkeypatch, tmp_path):
    # Issue 37: `make lab` opens JupyterLab before Horovod's 6-minute build; chapter 6's first launch says what to do.
    monkeypatch.setattr(launch_module.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"Horovod is not built yet. Run `make horovod` in a terminal"):
        helpers.launch(RANKS, 2, launcher="horovodrun")
