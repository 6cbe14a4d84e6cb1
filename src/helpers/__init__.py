"""The course's helper library: devices, timing, launching workers (helpers.worker is their side), offline data, shell commands."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from .data import (SlowSource, WhoLoads, digits, load_images, synthetic_images,
                   tf_pipeline_ops)
from .devices import (DeviceError, Inventory, TorchPlan, cpu_cores, inventory, tf_devices,
                      torch_plan)
from .launch import LaunchError, LaunchResult, free_port, launch, quiet_env
from .profiling import busy_per_window, named_ranges
from .quiet import harmless, import_tensorflow, quiet_stderr
from .timing import (EpochClock, ScalingRow, Timer, format_table, keras_epoch_timer, measure,
                     plot_breakdown, plot_speedup, scaling_table, speedup_table, throughput)

__all__ = [
    "DeviceError", "EpochClock", "Inventory", "LaunchError", "LaunchResult", "ScalingRow",
    "SlowSource", "Timer", "WhoLoads", "TorchPlan", "busy_per_window", "cpu_cores", "digits",
    "format_table", "free_port", "harmless", "import_tensorflow", "named_ranges", "quiet_stderr", "inventory", "keras_epoch_timer", "launch", "load_images", "measure", "plot_breakdown", "plot_speedup",
    "scaling_table", "sh", "speedup_table", "synthetic_images", "tf_devices", "tf_pipeline_ops", "throughput",
    "torch_plan",
]


def sh(cmd: str | Sequence[str], *, timeout: float = 600.0) -> str:
    """Run a shell command from a notebook, print and return its output; fail the cell if it fails.

    Known harmless start-up lines (helpers.quiet) are returned but not printed.
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
