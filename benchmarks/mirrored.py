"""MirroredStrategy benchmark: one device vs N devices at the same and at N times the global batch.

The experiment of R1, "单机多卡训练: MirroredStrategy" ("One machine, many GPUs: MirroredStrategy",
from 简单粗暴 TensorFlow 2; see README's References): MobileNetV2, 1 GPU at batch 64 vs 4 GPUs at
global batch 64 and 256, here on this machine's devices, with a small MobileNetV2-style model and
generated images. Devices come from helpers.tf_devices: real GPUs when there are enough, logical
GPUs carved from one GPU, else logical CPU devices that share the same cores (expect no speed-up
there: the ratios then show the overhead of replication, not a gain). The three set-ups run
interleaved, REPEAT times, after one warm-up epoch each; the script prints median epoch times and
ratios. Nothing is asserted.

    python benchmarks/mirrored.py [--devices 4] [--samples 512] [--repeat 3] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import helpers  # noqa: E402
from helpers.tfmodels import image_dataset, mobilenet_v2_small  # noqa: E402


def build(strategy, image_size: int, lr: float, width: int, blocks: int):
    """The model compiled under the strategy's scope."""
    import tensorflow as tf

    with strategy.scope():
        model = mobilenet_v2_small(image_size, 10, width=width, blocks=blocks)
        model.compile(optimizer=tf.keras.optimizers.Adam(lr),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--image-size", type=int, default=24)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--blocks", type=int, default=3, help="inverted-residual stages of the model")
    p.add_argument("--batch", type=int, default=64, help="batch of the 1-device run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer, smaller samples, 2 repeats")
    p.add_argument("--json", default=None, help="also write the medians and ratios here")
    a = p.parse_args()
    if a.quick:
        a.samples, a.repeat, a.image_size, a.width, a.blocks = 256, 2, 16, 8, 1
    devices = helpers.tf_devices(a.devices)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    n = len(devices)
    x, y = helpers.synthetic_images(a.samples, image_size=a.image_size)
    one = tf.distribute.OneDeviceStrategy(devices[0])
    many = tf.distribute.MirroredStrategy(devices)
    setups = {  # name: (strategy, global batch, lr scaled with the global batch)
        f"1 device, batch {a.batch}": (one, a.batch, 1e-3),
        f"{n} devices, global batch {a.batch}": (many, a.batch, 1e-3),
        f"{n} devices, global batch {a.batch * n}": (many, a.batch * n, 1e-3 * n),
    }
    runs: dict[str, tuple] = {}  # name: (model, data, epoch seconds)
    for name, (strategy, batch, lr) in setups.items():
        model = build(strategy, a.image_size, lr, a.width, a.blocks)
        data = image_dataset(x, y, batch)
        model.fit(data, epochs=1, verbose=0, shuffle=False)  # warm-up: traces and compiles the step
        runs[name] = (model, data, [])
    for _ in range(a.repeat):  # interleaved, so that load on a shared machine hits all alike
        for model, data, times in runs.values():
            start = time.perf_counter()
            model.fit(data, epochs=1, verbose=0, shuffle=False)
            times.append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, (_, _, t) in runs.items()}
    base = next(iter(med.values()))
    print(f"MirroredStrategy: {a.samples} images {a.image_size}x{a.image_size}, {n} device(s) "
          f"{devices}, {helpers.cpu_cores()} cores, median of {a.repeat} epochs")
    print(helpers.format_table(["set-up", "s/epoch", "speed-up vs 1 device"],
                               [(k, v, base / v) for k, v in med.items()]))
    if a.json:
        names = list(med)
        with open(a.json, "w") as f:
            json.dump({"benchmark": "mirrored", "devices": devices, "medians_s": med,
                       "ratios": [{"what": f"speed-up (epoch time): {k} vs {names[0]}", "ratio": base / med[k],
                                   "goal": None} for k in names[1:]]}, f, indent=1)


if __name__ == "__main__":
    main()
