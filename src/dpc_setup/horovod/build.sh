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
#
# Usage: src/dpc_setup/horovod/build.sh PYTHON   -> prints the path of the cached wheel on its last line.
# Cache: $DPC_CACHE (default ~/.cache/dp-course)/horovod/<key>/, where key changes with Python,
# TensorFlow, PyTorch, CUDA and the patches, so a stale wheel is never reused.
# GPU: when nvcc and a CUDA build of torch are present, NCCL is built in (HOROVOD_GPU_OPERATIONS=NCCL).
set -euo pipefail

PY=${1:?usage: build.sh PYTHON}
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=0.28.1
CACHE=${DPC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dp-course}

if ! command -v g++ >/dev/null 2>&1; then
  echo "Horovod needs a C++17 compiler and none was found: install g++ (Debian/Ubuntu: sudo apt-get install g++)" >&2
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
GPU=cpu
if [ "$TORCHCUDA" != cpu ] && command -v nvcc >/dev/null 2>&1 && [ "${DPC_HOROVOD_CPU_ONLY:-0}" != 1 ]; then
  GPU="cuda$TORCHCUDA"
fi
PATCH_SUM=$(cat "$HERE"/patches/*.patch "$0" | sha256sum | cut -c1-12)
KEY="$VERSION-$PYVER-tf$TFVER-torch$TORCHVER-$GPU-$PATCH_SUM"
OUT="$CACHE/horovod/$KEY"
WHEEL=$(ls "$OUT"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$WHEEL" ]; then
  echo "Horovod wheel cached: $WHEEL"
  echo "$WHEEL"
  exit 0
fi

echo "Building Horovod $VERSION for $KEY (about 6 minutes on 2 cores; once per machine)..."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK" 2>&1 \
  | grep -v "^WARNING: Location" || true
tar -xzf "$WORK/horovod-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
for p in "$HERE"/patches/*.patch; do
  echo "  applying $(basename "$p")"
  (cd "$SRC" && git apply -p1 "$p")
done

# cmake comes from requirements.txt (pinned < 4: CMake 4 refuses the CMake 2.8 files that
# Horovod's bundled gloo and flatbuffers still carry).
export PATH="$(dirname "$PY"):$PATH"
export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_CPU_OPERATIONS=GLOO
export CMAKE_POLICY_VERSION_MINIMUM=3.5
export MAKEFLAGS="-j$(nproc)" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
if [ "$GPU" != cpu ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
fi
LOG="$WORK/build.log"
if ! "$PY" -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" >"$LOG" 2>&1; then
  tail -n 60 "$LOG" >&2
  echo "Horovod build failed (last 60 lines above)." >&2
  exit 1
fi
mkdir -p "$OUT"
cp "$WORK"/dist/horovod-*.whl "$OUT/"
WHEEL=$(ls "$OUT"/horovod-*.whl | head -n1)
echo "Horovod wheel built: $WHEEL"
echo "$WHEEL"
