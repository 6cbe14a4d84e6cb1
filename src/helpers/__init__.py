"""The students' library, the lesson: what the chapters call, each function naming the chapter that teaches it.

Devices and timing (chapter 0), data (chapters 1-2), towers (chapter 4), the ring (chapter 5), DDP and
SyncBN (chapter 7), several machines (chapter 8), elastic restarts (chapter 10), whether the machine is
calm enough to time a comparison (chapters 8, 11). The plumbing a chapter calls (launching workers, quiet
output) lives in the runtime, `dpc_runtime`, and is re-exported here so that a notebook only ever writes
`import helpers`.

Its files, in the order the chapters use them:
- devices.py: the devices this machine has, and N of them anyway (chapter 0);
- timing.py: timers, throughput, speed-up tables, whether the machine is calm enough (chapters 0-2, 5, 6, 8, 11);
- data.py: small datasets that need no network, and the real loaders (chapters 1-2);
- tfmodels.py: the TensorFlow models and input pipelines of chapters 1-2;
- profiling.py: a profiler's timeline read as named ranges and busy windows (chapter 1);
- towers.py: manual towers on devices of different speed (chapter 4);
- ring.py: the ring all-reduce from scratch, its cost model and measurement (chapter 5);
- link.py: a network you can dial, for chapter 5's model and chapter 11's buckets;
- worker.py: a worker script's start, report and finish (dpc_runtime.worker, re-exported);
- ddp.py: the small pieces of a DDP training script (chapter 7);
- syncbn.py: synchronised batch norm that runs on CPU too (chapter 7);
- multinode.py: several nodes on one machine, and SLURM's variables (chapter 8);
- elastic.py: torchrun with restarts, its output kept (chapter 10);
- grading.py: what the labs' test cells call to be judged (dpc_runtime.judge, re-exported).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from dpc_runtime.launch import LaunchError, LaunchResult, free_port, launch, quiet_env
from dpc_runtime.quiet import harmless, import_tensorflow, keep_tensorflow_private, quiet_stderr

from . import worker
from .data import SlowSource, WhoLoads, digits, load_images, synthetic_images, tf_pipeline_ops
from .devices import DeviceError, Inventory, TorchPlan, cpu_cores, inventory, tf_devices, torch_plan
from .profiling import busy_per_window, named_ranges
from .timing import (
    EpochClock,
    MachineCheck,
    MachineWatch,
    ScalingRow,
    Timer,
    format_table,
    keras_epoch_timer,
    measure,
    plot_breakdown,
    plot_speedup,
    relative_spread,
    scaling_table,
    speedup_table,
    throughput,
    usable_cores,
)

# Before anything imports TensorFlow in this process: its libraries then stay private, and PyTorch's
# triton (its CUDA build) can be loaded after it (dpc_runtime.quiet; a kernel died of this, issue 59).
keep_tensorflow_private()

__all__ = [
    "DeviceError", "EpochClock", "Inventory", "LaunchError", "LaunchResult", "ScalingRow",
    "SlowSource", "Timer", "WhoLoads", "TorchPlan", "busy_per_window", "cpu_cores", "digits",
    "format_table", "free_port", "harmless", "import_tensorflow", "inventory", "keep_tensorflow_private",
    "keras_epoch_timer", "launch", "load_images", "MachineCheck", "MachineWatch", "measure", "named_ranges",
    "plot_breakdown", "plot_speedup",
    "quiet_env", "quiet_stderr", "relative_spread", "scaling_table", "sh", "speedup_table", "synthetic_images",
    "tf_devices", "tf_pipeline_ops", "throughput", "torch_plan", "usable_cores", "worker",
]


def sh(cmd: str | Sequence[str], *, timeout: float = 600.0) -> str:
    """Run a shell command from a notebook, print and return its output; fail the cell if it fails (chapter 0).

    Known harmless start-up lines (helpers.harmless) are returned but not printed.
    """
    shell = isinstance(cmd, str)
    done = subprocess.run(cmd, shell=shell, capture_output=True, text=True, timeout=timeout,
                          env={**quiet_env(1), **os.environ})
    out = done.stdout + done.stderr
    shown = "".join(ln for ln in out.splitlines(keepends=True) if not harmless(ln))
    print(shown, end="" if shown.endswith("\n") or not shown else "\n")
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return out
