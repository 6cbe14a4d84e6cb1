"""helpers.towers: splits by speed, the small model and batch, the reference step, the memory estimate."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.towers import (
    make_batch,
    make_model,
    max_abs_diff,
    memory_estimate,
    n_params,
    single_device_step,
    split_sizes,
)

pytestmark = pytest.mark.gate  # tests/tiers.py


@pytest.mark.parametrize(("batch", "speeds", "sizes"), [
    (64, [1, 1, 1, 1], [16, 16, 16, 16]),
    (10, [1, 1, 1], [4, 3, 3]),            # remainder to the earliest device on a tie
    (60, [2, 1], [40, 20]),
    (10, [1, 0.5, 0.5], [5, 3, 2]),         # 5, 2.5, 2.5: one extra example to the first tie
    (7, [3.0], [7]),
    (0, [1, 2], [0, 0]),
])
def test_split_sizes_follow_speeds_and_sum_to_batch(batch, speeds, sizes):
    assert split_sizes(batch, speeds) == sizes


@pytest.mark.parametrize(("batch", "speeds"), [(10, []), (10, [1, 0]), (10, [1, -2]), (-1, [1]), (2.5, [1])])
def test_split_sizes_rejects_bad_input(batch, speeds):
    with pytest.raises(ValueError):
        split_sizes(batch, speeds)


def test_make_batch_is_deterministic_and_labelled():
    x, y = make_batch(32, seed=3)
    x2, y2 = make_batch(32, seed=3)
    assert x.shape == (32, 20) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, make_batch(32, seed=4)[0])
    assert set(np.unique(y)) <= set(range(5)) and len(np.unique(y)) > 1


def test_make_model_same_seed_same_weights_and_batch_norm_option():
    a, b, c = make_model(seed=1), make_model(seed=1), make_model(seed=2)
    assert max_abs_diff(a.get_weights(), b.get_weights()) == 0.0
    assert max_abs_diff(a.get_weights(), c.get_weights()) > 0.0
    bn = make_model(batch_norm=True)
    assert [v.path.split("/")[-1] for v in bn.non_trainable_variables] == ["moving_mean", "moving_variance"]
    assert not make_model().non_trainable_variables


def test_single_device_step_is_plain_gradient_descent():
    import keras
    import tensorflow as tf

    model = make_model()
    x, y = make_batch(16)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    before = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        expected_loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(expected_loss, model.trainable_variables)
    loss = single_device_step(model, keras.optimizers.SGD(0.5), loss_fn, x, y)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    want = [b - 0.5 * g.numpy() for b, g in zip(before, grads)]
    assert max_abs_diff(want, model.trainable_variables) < 1e-6


def test_max_abs_diff_and_n_params():
    assert max_abs_diff([np.zeros(3), np.ones((2, 2))], [np.zeros(3), np.full((2, 2), 1.5)]) == 0.5
    assert max_abs_diff([], []) == 0.0
    with pytest.raises(ValueError):
        max_abs_diff([np.zeros(1)], [])
    assert n_params(make_model().trainable_variables) == 20 * 32 + 32 + 32 * 5 + 5


def test_memory_estimate_counts_gathered_gradients_and_slots():
    est = memory_estimate(1000, n_towers=4, slots_per_param=2)
    assert (est.params, est.gathered, est.averaged, est.slots) == (4000, 16000, 4000, 8000)
    assert est.variable_device() == 32000 and est.other_device() == 8000
    assert memory_estimate(10, 1, 0, bytes_per_value=2).variable_device() == 20 + 20 + 20
