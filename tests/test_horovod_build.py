"""Horovod's build as a student meets it (issue 42): progress while it compiles, and a failure that
quotes the real error, names the fix the course knows and keeps the whole log.

The build itself is src/dpc_setup/horovod/build.sh (the real one, minutes, runs in every set-up and in
tests/test_student_install.py); here it runs against a fake Python whose `pip wheel` prints what a
real build prints and fails as a machine without the CUDA toolkit made it fail.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gradekit import ROOT

from dpc_setup import buildlog

pytestmark = pytest.mark.gate  # tests/tiers.py

HOROVOD = ROOT / "src" / "dpc_setup" / "horovod"

CMAKE_CUDA = """\
-- Found Pytorch: 2.13.0+cu130 (found suitable version "2.13.0+cu130", minimum required is "1.5.0")
CMake Error at /usr/share/cmake/Modules/FindPackageHandleStandardArgs.cmake:230 (message):
  Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)
Call Stack (most recent call first):
  horovod/torch/CMakeLists.txt:23 (add_cuda)

-- Configuring incomplete, errors occurred!
  error: subprocess-exited-with-error
"""
COMPILE = """\
[  2%] Building CXX object horovod/common/CMakeFiles/common.dir/common.cc.o
[ 37%] Building CXX object horovod/torch/CMakeFiles/pytorch.dir/mpi_ops_v2.cc.o
"""
NO_HEADERS = COMPILE + """\
/tmp/x/horovod/torch/adapter_v2.cc:16:10: fatal error: Python.h: No such file or directory
   16 | #include <Python.h>
      |          ^~~~~~~~~~
compilation terminated.
gmake[2]: *** [horovod/torch/CMakeFiles/pytorch.dir/build.make:76: adapter_v2.cc.o] Error 1
  error: subprocess-exited-with-error
"""


def test_progress_names_the_stage_from_the_log() -> None:
    """Configure before the first compile line; then the percentage, the files so far, the last file;
    link; package once the wheel is written."""
    assert buildlog.progress("").startswith("configure")
    assert buildlog.progress("-- Found Pytorch\n").startswith("configure")
    assert buildlog.progress(COMPILE) == "compile 37 % (2 files so far, now mpi_ops_v2.cc)"
    linking = COMPILE + "[ 98%] Linking CXX shared library ../../lib.linux/horovod/torch/mpi_lib_v2.so\n"
    assert buildlog.progress(linking) == "link mpi_lib_v2.so (98 %)"
    assert buildlog.progress(linking + "creating build/bdist.linux-x86_64/wheel\n") == "package (the wheel)"


def test_the_first_error_is_the_cause_with_its_lines() -> None:
    """CMake's error with its indented message, not pip's summary after it; a compiler's fatal error
    before make's; and the fix for each."""
    assert buildlog.first_error(CMAKE_CUDA) == [
        "CMake Error at /usr/share/cmake/Modules/FindPackageHandleStandardArgs.cmake:230 (message):",
        "  Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)"]
    assert "DPC_GPU=0" in buildlog.fix(CMAKE_CUDA)
    assert buildlog.first_error(NO_HEADERS)[0].endswith("fatal error: Python.h: No such file or directory")
    assert "python3-dev" in buildlog.fix(NO_HEADERS)
    assert buildlog.fix(COMPILE) is None and buildlog.first_error(COMPILE) == []
    # As pip wheel -v writes it: everything the build printed, two spaces in.
    indented = "".join("  " + line + "\n" for line in (COMPILE + CMAKE_CUDA).splitlines())
    assert buildlog.first_error(indented) == buildlog.first_error(CMAKE_CUDA)
    assert buildlog.progress(indented).startswith("compile 37 %")
    unknown = buildlog.failure(COMPILE + "something odd\n", "build/horovod-build.log")
    assert "no error line the course recognises" in unknown and "something odd" in unknown


