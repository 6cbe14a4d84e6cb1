#!/usr/bin/env bash
# Idempotent set-up, run by every make target: a virtual environment .venv with the pinned
# packages (requirements.txt), the course's helpers (src/, editable: helpers and the other course packages), and Horovod built from
# source with the course's patches (cached outside the repo, see src/dpc_setup/horovod/build.sh).
# A second run only checks a stamp and returns in about a second.
# Horovod has a stamp of its own (.venv/.dpc-horovod): DPC_HOROVOD=1 (default) builds it if missing,
# DPC_HOROVOD=later leaves it for its first need (`make lab`: JupyterLab opens without waiting for the
# build; chapter 6 and lab 6 say to run `make horovod`), DPC_HOROVOD=0 never builds it.
# Variables: PYTHON (default python3), DPC_HOROVOD (1, later, 0), DPC_CACHE for the wheel cache,
# DPC_GPU=1/0 to force/skip the GPU extras (default: on when `nvidia-smi -L` lists a GPU).
# torch: without a GPU, a CPU build of the pinned torch (PyPI's default is a CUDA build, whose NVIDIA
# libraries only a GPU uses: 3 GB more), from DPC_TORCH_INDEX: PyTorch's CPU wheel index by default,
# or an instructor's mirror (an index URL, or a folder of wheels). Where it does not answer, pip's own
# choice stands (on PyPI, the CUDA build) and the set-up says so, with its size.
# DPC_VENV=folder builds that environment instead of .venv, with the pins of DPC_EXTRA_REQUIREMENTS
# too and without the course's packages (the class environment: src/dpc_setup/class_env.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=${DPC_VENV:-.venv}
EXTRA=${DPC_EXTRA_REQUIREMENTS:-}
STAMP=$VENV/.dpc-setup
LOG=${DPC_SETUP_LOG:-build/setup.log}
mkdir -p build

bash src/dpc_setup/system.sh  # bubblewrap, slurm-wlm, munge (only what is missing; see the script)

command -v "$PYTHON" >/dev/null || { echo "setup: $PYTHON not found: install Python 3.11 (3.10-3.12 work)" >&2; exit 1; }
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 1)' \
  || { echo "setup: $("$PYTHON" --version) is too old: the pinned TensorFlow needs Python >= 3.10" >&2; exit 1; }

# On a machine with an NVIDIA driver, TensorFlow needs its CUDA libraries (the `and-cuda` extra);
# torch from the registry is already a CUDA build there, and Horovod then gets NCCL (build.sh).
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then GPU=1; fi
GPU=${DPC_GPU:-$GPU}

