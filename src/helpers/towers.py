"""Manual towers (chapter 4): a small model and batch, splits by device speed, a one-device reference step."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpc_runtime.quiet import import_tensorflow

N_FEATURES = 20
N_CLASSES = 5


def make_model(n_features: int = N_FEATURES, n_classes: int = N_CLASSES, hidden: int = 32, *,
               batch_norm: bool = False, seed: int = 0) -> Any:
    """A small Keras classifier (Dense, [BatchNorm], ReLU, Dense); the same seed gives the same weights (chapter 4)."""
    import keras

    def init(k: int) -> Any:
        return keras.initializers.GlorotUniform(seed=seed * 10 + k)

    layers: list[Any] = [keras.Input((n_features,)),
                         keras.layers.Dense(hidden, kernel_initializer=init(0), name="hidden")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(name="bn"))
    layers += [keras.layers.ReLU(name="relu"),
               keras.layers.Dense(n_classes, kernel_initializer=init(1), name="logits")]
    return keras.Sequential(layers, name="towers_model")


def make_batch(n: int, n_features: int = N_FEATURES, n_classes: int = N_CLASSES,
               seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A batch of n examples (float32 features, int32 labels that depend on the features) (chapter 4)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, n_features)).astype("float32")
    w = np.random.default_rng(12345).normal(size=(n_features, n_classes))
    y = np.argmax(x @ w + 0.5 * rng.normal(size=(n, n_classes)), axis=1).astype("int32")
    return x, y


def split_sizes(batch: int, speeds: Sequence[float]) -> list[int]:
    """Split batch examples between devices in proportion to their speeds (sizes sum to batch) (chapter 4)."""
    if batch < 0 or int(batch) != batch:
        raise ValueError(f"batch={batch!r}: pass a whole number of examples >= 0")
    speeds = [float(s) for s in speeds]
    if not speeds or any(s <= 0 for s in speeds):
        raise ValueError(f"speeds={speeds!r}: give one positive speed per device")
    exact = [batch * s / sum(speeds) for s in speeds]
    sizes = [int(np.floor(e)) for e in exact]
    # Largest remainders first; ties go to the earlier device, so the result is deterministic.
    order = sorted(range(len(speeds)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: int(batch) - sum(sizes)]:
        sizes[i] += 1
    return sizes


def single_device_step(model: Any, optimizer: Any, loss_fn: Any, x: Any, y: Any) -> Any:
    """One ordinary training step on the whole batch (the reference the towers must match); returns the loss (chapter 2)."""
    tf = import_tensorflow()

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def max_abs_diff(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Largest |a_i - b_i| over two equally long lists of arrays, tensors or variables (chapter 4)."""
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} arrays with {len(b)}")
    return max((float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b)),
               default=0.0)


def n_params(variables: Sequence[Any]) -> int:
    """Number of values held by a list of variables (chapter 1)."""
    return int(sum(np.prod(v.shape) for v in variables))


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a tower step keeps on the variable device and on every other tower device (chapter 4)."""

    params: int        # the variables themselves (one copy, on the variable device)
    gathered: int      # every tower's gradient, copied to the variable device to be averaged
    averaged: int      # the averaged gradient
    slots: int         # the optimizer's slots (momentum, Adam's m and v), beside the variables
    tower_copy: int    # the parameter values a tower reads onto its own device
    tower_grad: int    # the gradient a tower computes on its own device

    def variable_device(self) -> int:
        """Total on the device that holds the variables (device 0, or the CPU)."""
        return self.params + self.gathered + self.averaged + self.slots

    def other_device(self) -> int:
        """Total on a device that only runs a tower."""
        return self.tower_copy + self.tower_grad


def memory_estimate(n_values: int, n_towers: int, slots_per_param: int,
                    bytes_per_value: int = 4) -> MemoryEstimate:
    """Estimate the tower recipe's memory (activations excluded) for a model of n_values parameters (chapter 4)."""
    p = int(n_values) * bytes_per_value
    return MemoryEstimate(params=p, gathered=n_towers * p, averaged=p, slots=slots_per_param * p,
                          tower_copy=p, tower_grad=p)
