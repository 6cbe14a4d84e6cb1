"""helpers.worker: where a rank sits, the one backend rule, the protocol's lines, how a rank ends."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from dpc_runtime.worker import (
    DONE,
    RESULT,
    START,
    Placement,
    Worker,
    backend_for,
    check_torch,
    collective_names,
    parse_line,
    place,
    placement,
    stuck_at,
)

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_place_reads_torchrun_first():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert place(env) == Worker(5, 8, 1, 4, "torchrun")


def test_place_reads_horovod_slurm_tf_and_nothing():
    assert place({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                  "HOROVOD_LOCAL_SIZE": "2"}) == Worker(3, 4, 1, 2, "horovod")
    assert place({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                  "SLURM_NTASKS_PER_NODE": "2(x2)"}) == Worker(3, 4, 1, 2, "slurm", master_port="29500")
    tf_config = {"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}}
    assert place({"TF_CONFIG": json.dumps(tf_config)}) == Worker(2, 3, 2, 3, "tf")
    alone = place({"HOME": "/root"})
    assert alone == Worker() and not alone.distributed and alone.is_main


def test_place_rejects_a_garbled_number():
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' is not a whole number"):
        place({"RANK": "0", "WORLD_SIZE": "two"})


@pytest.mark.parametrize("local, gpus, want", [
    (1, 0, "gloo"), (2, 0, "gloo"),      # no GPU: CPU ranks
    (1, 1, "nccl"),                      # one GPU, one rank: NCCL with one rank
    (2, 1, "gloo"), (4, 2, "gloo"),      # fewer GPUs than ranks on this node: never share a GPU
    (2, 2, "nccl"), (2, 8, "nccl"),      # a GPU per local rank (ranks on other nodes don't count)
])
def test_backend_for(local, gpus, want):
    assert backend_for(local, gpus) == want


def test_parse_line():
    assert parse_line('DPC-RESULT {"rank":1,"x":2}') == (RESULT, {"rank": 1, "x": 2})
    assert parse_line('DPC-DONE {"rank":0,"synced":true,"code":0}')[0] == DONE
    assert parse_line('DPC-START {"rank":0}')[0] == START
    for other in ["RESULT {}", "DPC-RESULT not json", "DPC-RESULT [1]", "loss 0.1", ""]:
        assert parse_line(other) is None


def test_stuck_at_tells_waiting_from_busy(tmp_path):
    code = tmp_path / "student.py"
    code.write_text("x = 1\nwork.wait()\nwhile True:\n    pass\n")
    idle = [(str(tmp_path / "threading.py"), 10, "wait")]
    in_torch = [("/v/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce")]
    assert stuck_at([idle, in_torch]) == (True, "waiting for its peers in all_reduce() (distributed_c10d.py:3252)")
    assert stuck_at([[(str(code), 2, "reduce_scatter")]])[0] is True  # a line that calls .wait(
    busy = stuck_at([idle, [(str(code), 4, "reduce_scatter")]])
    assert busy == (False, "busy in student.py:4 (reduce_scatter): pass")
    assert stuck_at([idle]) == (True, "idle")


WHERE_NOW = """\
import threading, time
from dpc_runtime.worker import where_now
seen = {}

def look():  # look until the main thread is in its loop
    end = time.monotonic() + 10
    while time.monotonic() < end:
        seen["w"] = where_now()
        if not seen["w"][0]:
            break
    seen["done"] = (True, "")

t = threading.Thread(target=look)
t.start()
while "done" not in seen:  # the main thread spins here while the other one looks at it
    pass
