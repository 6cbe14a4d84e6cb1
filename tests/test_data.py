"""helpers.data and helpers.sh: offline datasets, the slow source, DataLoader workers, tf.data ops."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import helpers
from helpers import SlowSource, WhoLoads

pytestmark = pytest.mark.gate  # tests/tiers.py

# --- SlowSource --------------------------------------------------------------------------------

def test_slow_source_is_deterministic_across_instances():
    a, b = SlowSource(32, latency_ms=0), SlowSource(32, latency_ms=0)
    for i in (0, 5, 31):
        img_a, lab_a = a.load(i)
        img_a2, lab_a2 = a[i]
        img_b, lab_b = b.load(i)
        assert lab_a == lab_a2 == lab_b
        np.testing.assert_array_equal(img_a, img_a2)
        np.testing.assert_array_equal(img_a, img_b)
    # different indices and different seeds give different images
    assert not np.array_equal(a.load(0)[0], a.load(1)[0])
    assert not np.array_equal(a.load(0)[0], SlowSource(32, latency_ms=0, seed=1).load(0)[0])


def test_slow_source_sample_format():
    src = SlowSource(8, image_size=16, classes=4, latency_ms=0)
    assert len(src) == 8
    image, label = src.load(3)
    assert image.shape == (16, 16, 3)
    assert image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0
    assert isinstance(label, int) and 0 <= label < 4
    assert src.load(np.int64(3))[1] == label  # numpy indices (from samplers) work too


def test_slow_source_label_matches_load():
    src = SlowSource(64, latency_ms=0, seed=7)
    labels = [src.label(i) for i in range(64)]
    assert labels == [src.load(i)[1] for i in range(64)]
    assert len(set(labels)) > 1
    assert src.calls == 64  # label() does not load


@pytest.mark.parametrize("i", [-1, 10, 100])
def test_slow_source_index_out_of_range(i):
    src = SlowSource(10, latency_ms=0)
    with pytest.raises(IndexError, match=rf"sample {i} out of range 0\.\.9"):
        src.load(i)
    assert src.calls == 0


def test_slow_source_iteration_stops_at_the_end():
    # the old sequence protocol relies on IndexError at len()
    assert len(list(SlowSource(3, latency_ms=0))) == 3


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"n": -5}, {"n": 4, "latency_ms": -1}])
def test_slow_source_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="must be"):
        SlowSource(**kwargs)


def test_slow_source_counts_parallel_loads():
    src = SlowSource(16, latency_ms=30)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(src.load, range(16)))
    assert src.calls == 16
    assert src.max_in_flight >= 2
    assert src.max_in_flight <= 4
    assert src.in_flight == 0
    assert [lab for _, lab in results] == [src.label(i) for i in range(16)]


def test_slow_source_serial_loads_one_at_a_time():
    src = SlowSource(4, latency_ms=1)
    for i in range(4):
        src.load(i)
    assert (src.calls, src.max_in_flight, src.in_flight) == (4, 1, 0)


def test_slow_source_reset_counters():
    src = SlowSource(8, latency_ms=0)
    for i in range(5):
        src.load(i)
    assert src.calls == 5 and src.max_in_flight == 1
    src.reset_counters()
    assert (src.calls, src.in_flight, src.max_in_flight) == (0, 0, 0)


def test_slow_source_in_flight_released_on_error(monkeypatch):
    src = SlowSource(4, latency_ms=0)

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr("helpers.data._pattern", broken)
    with pytest.raises(OSError):
        src.load(0)
    assert src.in_flight == 0


def test_slow_source_pickle_round_trip():
    src = SlowSource(20, image_size=8, latency_ms=2, seed=3)
    src.load(1)
    copy = pickle.loads(pickle.dumps(src))
    assert (copy.n, copy.image_size, copy.latency_ms, copy.seed, copy.calls) == (20, 8, 2, 3, 1)
    assert copy._lock is not src._lock
    assert isinstance(copy._lock, type(threading.Lock()))
    assert not copy._lock.locked()
    np.testing.assert_array_equal(copy.load(4)[0], src.load(4)[0])
    assert copy.calls == 2 and src.calls == 2  # counters are separate afterwards
    # the pickled original still works (its lock was not taken away)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(copy.load, range(4)))
    assert copy.calls == 6


def _batches(loader):
    return [(x.numpy(), y.numpy()) for x, y in loader]


def test_dataloader_workers_give_same_batches():
    from torch.utils.data import DataLoader

    src = SlowSource(24, image_size=8, latency_ms=2)
    serial = _batches(DataLoader(src, batch_size=5, num_workers=0))
    parallel = _batches(DataLoader(src, batch_size=5, num_workers=2))
    assert len(serial) == len(parallel) == 5
    for (xs, ys), (xp, yp) in zip(serial, parallel):
        np.testing.assert_array_equal(xs, xp)
        np.testing.assert_array_equal(ys, yp)
    assert serial[0][0].shape == (5, 8, 8, 3)
    assert list(np.concatenate([y for _, y in serial])) == [src.label(i) for i in range(24)]


def test_dataloader_spawned_workers_unpickle_the_source():
    # 'spawn' pickles the dataset into each worker, exercising __getstate__/__setstate__.
    from torch.utils.data import DataLoader

    src = SlowSource(8, image_size=8, latency_ms=0)
    serial = _batches(DataLoader(src, batch_size=4, num_workers=0))
    spawned = _batches(DataLoader(src, batch_size=4, num_workers=1, multiprocessing_context="spawn"))
    for (xs, ys), (xp, yp) in zip(serial, spawned, strict=True):
        np.testing.assert_array_equal(xs, xp)
        np.testing.assert_array_equal(ys, yp)


def test_who_loads_in_main_process():
    ds = WhoLoads(5)
    assert len(ds) == 5
    assert [ds[i] for i in range(5)] == [(i, os.getpid()) for i in range(5)]


def test_who_loads_shows_dataloader_workers():
    from torch.utils.data import DataLoader

    loader = DataLoader(WhoLoads(32), batch_size=4, num_workers=2)
    indices, pids = [], set()
    for idx, pid in loader:
        indices += idx.tolist()
        pids |= set(pid.tolist())
    assert indices == list(range(32))
    pids.discard(os.getpid())
    assert len(pids) >= 2


# --- generated and bundled datasets ------------------------------------------------------------

def test_synthetic_images_shapes_dtypes_range():
    x, y = helpers.synthetic_images(12, image_size=8, classes=3, channels=1, seed=5)
    assert x.shape == (12, 8, 8, 1) and x.dtype == np.float32
    assert y.shape == (12,) and y.dtype == np.int64
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert set(y.tolist()) <= {0, 1, 2}
    x3, _ = helpers.synthetic_images(2)
    assert x3.shape == (2, 32, 32, 3)


def test_synthetic_images_deterministic_by_seed():
    x1, y1 = helpers.synthetic_images(16, image_size=8, seed=1)
    x2, y2 = helpers.synthetic_images(16, image_size=8, seed=1)
    x3, y3 = helpers.synthetic_images(16, image_size=8, seed=2)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x3)


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"n": 4, "image_size": 3}, {"n": 4, "classes": 1}])
def test_synthetic_images_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="need n >= 1, image_size >= 4, classes >= 2"):
        helpers.synthetic_images(**kwargs)


def test_digits_shapes_and_split():
    x_train, y_train, x_test, y_test = helpers.digits()
    assert len(x_train) + len(x_test) == 1797
    assert len(x_train) == len(y_train) == 1437 and len(x_test) == len(y_test) == 360
    assert x_train.shape[1:] == x_test.shape[1:] == (8, 8, 1)
    assert x_train.dtype == np.float32
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    for y in (y_train, y_test):
        assert y.dtype == np.int64
        assert y.min() >= 0 and y.max() <= 9
    assert set(y_train.tolist()) == set(range(10))


def test_digits_split_is_seeded_and_disjoint():
    a = helpers.digits(test_fraction=0.5, seed=1)
    b = helpers.digits(test_fraction=0.5, seed=1)
    c = helpers.digits(test_fraction=0.5, seed=2)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    assert len(a[0]) == 898 and len(a[2]) == 899
    # train + test is a permutation of the whole dataset, each image with its own label
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    expected = np.column_stack([(x / 16.0).astype(np.float32), y])
    got = np.column_stack([np.concatenate([a[0], a[2]]).reshape(-1, 64), np.concatenate([a[1], a[3]])])
    np.testing.assert_array_equal(_sorted_rows(got), _sorted_rows(expected))


def _sorted_rows(m):
    return m[np.lexsort(m.T[::-1])]


def test_load_images_offline():
    x, y = helpers.load_images(source="offline", n=10, image_size=8, seed=4)
    assert x.shape == (10, 8, 8, 3) and y.shape == (10,)
    ex, ey = helpers.synthetic_images(10, image_size=8, seed=4)
    np.testing.assert_array_equal(x, ex)
    np.testing.assert_array_equal(y, ey)


def test_load_images_default_is_offline():
    x, _ = helpers.load_images(n=3)
    assert x.shape == (3, 32, 32, 3)


def test_load_images_unknown_source():
    with pytest.raises(ValueError, match=r"source='bogus': use 'offline' .*'tfds-mock'"):
        helpers.load_images(source="bogus")


def test_load_images_tfds_without_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="needs tensorflow-datasets") as info:
        helpers.load_images("cats_vs_dogs", source="tfds")
    assert info.value.__cause__ is None and info.value.__suppress_context__  # one clear error


# --- helpers.sh --------------------------------------------------------------------------------

def test_sh_returns_and_prints_output(capsys):
    assert helpers.sh("echo hi") == "hi\n"
    assert capsys.readouterr().out == "hi\n"


def test_sh_hides_harmless_start_up_lines_but_returns_them(capsys):
    cuinit = "E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)"
    out = helpers.sh(f"echo '{cuinit}' >&2; echo real warning >&2; echo done")
    assert cuinit in out and "real warning" in out
    shown = capsys.readouterr().out
    assert "cuInit" not in shown and "real warning" in shown and "done" in shown


def test_sh_argv_list():
    assert helpers.sh(["printf", "%s", "no newline"]) == "no newline"


def test_sh_failure_raises(capsys):
    with pytest.raises(subprocess.CalledProcessError) as info:
        helpers.sh("echo out; echo err >&2; exit 3")
    assert info.value.returncode == 3
    assert info.value.stdout == "out\n"
    assert info.value.stderr == "err\n"
    assert "out" in capsys.readouterr().out


def test_sh_exit_code():
    with pytest.raises(subprocess.CalledProcessError):
        helpers.sh("exit 3")


# --- tf.data (last: imports TensorFlow into this process, after the forking tests) --------------

def test_tf_pipeline_ops(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    ds = (tf.data.Dataset.range(8).map(lambda v: v * 2, num_parallel_calls=2)
          .batch(2).prefetch(1))
    assert helpers.tf_pipeline_ops(ds) == ["RangeDataset", "ParallelMapDatasetV2",
                                           "BatchDatasetV2", "PrefetchDataset"]
    assert helpers.tf_pipeline_ops(tf.data.Dataset.range(3)) == ["RangeDataset"]


# --- the real datasets through tensorflow-datasets, on tfds's own mock data (no network) --------

def test_load_images_tfds_on_tfds_mock_data():
    # The code path of source="tfds", with tfds.load answered by tfds's mock: images of the real
    # dataset's shape (any size, uint8) and its real classes (cats_vs_dogs: 2).
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=7):
        x, y = helpers.load_images("cats_vs_dogs", source="tfds", n=5, image_size=12)
    assert x.shape == (5, 12, 12, 3) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.std() > 0  # resized, scaled like R1: / 255
    assert y.shape == (5,) and y.dtype == np.int64 and set(y.tolist()) <= {0, 1}


def test_load_images_tfds_mock_source():
    x, y = helpers.load_images("tf_flowers", source="tfds-mock", n=6, image_size=8)
    assert x.shape == (6, 8, 8, 3) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert set(y.tolist()) <= set(range(5))  # tf_flowers has 5 classes


def test_load_images_tfds_without_network_is_one_clear_error(monkeypatch, tmp_path):
    import helpers.data

    asked = []

    def offline(host, port, timeout=5.0):
        asked.append((host, port))
        return False

    monkeypatch.setattr(helpers.data, "_reachable", offline)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"'cats_vs_dogs' dataset is not downloaded yet and "
                                              r"download\.microsoft\.com cannot be reached") as info:
        helpers.load_images("cats_vs_dogs", source="tfds", n=4, data_dir=str(tmp_path))
    assert time.monotonic() - start < 60  # no download retries
    assert asked == [("download.microsoft.com", 443)]
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "source='offline'" in str(info.value)
    assert not any(tmp_path.rglob("*.zip"))  # nothing was downloaded


def test_tfds_download_hosts_and_reachability():
    import tensorflow_datasets as tfds

    from helpers.data import _download_hosts, _reachable

    assert _download_hosts(tfds, "cats_vs_dogs", None) == [("download.microsoft.com", 443)]
    assert _download_hosts(tfds, "tf_flowers", None) == [("download.tensorflow.org", 80)]
    assert _reachable("no-such-host.invalid", 443, timeout=2) is False  # .invalid never resolves


def test_tfds_can_download():
    # tensorflow-datasets 4.9.10 imports importlib_resources to find a dataset's checksums (and so
    # its download URLs); etils >= 1.15 no longer installs it: without the pin in requirements.txt
    # source="tfds" could never download, whatever the network.
    import importlib.util

    assert importlib.util.find_spec("importlib_resources") is not None, (
        "importlib_resources is missing: pin it in requirements.txt (tensorflow-datasets needs it)")
