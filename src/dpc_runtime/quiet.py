"""Harmless lines that read like errors, and how the course keeps them out of a student's notebook.

TensorFlow's C++ start-up prints to the process's stderr (shown in red in a notebook) before any
Python code can filter it: "Could not find cuda drivers", "failed call to cuInit: ... UNKNOWN
ERROR (303)" on a machine without an NVIDIA driver, CPU-instruction notices. torchrun prints a
notice about OMP_NUM_THREADS on every multi-process launch; torch.profiler's engine (Kineto)
announces every profiler start and stop. None of them is a problem; chapter 0 says what each one
means. `helpers.launch` does not echo them (they stay in `LaunchResult.lines`), `quiet_stderr()`
runs a block without them, and `import_tensorflow()` imports TensorFlow without them. Every other
line still shows.

It also keeps TensorFlow's C++ libraries to themselves (`keep_tensorflow_private`, chapter 0): TensorFlow's
wheel loads them with RTLD_GLOBAL, which puts the copy of LLVM and MLIR they carry into the process's
global symbol scope. PyTorch's CUDA build from PyPI brings triton, whose libtriton.so carries another LLVM
and is not linked to prefer its own symbols: loaded after TensorFlow (building a `torch.optim` optimizer
imports torch._dynamo, which imports triton), its static initialisers bind to TensorFlow's LLVM and the
process dies with a segmentation fault (in llvm::DebugCounter, PassBuilder.cpp's initialiser). TensorFlow
loads them privately (RTLD_LOCAL, as on macOS) when its module `pywrap_dlopen_global_flags` cannot be
imported; its own libraries and the custom ops of this course (Horovod's) name their dependencies and
need nothing global. `import helpers` does this before any TensorFlow import of the course's kernels.
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

__all__ = ["QUIET_LINES", "harmless", "import_tensorflow", "keep_tensorflow_private", "quiet_stderr"]

# The module that makes TensorFlow's pywrap_tensorflow load its libraries with RTLD_GLOBAL.
TF_GLOBAL_FLAGS = "tensorflow.python.pywrap_dlopen_global_flags"


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


def keep_tensorflow_private() -> bool:
    """Have TensorFlow load its C++ libraries with RTLD_LOCAL, so PyTorch's triton keeps its own LLVM
    (chapter 0); False when TensorFlow's libraries are already loaded, and with RTLD_GLOBAL."""
    if "tensorflow.python.pywrap_tensorflow" in sys.modules:
        return sys.modules.get(TF_GLOBAL_FLAGS, 0) is None
    sys.modules[TF_GLOBAL_FLAGS] = None  # type: ignore[assignment]  # `from ... import` then fails: RTLD_LOCAL
    return True


def import_tensorflow() -> ModuleType:
    """Import TensorFlow (its libraries kept private) and list its devices with the harmless C++
    start-up lines left out."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    keep_tensorflow_private()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with quiet_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()  # where the driver is probed (cuInit)
    return tf