t.join()
print(seen["w"])
"""


def test_where_now_sees_the_main_thread_busy(tmp_path):
    # In a process of its own, as in a rank: its main thread is the script's (a test runner's may not be).
    script = tmp_path / "spin.py"
    script.write_text(WHERE_NOW)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    waiting, where = ast.literal_eval(done.stdout.strip())  # the tuple where_now() returned
    assert not waiting and "spin.py" in where and 'while "done" not in seen' in where, done.stdout + done.stderr


def test_start_refuses_a_torch_group_under_horovodrun():
    from helpers.worker import start

    with pytest.raises(ValueError, match=r"launched by horovodrun: .* call start\(backend=None\)"):
        start(environ={"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"})


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_report_and_finish_in_a_plain_process():
    done = _run("from helpers.worker import finish, report, start\n"
                "me = start(backend=None)\n"
                "print('work', flush=True)\n"
                "report(loss=0.5, ok=True, xs=[1, 2])\n"
                "finish(3)\n"
                "print('never printed')\n")
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert lines[0] == "work"
    assert parse_line(lines[1]) == (RESULT, {"rank": 0, "loss": 0.5, "ok": True, "xs": [1, 2]})
    assert parse_line(lines[2]) == (DONE, {"rank": 0, "synced": False, "code": 3})
    assert len(lines) == 3  # no START line outside a launch


def test_a_launched_rank_writes_whole_lines():
    # Unbuffered, print() would write the text and the newline apart and torchrun --tee could cut
    # the line between them; start() makes stdout and stderr write a line at once.
    import os

    env = {**os.environ, "DPC_LAUNCH_ID": "test", "PYTHONUNBUFFERED": "1"}
    code = ("import sys\nfrom helpers.worker import start\n"
            "before = [(s.line_buffering, s.write_through) for s in (sys.stdout, sys.stderr)]\n"
            "start(backend=None)\n"
            "after = [(s.line_buffering, s.write_through) for s in (sys.stdout, sys.stderr)]\n"
            "print(before, after)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[(False, True), (False, True)] [(True, False), (True, False)]"


def test_under_a_launch_the_protocol_goes_to_the_launch_file_not_stdout(tmp_path):
    import os

    env = {**os.environ, "DPC_LAUNCH_ID": "test", "DPC_PROTOCOL_DIR": str(tmp_path)}
    code = ("import os\nfrom helpers.worker import finish, report, start\nstart(backend=None)\n"
            "print('work')\nreport(loss=0.5)\nprint(os.getpid())\nfinish()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    work, pid = done.stdout.splitlines()
    assert work == "work"
    lines = (tmp_path / f"{pid}.dpc").read_text().splitlines()
    assert [parse_line(ln) for ln in lines] == [
        (START, {"rank": 0, "pid": int(pid), "world_size": 1}), (RESULT, {"rank": 0, "loss": 0.5}),
        (DONE, {"rank": 0, "synced": False, "code": 0})]


def test_under_a_launch_a_stopped_rank_writes_its_stack_to_the_launch_file(tmp_path):
    import os
    import signal
    import time

    from dpc_runtime.launch import parse_dump

    script = tmp_path / "busy.py"
    script.write_text("import time\nfrom helpers.worker import start\nstart(backend=None)\ntime.sleep(600)\n")
    env = {**os.environ, "DPC_LAUNCH_ID": "test", "DPC_PROTOCOL_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        started = tmp_path / f"{proc.pid}.dpc"
        deadline = time.monotonic() + 60
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polls for the START record: the event, not a guess of the time
        assert started.exists(), "the worker never said it started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        proc.kill()
    threads = parse_dump((tmp_path / f"0-{proc.pid}.stack").read_text().splitlines())
    assert any(frames and frames[0][0] == str(script) and frames[0][1] == 4 for frames in threads), threads


def test_report_converts_arrays_and_refuses_objects():
    done = _run("import numpy as np\nfrom helpers.worker import report\n"
                "report(a=np.arange(3), s=np.float32(1.5))\nreport(bad=object())\n")
    assert parse_line(done.stdout.splitlines()[0]) == (RESULT, {"rank": 0, "a": [0, 1, 2], "s": 1.5})
    assert "report() got a object: pass numbers, strings, bools, lists or dicts" in done.stderr


def test_every_distributed_script_of_the_course_uses_the_protocol():
    """No script starts a process group, reports or exits its own way (notebooks: the rules test)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = [p for d in ("src/helpers", "examples", "benchmarks", "tests/workers")
               for p in (root / d).rglob("*.py") if p.name != "worker.py"]
    starts = [p for p in scripts if any(s in p.read_text() for s in
                                        ("init_process_group(", "hvd.init()", "MultiWorkerMirroredStrategy("))]
    assert {p.name for p in starts} >= {"hvd_worker.py", "tf_worker.py", "hvd_allreduce.py"}
    for p in starts:
        text = p.read_text()
        assert "from helpers.worker import" in text and "finish(" in text, f"{p}: use helpers.worker"
    for p in scripts:
        assert 'print("RESULT' not in p.read_text(), f"{p}: report results with helpers.worker.report"


@pytest.mark.parametrize("nprocs, gpus, devices, backend, device", [
    (2, 0, "auto", "gloo", "cpu"), (2, 1, "auto", "gloo", "cpu"), (2, 1, "gpu", "gloo", "cuda"),
    (1, 1, "auto", "nccl", "cuda"), (4, 4, "gpu", "nccl", "cuda"), (4, 4, "cpu", "gloo", "cpu"),
])
def test_placement_is_the_one_rule_of_the_tiers(nprocs, gpus, devices, backend, device):
    got = placement(nprocs, gpus, devices)
    assert (got.backend, got.device_type) == (backend, device)
    assert got.backend == backend_for(nprocs, gpus) or devices == "cpu"  # start() agrees with it


def test_placement_refuses_what_cannot_be():
    with pytest.raises(ValueError, match="devices='gpu' but this machine has no GPU"):
        placement(2, 0, "gpu")
    with pytest.raises(ValueError, match="devices='any': use one of"):
        placement(2, 0, "any")
    assert isinstance(placement(1, 0), Placement)


def test_an_older_torch_gets_the_new_collective_names():
    # torch 2.11 (the first GPU machine's) has no reduce_scatter_single: chapter 9 failed at its first launch.
    import types

    def reduce_scatter_tensor(output, input): ...
    def all_gather_into_tensor(output, input): ...
    old = types.SimpleNamespace(reduce_scatter_tensor=reduce_scatter_tensor,
                                all_gather_into_tensor=all_gather_into_tensor)
    collective_names(old)
    assert old.reduce_scatter_single is reduce_scatter_tensor
    assert old.all_gather_single is all_gather_into_tensor


@pytest.mark.parametrize("version, ok", [("2.13.0+cpu", True), ("2.6.0", True), ("2.11.0+cu130", True),
                                         ("2.5.1+cu121", False), ("1.13.1", False)])
def test_the_minimum_torch_is_checked_in_one_line(version, ok):
    if ok:
        check_torch(version)
    else:
        with pytest.raises(RuntimeError, match=rf"^torch {re.escape(version)} is older than the course needs "
                                               r"\(2\.6: FSDP2's fully_shard, chapter 9\): pip install 'torch>=2\.6'$"):
            check_torch(version)
