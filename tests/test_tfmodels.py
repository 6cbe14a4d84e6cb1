"""helpers.tfmodels: the small MobileNetV2, its pipeline and the epoch timer under a strategy."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from helpers.tfmodels import epoch_seconds, image_dataset, inverted_residual, mobilenet_v2_small  # noqa: E402

pytestmark = pytest.mark.gate  # tests/tiers.py


def test_inverted_residual_keeps_shape_and_skips_only_when_it_can():
    inp = tf.keras.Input((8, 8, 16))
    same = tf.keras.Model(inp, inverted_residual(inp, 16))
    down = tf.keras.Model(inp, inverted_residual(inp, 32, stride=2))
    assert same.output.shape[1:] == (8, 8, 16)
    assert down.output.shape[1:] == (4, 4, 32)
    assert any(isinstance(layer, tf.keras.layers.Add) for layer in same.layers)
    assert not any(isinstance(layer, tf.keras.layers.Add) for layer in down.layers)
    assert any(isinstance(layer, tf.keras.layers.DepthwiseConv2D) for layer in same.layers)


def test_mobilenet_v2_small_outputs_logits_and_is_reproducible():
    a = mobilenet_v2_small(16, 5, width=8, blocks=2, seed=1)
    b = mobilenet_v2_small(16, 5, width=8, blocks=2, seed=1)
    x = np.random.default_rng(0).random((3, 16, 16, 3)).astype("float32")
    out = a(x, training=False).numpy()
    assert out.shape == (3, 5)
    np.testing.assert_allclose(out, b(x, training=False).numpy(), rtol=1e-5)


def test_image_dataset_batches_in_order_and_drops_the_remainder():
    x = np.arange(10, dtype="float32").reshape(10, 1)
    y = np.arange(10)
    batches = [yb.numpy().tolist() for _, yb in image_dataset(x, y, 4)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = sorted(v for _, yb in image_dataset(x, y, 5, shuffle=True) for v in yb.numpy())
    assert shuffled == list(range(10))
    with pytest.raises(ValueError):
        image_dataset(x, y, 0)


def test_epoch_seconds_times_each_epoch_after_the_first():
    x = np.random.default_rng(0).random((16, 8, 8, 3)).astype("float32")
    y = np.arange(16) % 2
    times = epoch_seconds(tf.distribute.get_strategy(), x, y, 8, epochs=2, width=4, blocks=1)
    assert len(times) == 2 and all(t > 0 for t in times)
