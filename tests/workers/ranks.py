"""Test worker for helpers.launch and helpers.worker: every rank records its pid, then behaves as argv[1] says.

ok: all-reduce, report, finish; crash: the last rank raises; hang: the last rank sleeps forever
before the all-reduce (so the others wait in it); hang-own-sigterm: the same, every rank having
set a SIGTERM handler of its own (that leaves at once: no dump as it is stopped); early-exit: the last rank leaves with exit code
0 before the all-reduce (its peers see the connection drop); big-report: every rank reports
300 KB (torchrun's --tee cut such lines); late-start: the last rank sleeps
before start() (so it never says it started); abort-after-done: every rank
finishes, then the last one aborts (SIGABRT) as gloo's teardown sometimes does; no-protocol-abort:
the same abort after a plain last line, without the protocol (the other ranks leave cleanly); env: every rank reports what the
launcher put in its environment; stray: rank 0 leaves a process that outlives it (double fork,
a session of its own, an empty environment), which writes its pid to DPC_TEST_STRAY.pid and, 30 s
later, DPC_TEST_STRAY.forged; tf-*: plain processes (no torch.distributed).
"""
import os
import signal
import sys
import time
from pathlib import Path

from helpers.worker import finish, report, start

mode = sys.argv[1]
if mode == "late-start" and os.environ["RANK"] == str(int(os.environ["WORLD_SIZE"]) - 1):
    time.sleep(600)
me = start(backend=None if mode.startswith("tf-") else "gloo",
           timeout=float(os.environ.get("DPC_TEST_START_TIMEOUT", 300)))
rank, world = me.rank, me.world_size
piddir = os.environ.get("DPC_TEST_PIDDIR")
if piddir:
    Path(piddir, f"{rank}-{os.getpid()}").touch()
last = rank == world - 1

if mode.startswith("tf-"):  # plain processes: TF_CONFIG tells each who it is
    print(f"worker {rank} of {world}")
    if mode == "tf-crash" and last:
        raise SystemExit("worker fails on purpose")
    if mode == "tf-crash":
        time.sleep(600)  # a peer that would wait forever for the crashed one
    report(worker=rank)
    finish(barrier=False)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

print(f"rank {rank} ready")
if mode == "hang-own-sigterm":  # a handler of the rank's own (a library's, a student's) replaces the dump
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
if mode == "crash" and last:
    raise RuntimeError(f"rank {rank} fails on purpose")
if mode in ("hang", "hang-own-sigterm") and last:
    time.sleep(600)
if mode == "early-exit" and last:
    sys.stdout.flush()
    os._exit(0)
if mode == "big-report":
    report(big="x" * 300_000)
    finish()
if mode == "env":  # what the launcher put in this rank's environment, and where start() put it
    report(cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"), rank_device=os.environ.get("DPC_RANK_DEVICE"),
           device=me.device, cuda=torch.cuda.is_available())
    finish()
if mode == "stray" and rank == 0:
    stray = os.environ["DPC_TEST_STRAY"]
    if os.fork() == 0:  # the child: a session of its own, then a grandchild that outlives it
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sh", ["sh", "-c", f"echo $$ > {stray}.tmp && mv {stray}.tmp {stray}.pid; "
                                  f"sleep 30; echo forged > {stray}.forged"], {})
        os._exit(0)
    while not Path(f"{stray}.pid").exists():  # the grandchild is running before this rank goes on
        time.sleep(0.05)
t = torch.tensor([float(rank + 1)], device=me.device)
dist.all_reduce(t)
print(f"rank {rank} sum {t.item():.0f}")
report(sum=t.item(), backend=me.backend, device=me.device)
if mode == "no-protocol-abort":
    dist.barrier()
    if last:
        os.kill(os.getpid(), signal.SIGABRT)
    # The others leave without gloo's teardown: after sys.exit(0) it aborts them too now and then on
    # a loaded machine ('terminate called without an active exception': seen in CI, both ranks -6).
    sys.stdout.flush()
    os._exit(0)
if mode == "abort-after-done":
    # What finish() prevents: a rank that has reported done dying in teardown. Simulate it: the
    # DONE line, then SIGABRT instead of a clean exit.
    dist.barrier()
    os.write(1, f'DPC-DONE {{"rank":{rank},"synced":true,"code":0}}\n'.encode())
    if last:
        os.kill(os.getpid(), signal.SIGABRT)
    os._exit(0)
finish()
