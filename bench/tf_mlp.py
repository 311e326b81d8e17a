#!/usr/bin/env python3
"""The peer of mlp_classifier in bench/training_bench.sh's side-by-side mode: the same MLP
(FEATURES -> HIDDEN relu -> HIDDEN relu -> CLASSES), global batch, plain SGD and replica count, on
TensorFlow's MirroredStrategy over logical CPU devices, with the seed's custom loop (GradientTape,
strategy.run and reduce inside tf.function) and cached input (one epoch of global batches
generated once and repeated, as --cached-batches does).

Prints the same result line as mlp_classifier:
  result: replicas=4 batch=256 input=cached steps=... samples_per_s=... loss=...
samples_per_s is the median over epochs (the first, which traces the function, is left out).

  python3 bench/tf_mlp.py --replicas 4 --batch 256 --epochs 6 --features 784 --hidden 256 --classes 10
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args()

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * a.replicas)
    devices = [f"/cpu:{i}" for i in range(a.replicas)]
    strategy = tf.distribute.MirroredStrategy(devices)

    rng = np.random.default_rng(7)
    steps = a.samples // a.batch
    x = rng.standard_normal((steps * a.batch, a.features), dtype=np.float32)
    y = rng.integers(0, a.classes, steps * a.batch).astype(np.int64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(a.batch, drop_remainder=True).cache().repeat()
    dist = iter(strategy.experimental_distribute_dataset(ds))

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((a.features,)),
            tf.keras.layers.Dense(a.hidden, activation="relu"),
            tf.keras.layers.Dense(a.hidden, activation="relu"),
            tf.keras.layers.Dense(a.classes),
        ])
        optimizer = tf.keras.optimizers.SGD(a.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(inputs):
        def step_fn(features, labels):
            with tf.GradientTape() as tape:
                logits = model(features, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits), global_batch_size=a.batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        per_replica = strategy.run(step_fn, args=inputs)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    rates = []
    loss = 0.0
    for epoch in range(a.epochs + 1):
        start = time.perf_counter()
        for _ in range(steps):
            loss = train_step(next(dist))
        loss = float(loss)
        seconds = time.perf_counter() - start
        if epoch > 0:
            rates.append(steps * a.batch / seconds)
    print(f"result: replicas={a.replicas} batch={a.batch} input=cached steps={steps * a.epochs} "
          f"samples_per_s={statistics.median(rates):.0f} loss={loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
