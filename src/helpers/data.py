"""Small datasets that need no network, and the real loaders kept for users who have one (chapters 1-2)."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpc_runtime.quiet import import_tensorflow


def synthetic_images(n: int, *, image_size: int = 32, classes: int = 10, channels: int = 3,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n learnable images (NHWC float32 in [0, 1]) whose class sets a stripe pattern, and labels (chapter 2)."""
    if n < 1 or image_size < 4 or classes < 2:
        raise ValueError(f"need n >= 1, image_size >= 4, classes >= 2; got {n}, {image_size}, {classes}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    images = np.stack([_pattern(int(c), image_size, channels, rng) for c in labels])
    return images.astype(np.float32), labels.astype(np.int64)


def _pattern(label: int, size: int, channels: int, rng: np.random.Generator) -> np.ndarray:
    """Stripes whose angle and frequency encode the label, plus noise."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    angle = np.pi * label / 10
    freq = 2 + label % 3
    base = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy))
    img = base[..., None] + 0.25 * rng.standard_normal((size, size, channels))
    return np.clip(img, 0.0, 1.0)


def digits(*, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, ...]:
    """scikit-learn's 8x8 handwritten digits (they ship inside the package): x_train, y_train, x_test, y_test (chapter 6)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_fraction))
    tr, te = order[:cut], order[cut:]
    return x[tr], y[tr].astype(np.int64), x[te], y[te].astype(np.int64)


TFDS_SOURCES = ("tfds", "tfds-mock")


def load_images(name: str = "synthetic", *, source: str = "offline", n: int = 2048,
                image_size: int = 32, seed: int = 0, data_dir: str | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """An image dataset as arrays: offline (generated), the real one via tfds, or tfds's mock of it (chapter 2).

    source="tfds" loads `name` (cats_vs_dogs, tf_flowers, ...) with tensorflow-datasets, downloading
    it once into `data_dir` (tfds's default: ~/tensorflow_datasets) when it is not there yet; images
    are resized to image_size x image_size and scaled to [0, 1], as *单机多卡训练: MirroredStrategy*
    does. source="tfds-mock" runs exactly that code inside `tfds.testing.mock_data`: random images
    of the dataset's real shape and classes, no network (for tests and CI).
    """
    if source == "offline":
        return synthetic_images(n, image_size=image_size, seed=seed)
    if source not in TFDS_SOURCES:
        raise ValueError(f"source={source!r}: use 'offline' (no network), 'tfds' (downloads) "
                         "or 'tfds-mock' (tfds's code path on fake images)")
    tfds = _import_tfds()
    if source == "tfds":
        return _tfds_arrays(tfds, name, n, image_size, data_dir)
    with _quiet_mock(), tfds.testing.mock_data(num_examples=n):
        return _tfds_arrays(tfds, name, n, image_size, data_dir)


def _import_tfds() -> Any:
    """tensorflow_datasets, or one ImportError that says what to install."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("source='tfds' needs tensorflow-datasets (pinned in requirements.txt): "
                          "pip install -r requirements.txt") from None
    return tfds


def _tfds_arrays(tfds: Any, name: str, n: int, image_size: int,
                 data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The first n (image, label) pairs of tfds dataset `name`'s train split, resized and scaled."""
    tf = import_tensorflow()

    ds = _tfds_train(tfds, name, data_dir)
    ds = ds.take(n).map(lambda img, label: (tf.image.resize(img, [image_size, image_size]) / 255.0,
                                            label))
    xs, ys = [], []
    for img, label in ds.batch(256):
        xs.append(img.numpy())
        ys.append(label.numpy())
    if not xs:
        raise ValueError(f"tfds dataset {name!r} gave no images")
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


def _tfds_train(tfds: Any, name: str, data_dir: str | None) -> Any:
    """tfds.load(name, split="train", as_supervised=True), downloading only when the data is missing."""
    try:  # already downloaded and prepared (or mocked): no network needed
        return tfds.load(name, split="train", as_supervised=True, data_dir=data_dir, download=False)
    except AssertionError:  # tfds's way of saying "not in data_dir yet"
        pass
    hosts = _download_hosts(tfds, name, data_dir)
    unreachable = [h for h in hosts if not _reachable(*h)]
    if unreachable:
        raise ConnectionError(
            f"source='tfds': the {name!r} dataset is not downloaded yet and "
            f"{', '.join(h for h, _ in unreachable)} cannot be reached (no network?). Use "
            "source='offline' (generated images) or 'tfds-mock', or download it once on a "
            "machine with a network (python -c \"import tensorflow_datasets as tfds; "
            f"tfds.load('{name}')\") and copy ~/tensorflow_datasets here.") from None
    return tfds.load(name, split="train", as_supervised=True, data_dir=data_dir, download=True)


def _download_hosts(tfds: Any, name: str, data_dir: str | None) -> list[tuple[str, int]]:
    """(host, port) of every file tfds would download for `name` (from its registered checksums)."""
    from urllib.parse import urlsplit

    try:
        urls = list(tfds.builder(name, data_dir=data_dir).url_infos or ())
    except Exception:  # a dataset without registered URLs: check tfds's own storage
        urls = []
    parts = [urlsplit(u) for u in urls] or [urlsplit("https://storage.googleapis.com")]
    return sorted({(p.hostname or "", p.port or (80 if p.scheme == "http" else 443)) for p in parts})


def _reachable(host: str, port: int, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to host:port opens within `timeout` seconds."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _quiet_mock() -> Iterator[None]:
    """Silence the warnings tfds's mock gives about its own code (metadata, deprecated dtypes)."""
    loggers = [logging.getLogger(name) for name in ("absl", "tensorflow")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class SlowSource:
    """A dataset whose every sample costs `latency_ms` to load, like images on slow storage (chapter 1).

    load(i) / source[i] sleeps (waiting on storage releases the CPU, as real reads do), then
    decodes a deterministic image for index i, so any correct pipeline yields the same batches.
    It also counts loads and the most loads in flight at once, to show parallelism.
    """

    def __init__(self, n: int = 512, *, image_size: int = 32, classes: int = 10,
                 latency_ms: float = 4.0, seed: int = 0) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms}")
        self.n, self.image_size, self.classes = n, image_size, classes
        self.latency_ms, self.seed = latency_ms, seed
        self._lock = threading.Lock()
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.load(i)

    def label(self, i: int) -> int:
        """The label of sample i, without loading it."""
        return int(np.random.default_rng((self.seed, int(i))).integers(self.classes))

    def load(self, i: Any) -> tuple[np.ndarray, int]:
        """Wait for 'storage', then decode sample i: (image HxWx3 float32, label)."""
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"sample {i} out of range 0..{self.n - 1}")
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.latency_ms / 1000.0)
            rng = np.random.default_rng((self.seed, i))
            label = int(rng.integers(self.classes))
            image = _pattern(label, self.image_size, 3, rng).astype(np.float32)
            return image, label
        finally:
            with self._lock:
                self.in_flight -= 1

    def reset_counters(self) -> None:
        """Zero calls / in_flight / max_in_flight."""
        with self._lock:
            self.calls = self.in_flight = self.max_in_flight = 0

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers may pickle the dataset
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class WhoLoads:
    """A dataset whose sample i is (i, id of the process that loaded it): shows DataLoader workers (chapter 1)."""

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return int(i), os.getpid()


def tf_pipeline_ops(dataset: Any) -> list[str]:
    """The dataset ops of a tf.data pipeline, source first, e.g. ['RangeDataset', ..., 'PrefetchDataset'] (chapter 1)."""
    tf = import_tensorflow()

    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Dataset" in node.op]
