"""Input-pipeline benchmark: a starved loop vs a parallel, prefetching one, side by side.

Each variant reads one epoch of helpers.SlowSource (LATENCY_MS per sample, like slow storage)
while a fixed amount of compute per batch stands in for the training step. Variants run
interleaved, REPEAT times, and the script prints median epoch times and the speed-up ratios.
Goal on a 2-core CPU box: >= 1.8x for both frameworks. Absolute times are only reported.

    python benchmarks/input_pipeline.py [--samples 512] [--repeat 5] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402

import helpers  # noqa: E402

warnings.filterwarnings("ignore", message="This DataLoader will create")
STEP_MS = 5.0  # simulated training step per batch


def step(batch) -> None:
    """Stand-in for a training step: STEP_MS of CPU work on the batch."""
    end = time.perf_counter() + STEP_MS / 1000
    x = np.asarray(batch[0])
    while time.perf_counter() < end:
        x.sum()


def epoch(loader) -> float:
    start = time.perf_counter()
    for batch in loader:
        step(batch)
    return time.perf_counter() - start


def tf_variants(source, batch: int, calls: int) -> dict:
    import tensorflow as tf

    def load(i):
        x, y = tf.numpy_function(source.load, [i], (tf.float32, tf.int64))
        return x, y

    def slow():
        return tf.data.Dataset.range(len(source)).map(load).batch(batch)

    def fast():
        ds = tf.data.Dataset.range(len(source)).map(load, num_parallel_calls=calls).batch(batch)
        options = tf.data.Options()
        options.threading.private_threadpool_size = calls
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

    return {"tf.data sequential": slow, f"tf.data {calls} parallel + prefetch": fast}


def torch_variants(source, batch: int, workers: int) -> dict:
    from torch.utils.data import DataLoader

    return {"DataLoader num_workers=0": lambda: DataLoader(source, batch_size=batch),
            f"DataLoader num_workers={workers}": lambda: DataLoader(source, batch_size=batch,
                                                                   num_workers=workers)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--latency-ms", type=float, default=4.0)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="256 samples, 3 repeats")
    p.add_argument("--json", type=str, default=None, help="also write the results here")
    a = p.parse_args()
    if a.quick:
        a.samples, a.repeat = 256, 3
    results = []
    source = helpers.SlowSource(a.samples, latency_ms=a.latency_ms)
    print(f"input pipeline: {a.samples} samples, {a.latency_ms} ms each, step {STEP_MS} ms/batch, "
          f"{helpers.cpu_cores()} cores, median of {a.repeat}")
    for group in (tf_variants(source, a.batch, a.parallel), torch_variants(source, a.batch, 4)):
        times: dict[str, list[float]] = {name: [] for name in group}
        for name, make in group.items():
            epoch(make())  # warm-up (graph tracing, worker start-up paths)
        for _ in range(a.repeat):
            for name, make in group.items():  # interleaved: noise hits all variants alike
                times[name].append(epoch(make()))
        medians = {name: statistics.median(t) for name, t in times.items()}
        base = next(iter(medians))
        rows = helpers.speedup_table(medians, baseline=base)
        print(helpers.format_table(["variant", "s/epoch", "speed-up"], rows))
        ratio = rows[-1][2]
        print(f"RATIO {rows[-1][0]} vs {base}: {ratio:.2f}x (goal >= 1.8x: "
              f"{'met' if ratio >= 1.8 else 'NOT met'})\n")
        results.append({"what": f"{rows[-1][0]} vs {base}", "ratio": round(ratio, 3), "goal": 1.8,
                        "medians_s": {k: round(v, 4) for k, v in medians.items()}})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "input_pipeline", "repeat": a.repeat, "samples": a.samples,
                       "ratios": results}, f, indent=2)


if __name__ == "__main__":
    main()
