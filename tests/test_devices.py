"""helpers.devices: counting checks, the torch plan on a GPU-less machine, TensorFlow logical devices.

TensorFlow's device layout is per process and fixed once the runtime starts, so tf_devices is
exercised in fresh Python subprocesses that print their findings as JSON.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import helpers
from helpers import DeviceError, TorchPlan

pytestmark = pytest.mark.gate  # tests/tiers.py

BAD_COUNTS = [
    (0, r"ask for at least 1"),
    (-1, r"ask for at least 1"),
    (2.5, r"pass a whole number"),
    (True, r"pass a whole number"),
]


@pytest.mark.parametrize(("n", "message"), BAD_COUNTS)
def test_torch_plan_rejects_bad_counts(n, message):
    with pytest.raises(DeviceError, match=message):
        helpers.torch_plan(n)


@pytest.mark.parametrize(("n", "message"), BAD_COUNTS)
def test_tf_devices_rejects_bad_counts(n, message):
    # The count is checked before TensorFlow is imported, so this is safe in the test process.
    with pytest.raises(DeviceError, match=message):
        helpers.tf_devices(n)


def test_device_error_is_a_runtime_error():
    assert issubclass(DeviceError, RuntimeError)


def test_torch_plan_uses_gloo_on_cpu_without_gpu(capsys):
    assert helpers.inventory(("torch",)).torch_gpus == []  # the premise of this test
    plan = helpers.torch_plan(2)
    assert plan == TorchPlan(nprocs=2, backend="gloo", device_type="cpu")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1
    assert "gloo" in lines[0]
    assert "2 rank(s)" in lines[0]


def test_torch_plan_quiet(capsys):
    assert helpers.torch_plan(3, verbose=False) == TorchPlan(3, "gloo", "cpu")
    assert capsys.readouterr().out == ""


def test_torch_plan_explicit_gloo():
    assert helpers.torch_plan(16, backend="gloo", verbose=False) == TorchPlan(16, "gloo", "cpu")


def test_torch_plan_caps_simulated_ranks():
    with pytest.raises(DeviceError, match=r"at most 16"):
        helpers.torch_plan(17)


def test_torch_plan_nccl_without_gpu_suggests_gloo():
    with pytest.raises(DeviceError, match=r"backend='gloo'") as info:
        helpers.torch_plan(2, backend="nccl")
    assert "0 GPU(s)" in str(info.value)


def test_torch_plan_unknown_backend():
    with pytest.raises(DeviceError, match=r"backend='mpi'"):
        helpers.torch_plan(2, backend="mpi")


def test_tf_devices_unknown_kind():
    with pytest.raises(DeviceError, match=r"kind='tpu'"):
        helpers.tf_devices(2, kind="tpu")


def test_inventory_line_and_cores():
    assert helpers.cpu_cores() >= 1
    inv = helpers.inventory(("torch",))
    assert inv.cpu_cores == helpers.cpu_cores()
    line = inv.line()
    assert "CPU cores" in line
    assert line.startswith(f"{helpers.cpu_cores()} CPU cores")


# --- TensorFlow, one fresh process per scenario ------------------------------------------------

_PRELUDE = """
import json
import helpers
from helpers import DeviceError
out = {}
def attempt(key, fn):
    try:
        out[key] = {"ok": fn()}
    except DeviceError as err:
        out[key] = {"error": str(err)}
