"""MultiWorkerMirroredStrategy worker of chapter 8 (course/08-scaling-up.ipynb) and of slurm/tf_multiworker.sbatch.

Each worker is one process (one "machine"); TF_CONFIG tells it the address of every worker and
which one it is. Under srun without TF_CONFIG, it is built from SLURM_PROCID and TF_WORKERS.
Trains a small Keras model on the digits for two epochs, then prints a checksum of its weights:
every worker must print the same one.
"""
import json
import os
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Keras 3's model.fit does not support MultiWorkerMirroredStrategy (keras-team/keras#20585):
# tf.keras becomes tf-keras (Keras 2), whose fit does. A custom loop with strategy.run works too.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
if "TF_CONFIG" not in os.environ and "SLURM_PROCID" in os.environ:  # srun
    from helpers.multinode import tf_config_from_slurm

    os.environ["TF_CONFIG"] = tf_config_from_slurm(os.environ)

import numpy as np
import tensorflow as tf

from helpers import digits
from helpers.worker import finish, report, start

start(backend=None)  # the course's worker protocol; TensorFlow makes its own cluster
task = json.loads(os.environ["TF_CONFIG"])["task"]
# The strategy must be created before any other TensorFlow work: it starts this worker's server.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
workers = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
print(f"worker {task['index']} of {workers}: {strategy.num_replicas_in_sync} replica(s) in sync")

x_tr, y_tr, _, _ = digits()
per_replica = 32
global_batch = per_replica * strategy.num_replicas_in_sync
ds = tf.data.Dataset.from_tensor_slices((x_tr.reshape(-1, 64), y_tr)).shuffle(2048, seed=0)
ds = ds.batch(global_batch, drop_remainder=True)  # each worker reads its own shard of every batch
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
ds = ds.with_options(options)

with strategy.scope():  # variables created here are mirrored on every worker
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05 * strategy.num_replicas_in_sync, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
history = model.fit(ds, epochs=2, verbose=0)
checksum = float(sum(np.abs(w).sum() for w in model.get_weights()))
print(f"worker {task['index']}: loss {history.history['loss'][-1]:.3f}, weights checksum {checksum:.6f}")
report(loss=history.history["loss"][-1], checksum=checksum, world_size=workers,
       node_name=os.environ.get("SLURMD_NODENAME", socket.gethostname()))
finish(barrier=False)  # fit ended with a collective on every worker; nothing left to wait for
