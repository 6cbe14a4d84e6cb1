"""horovodrun test job (tf-keras, TF_USE_LEGACY_KERAS=1): fit with Horovod; ranks must agree."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # Horovod drives tf-keras only, not Keras 3
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
import tf_keras as keras

from helpers.worker import finish, report, start

start(backend=None)
hvd.init()
tf.random.set_seed(hvd.rank())  # different on purpose: the broadcast callback makes them equal
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
model.compile(optimizer=opt, loss="mse")
rng = np.random.default_rng(100 + hvd.rank())
x = rng.standard_normal((32, 4)).astype("float32")
y = x.sum(1, keepdims=True)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
flat = np.concatenate([w.flatten() for w in model.get_weights()])
gathered = hvd.allgather(tf.constant(flat[None, :])).numpy()
same = bool(np.allclose(gathered[0], gathered[-1]))
print(f"rank {hvd.rank()} of {hvd.size()}: weights identical on all ranks: {same}")
report(same_weights=same)
finish(0 if same else 1)
