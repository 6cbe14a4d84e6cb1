"""Small TensorFlow models and input pipelines shared by the MirroredStrategy chapters (1-2) and benchmark."""
from __future__ import annotations

from typing import Any

import numpy as np

from dpc_runtime.quiet import import_tensorflow


def inverted_residual(x: Any, filters: int, *, stride: int = 1, expand: int = 4) -> Any:
    """One MobileNetV2 block: 1x1 expand, 3x3 depthwise, 1x1 linear project, skip when shapes match (chapter 2)."""
    from tensorflow import keras

    layers = keras.layers
    inp = x
    channels = x.shape[-1]
    x = layers.Conv2D(channels * expand, 1, use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.DepthwiseConv2D(3, strides=stride, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.Conv2D(filters, 1, use_bias=False)(x)  # linear bottleneck: no activation
    x = layers.BatchNormalization()(x)
    if stride == 1 and channels == filters:
        x = layers.Add()([inp, x])
    return x


def mobilenet_v2_small(image_size: int = 32, classes: int = 10, *, width: int = 16,
                       blocks: int = 3, seed: int | None = 0) -> Any:
    """A small MobileNetV2-style Keras model (stem, `blocks` inverted-residual stages, classifier) (chapter 2)."""
    from tensorflow import keras

    if seed is not None:
        keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(width, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    filters = width
    for b in range(blocks):
        filters = width * 2 ** b
        x = inverted_residual(x, filters, stride=1 if b == 0 else 2)
        x = inverted_residual(x, filters)
    x = layers.Conv2D(filters * 4, 1, use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(classes)(x)
    return keras.Model(inputs, outputs, name="mobilenet_v2_small")


def image_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, *, shuffle: bool = False,
                  seed: int = 0, drop_remainder: bool = True) -> Any:
    """A tf.data pipeline of (image, label) batches, prefetched; shuffled when asked (chapter 2)."""
    tf = import_tensorflow()

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        ds = ds.shuffle(len(x), seed=seed)
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def epoch_seconds(strategy: Any, x: np.ndarray, y: np.ndarray, batch_size: int, *,
                  epochs: int = 2, lr: float = 1e-3, width: int = 16, blocks: int = 3) -> list[float]:
    """Build, compile and fit the small MobileNetV2 under `strategy`; seconds of each epoch after the first (chapter 1)."""
    tf = import_tensorflow()

    from .timing import keras_epoch_timer

    with strategy.scope():
        model = mobilenet_v2_small(x.shape[1], int(y.max()) + 1, width=width, blocks=blocks)
        model.compile(optimizer=tf.keras.optimizers.Adam(lr),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    timer = keras_epoch_timer()
    model.fit(image_dataset(x, y, batch_size), epochs=epochs + 1, verbose=0, callbacks=[timer],
              shuffle=False)  # a tf.data pipeline shuffles itself; Keras would warn
    return timer.times[1:]  # the first epoch traces and compiles the step: not representative
