#!/usr/bin/env python3
"""The peer of examples/digits_cnn in bench/digits_cnn_bench.sh: the same CNN (Conv2D 16 3x3 same
relu, MaxPooling2D 2, Conv2D 32 3x3 same relu, MaxPooling2D 2, Flatten, Dropout 0.25, Dense 10),
Adam, global batch, epochs and replica count, on Keras's Model.fit under TensorFlow's
MirroredStrategy over logical CPU devices, on scikit-learn's digits (pixels / 16, 20 % held out
for the test, shuffled by a seed).

Prints a result line in digits_cnn's form:
  result: replicas=4 batch=64 epochs=30 samples_per_s=... test_accuracy=... test_loss=... test_samples=...
samples_per_s is the median over epochs (the first, which traces the functions, is left out).

  python3 bench/tf_digits_cnn.py --replicas 4 --batch 64 --epochs 30 --digits /opt/troupe-data/digits.csv
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


class EpochTimes(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)

    def __init__(self):
        super().__init__()
        self.seconds = []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--digits", default="/opt/troupe-data/digits.csv")
    a = p.parse_args()

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.replicas)])

    table = np.loadtxt(a.digits, delimiter=",", dtype=np.float32)
    x = (table[:, :64] / 16.0).reshape(-1, 8, 8, 1)
    y = table[:, 64].astype(np.int64)
    order = np.random.default_rng(a.seed).permutation(len(y))
    test = max(1, int(len(y) * 0.2))
    train_idx, test_idx = order[: len(y) - test], order[len(y) - test:]
    steps = len(train_idx) // a.batch
    train = (tf.data.Dataset.from_tensor_slices((x[train_idx], y[train_idx]))
             .shuffle(len(train_idx), seed=a.seed).repeat().batch(a.batch, drop_remainder=True))

    tf.keras.utils.set_random_seed(a.seed)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(2),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(2),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Dense(10),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(a.lr),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    times = EpochTimes()
    model.fit(train, epochs=a.epochs, steps_per_epoch=steps, verbose=0, callbacks=[times])
    # The model called directly: Keras's evaluate under MirroredStrategy fails on a last batch that
    # does not split evenly over the replicas (AddN of [90,8,8,1] and [89,8,8,1]).
    logits = model(x[test_idx], training=False)
    loss = float(tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[test_idx], logits))
    accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y[test_idx]))
    rates = [steps * a.batch / s for s in times.seconds[1:] or times.seconds]
    print(f"result: replicas={a.replicas} batch={a.batch} epochs={a.epochs} samples_per_s={statistics.median(rates):.0f} "
          f"test_accuracy={accuracy:.4f} test_loss={loss:.4f} test_samples={len(test_idx)}")


if __name__ == "__main__":
    main()