"""

# Configure 3 logical CPUs first, then probe what can and cannot change afterwards.
_SPLIT_FIRST = _PRELUDE + """
attempt("n17_before", lambda: helpers.tf_devices(17))
import tensorflow as tf
names = helpers.tf_devices(3)
out["n3"] = names
out["logical"] = len(tf.config.list_logical_devices("CPU"))
out["replicas"] = tf.distribute.MirroredStrategy(names).num_replicas_in_sync
attempt("n2_after", lambda: helpers.tf_devices(2))
attempt("n3_after", lambda: helpers.tf_devices(3, verbose=False))
attempt("n4_after", lambda: helpers.tf_devices(4))
attempt("n17_after", lambda: helpers.tf_devices(17))
attempt("gpu", lambda: helpers.tf_devices(1, kind="gpu"))
print("RESULT " + json.dumps(out))
"""

# TensorFlow already running (some op ran) before anyone asked for devices: one CPU device.
_TF_FIRST = _PRELUDE + """
import tensorflow as tf
tf.constant(1.0) + 1.0
attempt("n1", lambda: helpers.tf_devices(1, verbose=False))
attempt("n2", lambda: helpers.tf_devices(2))
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def tf_runs():
    """Run both TensorFlow scripts concurrently (each import costs seconds) and parse their JSON."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    procs = {
        name: subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, code in (("split_first", _SPLIT_FIRST), ("tf_first", _TF_FIRST))
    }
    results = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{name} failed:\n{stdout}\n{stderr}"
            found = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
            assert len(found) == 1, stdout
            results[name] = {"data": json.loads(found[0][len("RESULT "):]), "stdout": stdout}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_tf_devices_three_logical_cpus(tf_runs):
    data = tf_runs["split_first"]["data"]
    assert data["n3"] == ["/cpu:0", "/cpu:1", "/cpu:2"]
    assert data["logical"] == 3
    assert data["replicas"] == 3
    assert "3 replica(s) on 3 logical CPU devices" in tf_runs["split_first"]["stdout"]


def test_tf_devices_subset_after_initialisation(tf_runs):
    data = tf_runs["split_first"]["data"]
    assert data["n2_after"] == {"ok": ["/cpu:0", "/cpu:1"]}
    assert data["n3_after"] == {"ok": ["/cpu:0", "/cpu:1", "/cpu:2"]}


def test_tf_devices_more_after_initialisation_says_restart(tf_runs):
    err = tf_runs["split_first"]["data"]["n4_after"]["error"]
    assert "Restart the kernel" in err
    assert "already initialised with 3 logical CPU device(s)" in err
    assert "tf_devices(4)" in err


def test_tf_devices_caps_at_sixteen_before_and_after_initialisation(tf_runs):
    data = tf_runs["split_first"]["data"]
    for key in ("n17_before", "n17_after"):
        assert "at most 16" in data[key]["error"], key


def test_tf_devices_gpu_without_gpu(tf_runs):
    err = tf_runs["split_first"]["data"]["gpu"]["error"]
    assert "sees no GPU" in err


def test_tf_devices_after_tf_already_running(tf_runs):
    data = tf_runs["tf_first"]["data"]
    assert data["n1"] == {"ok": ["/cpu:0"]}
    err = data["n2"]["error"]
    assert "already initialised with 1 logical CPU device(s)" in err
    assert "Restart the kernel" in err


def test_numpy_integers_are_whole_numbers(capsys):
    """Students loop over np.arange: a NumPy integer is a valid count."""
    import numpy as np

    plan = helpers.torch_plan(np.int64(2))
    assert (plan.nprocs, type(plan.nprocs)) == (2, int)


# The tiers of chapter 0 on a machine with GPUs, seen from this CPU machine: torch_gpus is the one
# place torch_plan counts GPUs, so a machine that reports GPUs is a patched torch_gpus.
@pytest.mark.parametrize("gpus, n, devices, want", [
    (1, 1, "auto", TorchPlan(1, "nccl", "cuda")),
    (1, 2, "auto", TorchPlan(2, "gloo", "cpu")),  # fewer GPUs than ranks: the CPU, GPU hidden
    (1, 2, "gpu", TorchPlan(2, "gloo", "cuda")),  # or the ranks share the GPU over gloo
    (2, 2, "auto", TorchPlan(2, "nccl", "cuda")),
    (2, 2, "cpu", TorchPlan(2, "gloo", "cpu")),
    (0, 2, "auto", TorchPlan(2, "gloo", "cpu")),
])
def test_torch_plan_tiers(monkeypatch, gpus, n, devices, want):
    monkeypatch.setattr(helpers.devices, "torch_gpus", lambda: ["NVIDIA H100"] * gpus)
    assert helpers.torch_plan(n, devices=devices, verbose=False) == want


def test_torch_plan_for_gloo_by_name_on_a_gpu_per_rank_is_the_cpu(monkeypatch):
    # What the launch then does: one GPU per rank leaves the GPUs visible, and start("gloo") hides them.
    monkeypatch.setattr(helpers.devices, "torch_gpus", lambda: ["NVIDIA H100"] * 2)
    for devices in ("auto", "gpu"):
        assert helpers.torch_plan(2, backend="gloo", devices=devices, verbose=False) == TorchPlan(2, "gloo", "cpu")


def test_torch_plan_says_why_one_gpu_is_not_used(monkeypatch, capsys):
    monkeypatch.setattr(helpers.devices, "torch_gpus", lambda: ["NVIDIA H100"])
    helpers.torch_plan(2)
    line = capsys.readouterr().out.strip()
    assert "no GPU used: 1 GPU(s) for 2 ranks: NCCL needs one GPU per rank" in line
    assert "devices='gpu' shares it over gloo" in line
    helpers.torch_plan(2, devices="gpu")
    assert "2 rank(s) on the GPU with backend gloo (2 ranks share 1 GPU(s) over gloo: NCCL refuses " \
        "two ranks on one GPU" in capsys.readouterr().out


def test_torch_plan_gpu_without_gpu_says_so():
    with pytest.raises(DeviceError, match="devices='gpu' but this machine has no GPU"):
        helpers.torch_plan(2, devices="gpu")
    with pytest.raises(DeviceError, match="devices='tpu': use one of 'auto', 'cpu', 'gpu'"):
        helpers.torch_plan(2, devices="tpu")


# TensorFlow's wheel loads its C++ libraries with RTLD_GLOBAL: their LLVM then takes the place of triton's
# (PyTorch's CUDA build) and the process dies when triton loads (issue 59). Symbols seen from the process's
# global scope: TensorFlow's C API, and a function of the LLVM it carries.
GLOBAL_SYMBOLS = ("import ctypes, json; scope = ctypes.CDLL(None); "
                  "print(json.dumps([hasattr(scope, 'TF_NewStatus'), hasattr(scope, '_ZN4llvm14buffer_ostream6anchorEv')]))")


@pytest.mark.parametrize("first, private", [
    ("import tensorflow", False),  # the wheel's own way: what the course must not leave
    ("import helpers; import tensorflow", True),  # a kernel that imported helpers first
    ("import torch, helpers; tf = helpers.import_tensorflow()", True),  # lab 1's order
    ("from dpc_runtime.quiet import import_tensorflow; import_tensorflow()", True),  # a worker's
])
def test_tensorflow_keeps_its_libraries_to_itself(first: str, private: bool) -> None:
    """After `import helpers` (or helpers.import_tensorflow) TensorFlow's libraries are loaded privately:
    neither its C API nor its LLVM is in the process's global symbol scope; a plain import puts both there,
    and then keep_tensorflow_private says it is too late."""
    code = (f"{first}\nfrom dpc_runtime.quiet import keep_tensorflow_private\n"
            f"assert keep_tensorflow_private() is {private}\n{GLOBAL_SYMBOLS}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [not private, not private], done.stdout


def test_tensorflow_kept_private_still_runs_its_pipelines_and_keras() -> None:
    """What the course runs of TensorFlow works with its libraries private: a parallel tf.data pipeline,
    a Keras 2 fit, and then a torch optimizer (which imports torch._dynamo, and triton where installed)."""
    code = textwrap.dedent("""
        import helpers, torch
        tf = helpers.import_tensorflow()
        ds = tf.data.Dataset.range(8).map(lambda i: i * 2, num_parallel_calls=tf.data.AUTOTUNE).batch(4).prefetch(1)
        assert [b.numpy().tolist() for b in ds] == [[0, 2, 4, 6], [8, 10, 12, 14]]
        import tf_keras
        model = tf_keras.Sequential([tf_keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        model.fit(tf.zeros((4, 3)), tf.zeros((4, 2)), verbose=0)
        torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1).step()
        print("ran")""")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0 and done.stdout.split()[-1:] == ["ran"], done.stdout + done.stderr[-3000:]
