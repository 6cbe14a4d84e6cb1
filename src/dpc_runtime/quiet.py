"""Harmless lines that read like errors, and how the course keeps them out of a student's notebook.

TensorFlow's C++ start-up prints to the process's stderr (shown in red in a notebook) before any
Python code can filter it: "Could not find cuda drivers", "failed call to cuInit: ... UNKNOWN
ERROR (303)" on a machine without an NVIDIA driver, CPU-instruction notices. torchrun prints a
notice about OMP_NUM_THREADS on every multi-process launch; torch.profiler's engine (Kineto)
announces every profiler start and stop. None of them is a problem; chapter 0 says what each one
means. `helpers.launch` does not echo them (they stay in `LaunchResult.lines`), `quiet_stderr()`
runs a block without them, and `import_tensorflow()` imports TensorFlow without them. Every other
line still shows.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

QUIET_LINES = re.compile(
    r"failed call to cuInit|Could not find cuda drivers|cuda_(executor|diagnostics|dnn|fft|blas)\.cc|"
    r"Unable to register cu(DNN|FFT|BLAS) factory|oneDNN custom operations are on|"
    r"This TensorFlow binary is optimized to use available CPU instructions|"
    r"rebuild TensorFlow with the appropriate compiler flags|computation_placer\.cc|"
    r"absl::InitializeLog|TF-TRT Warning|Setting OMP_NUM_THREADS environment variable|"
    r"^\*{10,}$|Sending process \d+ closing signal SIGTERM|"
    r"^USDT:.*\] profiler_(start|stop)\s*$")

__all__ = ["QUIET_LINES", "harmless", "import_tensorflow", "quiet_stderr"]


def harmless(line: str) -> bool:
    """True for a known harmless start-up line (see the module's docstring)."""
    return bool(QUIET_LINES.search(line))


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """Run a block with the process's stderr caught; show again every line but the harmless ones."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
            kept = [ln for ln in text.splitlines() if ln.strip() and not harmless(ln)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def import_tensorflow() -> ModuleType:
    """Import TensorFlow and list its devices with the harmless C++ start-up lines left out."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()  # where the driver is probed (cuInit)
    return tf