HVD=${DPC_HOROVOD:-1}
case "$HVD" in 0|1|later) ;; *) echo "setup: DPC_HOROVOD=$HVD: use 1 (build now), later or 0" >&2; exit 2;; esac
WANT=$(cat requirements.txt $EXTRA pyproject.toml src/dpc_setup/setup.sh | sha256sum | cut -c1-16)-gpu$GPU
HVD_STAMP=$VENV/.dpc-horovod
HVD_WANT=$(cat requirements.txt $EXTRA src/dpc_setup/horovod/build.sh src/dpc_setup/horovod/patches/*.patch \
           | sha256sum | cut -c1-16)-gpu$GPU
hvd_ready() { [ -f "$HVD_STAMP" ] && [ "$(cat "$HVD_STAMP")" = "$HVD_WANT" ]; }
hvd_later() {
  if [ "$HVD" = later ] && ! hvd_ready; then
    echo "setup: Horovod (chapter 6, lab 6 and chapter 8's horovodrun) is not built yet: \`make horovod\` builds it when you get there (once per machine; its first line says how long)"
  fi
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ] && { [ "$HVD" != 1 ] || hvd_ready; }; then
  echo "setup: $VENV is up to date"
  hvd_later
  exit 0
fi

start=$(date +%s)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup: $VENV is up to date; Horovod next"
else
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
: >"$LOG"
TORCH_PIN=$(grep -E '^torch==' requirements.txt)
if [ "$GPU" = 0 ] && ! "$VENV/bin/python" -m pip show -q torch >/dev/null 2>&1; then
  TORCH_INDEX=${DPC_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
  if [ -d "$TORCH_INDEX" ]; then
    TORCH_FROM=(--find-links "$TORCH_INDEX")
  elif "$VENV/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()' \
       "$TORCH_INDEX" >>"$LOG" 2>&1; then
    TORCH_FROM=(--extra-index-url "$TORCH_INDEX")
  else
    TORCH_FROM=()
    echo "setup: $TORCH_INDEX did not answer: pip chooses torch's build (DPC_TORCH_INDEX names a mirror of CPU builds)"
  fi
  if [ ${#TORCH_FROM[@]} -gt 0 ]; then
    echo "setup: no GPU here: installing the CPU build of $TORCH_PIN (from $TORCH_INDEX)"
    if ! "$VENV/bin/python" -m pip install "$TORCH_PIN" "${TORCH_FROM[@]}" >>"$LOG" 2>&1; then
      grep -v "^WARNING: Location" "$LOG" | tail -n 30 >&2
      echo "setup: installing $TORCH_PIN from $TORCH_INDEX failed (see $LOG)" >&2
      exit 1
    fi
  fi
fi
echo "setup: installing the pinned packages (first time: about 3-4 minutes and 4.0 GB with torch's CPU build, 7.8 GB with PyPI's CUDA build; log in $LOG)"
if ! "$VENV/bin/python" -m pip install -r requirements.txt ${EXTRA:+-r "$EXTRA"} >>"$LOG" 2>&1; then
  grep -v "^WARNING: Location" "$LOG" | tail -n 30 >&2
  echo "setup: pip install failed (see $LOG)" >&2
  exit 1
fi
if [ "$GPU" = 1 ]; then
  TF_PIN=$(grep -E '^tensorflow==' requirements.txt)
  echo "setup: GPU found: installing ${TF_PIN/==/[and-cuda]==} (TensorFlow's CUDA libraries)"
  "$VENV/bin/python" -m pip install "${TF_PIN/==/[and-cuda]==}" >>"$LOG" 2>&1 \
    || { tail -n 30 "$LOG" >&2; echo "setup: installing TensorFlow's CUDA libraries failed (see $LOG)" >&2; exit 1; }
fi
# Which torch build pip chose, and what its NVIDIA libraries cost where no GPU uses them.
"$VENV/bin/python" - "$GPU" <<'EOF'
import importlib.metadata as m
import sys

version = m.version("torch")
cuda = [d for d in m.distributions() if (d.metadata["Name"] or "").lower().startswith("nvidia-")]
size = sum(f.locate().stat().st_size for d in cuda for f in d.files or () if f.locate().is_file())
if not cuda:
    print(f"setup: torch {version}, a CPU build")
elif sys.argv[1] == "1":
    print(f"setup: torch {version}, a CUDA build ({size / 1e9:.1f} GB of NVIDIA libraries for the GPU)")
else:
    print(f"setup: torch {version} is a CUDA build: {size / 1e9:.1f} GB of NVIDIA libraries that no GPU "
          f"here uses (everything runs on the CPU all the same; DPC_TORCH_INDEX names a mirror of CPU builds)")
EOF
# The course's packages, editable, in .venv; a class environment takes them from each user's own copy
# of the course instead (its Makefile puts <course>/src on PYTHONPATH).
if [ -z "${DPC_VENV:-}" ]; then
  "$VENV/bin/python" -m pip install --no-deps -e . >>"$LOG" 2>&1
fi

# Kernels of this environment log only errors: ipykernel's start-up warning "Kernel is running over
# TCP without encryption" (about a local kernel's sockets) would otherwise greet every nbconvert,
# papermill and nbgrader run. Kernels read this file from <env>/etc/ipython.
mkdir -p "$VENV/etc/ipython"
echo 'c.IPKernelApp.log_level = "ERROR"  # written by src/dpc_setup/setup.sh' > "$VENV/etc/ipython/ipython_kernel_config.py"
echo "$WANT" > "$STAMP"
fi

if [ "$HVD" = 1 ] && ! hvd_ready; then
  # Progress and a failure's first error reach the terminal (stderr); the wheel's path comes on stdout.
  WHEEL=$(DPC_GPU=$GPU src/dpc_setup/horovod/build.sh "$VENV/bin/python" | tail -n 1)
  [ -f "$WHEEL" ] || exit 1
  "$VENV/bin/python" -m pip install --no-deps --force-reinstall "$WHEEL" >>"$LOG" 2>&1
  # What the wheel was built with, asked in-process: TensorFlow's and PyTorch's extensions and Gloo
  # must be there. (`horovodrun --check-build` says the same, but starts a Python per line it
  # checks, each importing TensorFlow: 18 s on 2 cores, twice per fresh class; chapter 6 explains.)
  "$VENV/bin/python" - <<'EOF' 2>>"$LOG" | tee -a "$LOG" || { echo "setup: the Horovod build lacks a framework or Gloo (see $LOG)" >&2; exit 1; }
import importlib.metadata
import sys

import horovod.torch as hvd  # gloo_built() needs no hvd.init()

frameworks = sorted({f.parts[1] for f in importlib.metadata.files("horovod") if f.name.startswith("mpi_lib")})
print(f"setup: Horovod built for {', '.join(frameworks)}, {'with' if hvd.gloo_built() else 'WITHOUT'} Gloo")
sys.exit(0 if {"tensorflow", "torch"} <= set(frameworks) and hvd.gloo_built() else 1)
EOF
  echo "$HVD_WANT" > "$HVD_STAMP"
fi
hvd_later
echo "setup: done in $(( $(date +%s) - start )) s"