FAKE_PYTHON = r"""#!/usr/bin/env bash
# A Python for build.sh: its version script, pip download (an empty source), pip wheel (fails as
# configured), and any script file run with the real Python.
if [ "$1" = - ]; then cat >/dev/null; echo "cp311 2.21.0 2.13.0+cu130 13.0"; exit 0; fi
if [ "$1 $2 $3" = "-m pip download" ]; then
  dest="${@: -1}"; mkdir -p "$dest/horovod-0.28.1"
  tar -czf "$dest/horovod-0.28.1.tar.gz" -C "$dest" horovod-0.28.1; exit 0
fi
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  echo "HOROVOD_TORCH_WITHOUT_CUDA=${HOROVOD_TORCH_WITHOUT_CUDA:-unset}"
  echo "[ 37%] Building CXX object horovod/torch/CMakeFiles/pytorch.dir/mpi_ops_v2.cc.o"
  while [ ! -f "$FAKE_GO" ]; do sleep 0.2; done   # until the test has seen a progress line
  cat "$FAKE_LOG"; exit 1
fi
exec "$REAL_PYTHON" "$@"
"""


def test_a_failed_build_quotes_its_error_and_keeps_the_log(tmp_path: Path) -> None:
    """A CUDA torch on a machine without a GPU is built for the CPU (HOROVOD_TORCH_WITHOUT_CUDA=1); while
    it compiles a progress line comes; when it fails, stderr holds the first CMake error line, the fix
    and the log's path, and the log holds the whole output."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "patches").mkdir()
    (tmp_path / "failure.txt").write_text(CMAKE_CUDA)
    log = tmp_path / "logs" / "horovod-build.log"
    env = {**os.environ, "DPC_CACHE": str(tmp_path / "cache"), "DPC_HOROVOD_LOG": str(log),
           "DPC_HOROVOD_PATCHES": str(tmp_path / "patches"), "DPC_HOROVOD_PROGRESS_S": "1", "DPC_GPU": "0",
           "REAL_PYTHON": sys.executable, "FAKE_LOG": str(tmp_path / "failure.txt"),
           "FAKE_GO": str(tmp_path / "go")}
    build = subprocess.Popen(["bash", str(HOROVOD / "build.sh"), str(fake)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert build.stderr is not None
    seen = []
    for line in build.stderr:  # the progress line comes while the build still runs
        seen.append(line)
        if "Horovod build, " in line:
            (tmp_path / "go").touch()
            break
    out, err = build.communicate(timeout=120)
    err = "".join(seen) + err
    assert build.returncode == 1 and out == "", (out, err)
    assert "compile 37 % (1 files so far, now mpi_ops_v2.cc)" in err, err
    assert "Horovod's build failed. First error:" in err, err
    assert "  Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)" in err, err
    assert "Fix: torch here is a CUDA build" in err and f"The whole build log: {log}" in err, err
    kept = log.read_text()
    assert "HOROVOD_TORCH_WITHOUT_CUDA=1" in kept and "Call Stack (most recent call first):" in kept
    assert not list((tmp_path / "cache").rglob("*.whl"))



def test_the_builds_time_is_said_once_in_the_build_and_pointed_to_elsewhere() -> None:
    """Horovod's build time is one measured figure, said by the build as it starts (issue 55): every text a
    student or instructor reads (READMEs, Makefiles, the set-up, the launcher's message, the notebooks) points
    to that line instead of giving a figure of its own that goes stale."""
    import re

    said = re.findall(r"about \d+ minutes on 2 cores", (HOROVOD / "build.sh").read_text())
    assert said == ["about 6 minutes on 2 cores"]
    texts = [ROOT / "README.md", ROOT / "Makefile", ROOT / "src" / "dpc_setup" / "setup.sh",
             ROOT / "src" / "dpc_runtime" / "launch.py", *sorted((ROOT / "src" / "dpc_instructor" / "student_files").iterdir()),
             *sorted((ROOT / "course").glob("*.ipynb")), *sorted((ROOT / "solutions").glob("*/*.ipynb"))]
    estimate = r"(?:about \d+(?:[–-]\d+)? minutes?|\d+[–-]\d+ minutes|\d+-minute)"
    figure = re.compile(rf"(?i)horovod[^.]{{0,160}}?{estimate}|{estimate}[^.]{{0,40}}horovod")
    for path in texts:
        if path.is_file():
            found = [m.group(0) for m in figure.finditer(path.read_text()) if "Needs" not in m.group(0)]
            assert not found, (path.relative_to(ROOT), found)
