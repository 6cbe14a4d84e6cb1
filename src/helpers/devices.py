"""Find the devices this machine has, and make N of them anyway (logical devices, gloo ranks; chapter 0)."""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from typing import Any

from dpc_runtime.quiet import import_tensorflow
from dpc_runtime.worker import DEVICES, placement

# Simulated devices are for learning, not speed: past this many, a 2-core laptop spends its time
# switching between them and the lesson drowns in overhead.
MAX_SIMULATED = 16
# Logical GPUs carved from one physical GPU each get this much memory unless told otherwise.
DEFAULT_LOGICAL_GPU_MB = 2048


class DeviceError(RuntimeError):
    """A device request that cannot be met; the message says what to do instead (chapter 0)."""


def cpu_cores() -> int:
    """Number of CPU cores this process may run on (respects affinity and container limits) (chapter 5)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def torch_gpus() -> list[str]:
    """Names of the CUDA GPUs PyTorch sees (empty without torch or without a GPU) (chapter 0)."""
    try:
        import torch
    except ImportError:
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def tf_gpus() -> list[str]:
    """Names of the physical GPUs TensorFlow sees (empty without TensorFlow or a GPU) (chapter 0)."""
    try:
        tf = import_tensorflow()
    except ImportError:
        return []
    return [d.name for d in tf.config.list_physical_devices("GPU")]


@dataclass(frozen=True)
class Inventory:
    """What this machine has: CPU cores and the GPUs each framework can see (chapter 0)."""

    cpu_cores: int
    torch_gpus: list[str] = field(default_factory=list)
    tf_gpus: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One readable line, e.g. '2 CPU cores; torch sees 0 GPUs; TensorFlow sees 0 GPUs'."""
        return (
            f"{self.cpu_cores} CPU cores; torch sees {len(self.torch_gpus)} GPU(s)"
            f"{' ' + str(self.torch_gpus) if self.torch_gpus else ''}; "
            f"TensorFlow sees {len(self.tf_gpus)} GPU(s)"
        )


def inventory(frameworks: tuple[str, ...] = ("torch", "tensorflow")) -> Inventory:
    """Look at the machine (importing only the frameworks named) and return an Inventory (chapter 0)."""
    return Inventory(
        cpu_cores=cpu_cores(),
        torch_gpus=torch_gpus() if "torch" in frameworks else [],
        tf_gpus=tf_gpus() if "tensorflow" in frameworks else [],
    )


def _check_count(n: Any, what: str) -> int:
    try:
        if isinstance(n, bool):
            raise TypeError
        n = operator.index(n)  # int, or a NumPy integer from np.arange
    except TypeError:
        raise DeviceError(f"asked for {n!r} {what}: pass a whole number such as 2") from None
    if n < 1:
        raise DeviceError(f"asked for {n} {what}: ask for at least 1 (for example 2)")
    return n


def tf_devices(n: int, *, kind: str = "auto", memory_mb: int = DEFAULT_LOGICAL_GPU_MB,
               verbose: bool = True) -> list[str]:
    """Give TensorFlow n devices (physical GPUs, logical GPUs or logical CPUs); call before any TF op (chapter 0)."""
    n = _check_count(n, "TensorFlow devices")
    if kind not in ("auto", "gpu", "cpu"):
        raise DeviceError(f"kind={kind!r}: use 'auto', 'gpu' or 'cpu'")
    tf = import_tensorflow()

    gpus = tf.config.list_physical_devices("GPU")
    if kind == "gpu" and not gpus:
        raise DeviceError("kind='gpu' but TensorFlow sees no GPU: use kind='auto' to simulate on CPU")
    if gpus and kind != "cpu":
        if len(gpus) >= n:
            names = [f"/gpu:{i}" for i in range(n)]
            _say(verbose, f"TensorFlow: {n} replica(s) on {n} physical GPU(s) {names}")
            return names
        if n > MAX_SIMULATED:
            raise DeviceError(f"asked for {n} TensorFlow devices; at most {MAX_SIMULATED} logical "
                              f"GPUs can be carved from one GPU here: ask for fewer")
        config = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * n
        names = configure_logical(tf, gpus[0], config, "GPU", n)
        _say(verbose, f"TensorFlow: {n} replica(s) on {n} logical GPUs of {memory_mb} MB carved "
                      f"from {gpus[0].name} (only {len(gpus)} physical GPU(s))")
        return names
    if n > MAX_SIMULATED:
        raise DeviceError(f"asked for {n} TensorFlow devices; the course simulates at most "
                          f"{MAX_SIMULATED} logical CPU devices ({cpu_cores()} cores here): ask for fewer")
    cpu = tf.config.list_physical_devices("CPU")[0]
    names = configure_logical(tf, cpu, [tf.config.LogicalDeviceConfiguration()] * n, "CPU", n)
    why = "no GPU found" if not gpus else "kind='cpu'"
    _say(verbose, f"TensorFlow: {n} replica(s) on {n} logical CPU devices sharing "
                  f"{cpu_cores()} core(s) ({why}; simulated: right numbers, no speed-up)")
    return names


