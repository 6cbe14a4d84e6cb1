"""Test worker for helpers.launch: every rank records its pid, then behaves as argv[1] says.

ok: all-reduce and print; crash: the last rank raises; hang: the last rank sleeps forever before
the all-reduce (so the others wait in it); for --launcher tf no torch.distributed is used.
"""
import os
import sys
import time
from pathlib import Path

mode = sys.argv[1]
rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("HOROVOD_SIZE", "1")))
piddir = os.environ.get("DPC_TEST_PIDDIR")
if piddir:
    Path(piddir, f"{rank}-{os.getpid()}").touch()
last = rank == world - 1

if mode.startswith("tf-"):  # plain processes: TF_CONFIG tells each who it is
    import json
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    print(f"worker {task['index']} of {world}")
    if mode == "tf-crash" and last:
        raise SystemExit("worker fails on purpose")
    if mode == "tf-crash":
        time.sleep(600)  # a peer that would wait forever for the crashed one
    sys.exit(0)

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {rank} ready")
if mode == "crash" and last:
    raise RuntimeError(f"rank {rank} fails on purpose")
if mode == "hang" and last:
    time.sleep(600)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} sum {t.item():.0f}")
dist.destroy_process_group()
