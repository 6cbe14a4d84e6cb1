#!/usr/bin/env bash
# Build Horovod 0.28.1 as a wheel for this environment's TensorFlow and PyTorch, once, and cache it.
#
# Why a build at all: Horovod's last release (0.28.1, June 2023) ships no wheels, and its sdist
# does not build against TensorFlow 2.21 / PyTorch 2.13 as released. The patches beside this file
# fix that (each one says why):
#   0001-cxx17.patch          PyTorch >= 2.1 headers need C++17; Horovod asked for C++14.
#   0002-no-xla-ops.patch     xla_mpi_ops.cc does not compile against TF 2.21 headers; the XLA ops
#                             only serve XLA-compiled GPU graphs, which the course does not use.
#   0003-tf-keras-backend.patch  horovod.tensorflow.keras took its backend from `keras`, which is
#                             Keras 3 now; Horovod drives tf-keras (TF_USE_LEGACY_KERAS=1) only.
#   0004-torch-cuda-build-without-toolkit.patch  PyPI's default torch is a CUDA build; Horovod then
#                             compiles its torch extension with CUDA and needs the CUDA toolkit, which
#                             a laptop without a GPU lacks. HOROVOD_TORCH_WITHOUT_CUDA=1 (set below
#                             for a CPU build) builds the CPU (Gloo) extension against that torch.
#   0005-release-build.patch  Release instead of RelWithDebInfo: the same -O3 without -g (the debug
#                             information of the TensorFlow and PyTorch headers every file includes):
#                             on 2 idle cores the build took 222 s instead of 292 s, the wheel 1.7 MB
#                             instead of 32.8 MB (one build each, 2026-11-28).
#
# Usage: src/dpc_setup/horovod/build.sh PYTHON   -> prints the path of the cached wheel on its last line.
# Cache: $DPC_CACHE (default ~/.cache/dp-course)/horovod/<key>/, where key changes with Python,
# TensorFlow, PyTorch, CUDA and the patches, so a stale wheel is never reused.
# GPU: on a machine with an NVIDIA GPU (DPC_GPU, default: `nvidia-smi -L` lists one, as in setup.sh),
# with nvcc and a CUDA build of torch, NCCL is built in (HOROVOD_GPU_OPERATIONS=NCCL); everywhere
# else the CPU (Gloo) variant, whichever torch build is installed.
# Messages and progress (a line every 20 s) go to stderr, the wheel's path alone to stdout. The build's
# log is kept in $DPC_HOROVOD_LOG (default build/horovod-build.log); a failure quotes its first error
# line and the fix the course knows (src/dpc_setup/buildlog.py).
# DPC_HOROVOD_JOBS: compile jobs (default: the cores). For tests: DPC_HOROVOD_PATCHES (the patch folder),
# DPC_HOROVOD_PROGRESS_S (seconds between progress lines, default 20).
set -euo pipefail

PY=${1:?usage: build.sh PYTHON}
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=0.28.1
CACHE=${DPC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dp-course}
PATCHES=${DPC_HOROVOD_PATCHES:-$HERE/patches}
LOG=${DPC_HOROVOD_LOG:-build/horovod-build.log}
mkdir -p "$(dirname "$LOG")"
LOG=$(cd "$(dirname "$LOG")" && pwd)/$(basename "$LOG")
say() { echo "$@" >&2; }

if ! command -v g++ >/dev/null 2>&1; then
  say "Horovod needs a C++17 compiler and none was found: install g++ (Debian/Ubuntu: sudo apt-get install g++)"
  exit 1
fi

# What the wheel depends on: Python ABI, frameworks, CUDA, and our patches.
read -r PYVER TFVER TORCHVER TORCHCUDA < <("$PY" - <<'EOF'
import sys, importlib.metadata as m
import torch
print(f"cp{sys.version_info.major}{sys.version_info.minor}", m.version("tensorflow"),
      m.version("torch"), torch.version.cuda or "cpu")
EOF
)
HAS_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then HAS_GPU=1; fi
GPU=cpu
if [ "${DPC_GPU:-$HAS_GPU}" = 1 ] && [ "$TORCHCUDA" != cpu ] && command -v nvcc >/dev/null 2>&1; then
  GPU="cuda$TORCHCUDA"
fi
shopt -s nullglob
PATCH_FILES=("$PATCHES"/*.patch)
shopt -u nullglob
PATCH_SUM=$(cat "${PATCH_FILES[@]}" "$0" | sha256sum | cut -c1-12)
KEY="$VERSION-$PYVER-tf$TFVER-torch$TORCHVER-$GPU-$PATCH_SUM"
OUT="$CACHE/horovod/$KEY"
WHEEL=$(ls "$OUT"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$WHEEL" ]; then
  say "Horovod wheel cached: $WHEEL"
  echo "$WHEEL"
  exit 0
fi

say "Building Horovod $VERSION for $KEY (about 6 minutes on 2 cores; once per machine; log: $LOG)"
WORK=$(mktemp -d)
BUILD=
# On any exit (a Ctrl-C too) the compile stops with the script: the build runs in a group of its own.
cleanup() { if [ -n "$BUILD" ]; then kill -TERM -- "-$BUILD" 2>/dev/null || true; fi; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
if ! "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK" >"$LOG" 2>&1 \
   || [ ! -f "$WORK/horovod-$VERSION.tar.gz" ]; then
  grep -v "^WARNING: Location" "$LOG" | tail -n 5 >&2
  say "Could not download Horovod $VERSION's source from the package index (log: $LOG)."
  exit 1
fi
tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
for p in "${PATCH_FILES[@]}"; do
  say "  applying $(basename "$p")"
  (cd "$SRC" && git apply -p1 "$p")
done

# cmake comes from requirements.txt (pinned < 4: CMake 4 refuses the CMake 2.8 files that
# Horovod's bundled gloo and flatbuffers still carry).
export PATH="$(dirname "$PY"):$PATH"
export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_CPU_OPERATIONS=GLOO
export CMAKE_POLICY_VERSION_MINIMUM=3.5
JOBS=${DPC_HOROVOD_JOBS:-$(nproc)}
export MAKEFLAGS="-j$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
if [ "$GPU" != cpu ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
elif [ "$TORCHCUDA" != cpu ]; then
  export HOROVOD_TORCH_WITHOUT_CUDA=1  # patch 0004: a CUDA torch, built for here without CUDA
fi
# -v: CMake's and the compiler's lines reach the log (progress and the first error are read from it).
setsid "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" >>"$LOG" 2>&1 &
BUILD=$!
start=$(date +%s)
EVERY=${DPC_HOROVOD_PROGRESS_S:-20}
next=$((start + EVERY))
while kill -0 "$BUILD" 2>/dev/null; do
  sleep 1
  if [ "$(date +%s)" -ge "$next" ] && kill -0 "$BUILD" 2>/dev/null; then
    say "  Horovod build, $(( $(date +%s) - start )) s: $("$PY" "$HERE/../buildlog.py" progress "$LOG")"
    next=$((next + EVERY))
  fi
done
if ! wait "$BUILD"; then
  BUILD=
  "$PY" "$HERE/../buildlog.py" failure "$LOG" >&2
  exit 1
fi
BUILD=
mkdir -p "$OUT"
cp "$WORK"/dist/horovod-*.whl "$OUT/"
WHEEL=$(ls "$OUT"/horovod-*.whl | head -n1)
say "Horovod wheel built in $(( $(date +%s) - start )) s: $WHEEL"
echo "$WHEEL"