def configure_logical(tf, device, config, kind: str, n: int) -> list[str]:
    """Split a physical device into logical ones, or reuse an existing split that is big enough (chapter 0)."""
    prefix = "/gpu" if kind == "GPU" else "/cpu"
    try:
        tf.config.set_logical_device_configuration(device, config)
    except RuntimeError as err:  # the runtime is up: the device layout is fixed for this process
        have = len(tf.config.list_logical_devices(kind))
        if have >= n:
            return [f"{prefix}:{i}" for i in range(n)]
        raise DeviceError(
            f"TensorFlow is already initialised with {have} logical {kind} device(s), and the "
            f"layout cannot change inside a running process. Restart the kernel "
            f"(Kernel > Restart Kernel) and call tf_devices({n}) before any other TensorFlow code."
        ) from err
    return [f"{prefix}:{i}" for i in range(n)]


@dataclass(frozen=True)
class TorchPlan:
    """How torch gets n devices: nprocs ranks on backend ('gloo' or 'nccl') and device type (chapter 0)."""

    nprocs: int
    backend: str
    device_type: str
    why: str = field(default="", compare=False)  # in words, e.g. '1 GPU(s) for 2 ranks: ...'

    def line(self) -> str:
        """One readable line describing the plan: what runs where, and why."""
        if self.backend == "nccl":
            return f"torch: {self.nprocs} rank(s), one per GPU, backend nccl"
        if self.device_type == "cuda":
            return f"torch: {self.nprocs} rank(s) on the GPU with backend gloo ({self.why})"
        why = "no GPU used" + (f": {self.why}" if self.why and self.why != "no GPU" else "")
        return f"torch: {self.nprocs} rank(s) on CPU with backend gloo sharing {cpu_cores()} core(s) ({why})"


def torch_plan(n: int, *, backend: str = "auto", devices: str = "auto", verbose: bool = True) -> TorchPlan:
    """Plan n torch ranks here: one NCCL rank per GPU, else gloo on the CPU, or on shared GPUs with devices='gpu' (chapter 0).

    The rule is helpers.launch's (dpc_runtime.worker.placement): a launch with the same n and
    devices puts its ranks where this plan says.
    """
    n = _check_count(n, "torch ranks")
    if backend not in ("auto", "gloo", "nccl"):
        raise DeviceError(f"backend={backend!r}: use 'auto', 'gloo' or 'nccl'")
    if devices not in DEVICES:
        raise DeviceError(f"devices={devices!r}: use one of {', '.join(map(repr, DEVICES))}")
    gpus = len(torch_gpus())
    if backend == "nccl" and gpus < n:
        raise DeviceError(
            f"asked for {n} torch ranks but this machine has {gpus} GPU(s), and NCCL needs one "
            f"GPU per rank: ask for at most {gpus} rank(s), or pass backend='gloo' to run "
            f"{n} ranks on the CPU")
    try:
        where = placement(n, gpus, devices)
    except ValueError as err:
        raise DeviceError(str(err)) from None
    if backend == "nccl" and where.backend != "nccl":
        raise DeviceError(f"backend='nccl' with devices={devices!r}: NCCL needs one GPU per rank; "
                          "use devices='auto'")
    if backend == "gloo" and where.backend == "nccl":  # gloo asked for on one GPU per rank: a CPU rank
        where = placement(n, gpus, "cpu")  # (start('gloo') hides the GPUs unless the launch shares them)
    if where.device_type == "cpu" and n > MAX_SIMULATED:
        raise DeviceError(f"asked for {n} gloo ranks; the course runs at most {MAX_SIMULATED} "
                          f"CPU ranks ({cpu_cores()} cores here): ask for fewer")
    plan = TorchPlan(n, where.backend, where.device_type, where.why)
    _say(verbose, plan.line())
    return plan


def _say(verbose: bool, line: str) -> None:
    if verbose:
        print(line)
