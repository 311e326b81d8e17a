#!/usr/bin/env python3
"""The peer of ps_trainer's Model::fit in bench/ps_fit_bench.sh: TensorFlow 2.21's
ParameterServerStrategy training the same MLP (FEATURES -> HIDDEN relu -> HIDDEN relu -> CLASSES)
on the same kind of generated set (Gaussian clusters, 2 per class), batch 64, with
tf.distribute.Server tasks in separate processes (2 workers, 1 ps) and a ClusterCoordinator
scheduling one train step per closure onto per-worker datasets. Keras 3 (what TensorFlow 2.21
ships) has no model.fit under ParameterServerStrategy, so the step is the loop Keras 2's fit
scheduled, written out: GradientTape, then the optimizer's update of the variables on the ps
task (SGD, or Adam with its slots there).

Prints one line:
  tensorflow: N steps of batch B in S s: X samples/s loss_first=... loss_last=...
(loss_first and loss_last: the mean losses of the first and the last 10 steps; the first
closure, which traces the function, is not timed).

    python tf_ps_fit.py [--steps 400] [--optimizer sgd|adam] [--lr 0.05]
"""
import argparse
import time

from tf_ps_cluster import with_cluster


def blobs(samples, features, classes, seed=42):
    """ps_trainer's generated set in kind (nn::make_blobs: 2 clusters per class, centres uniform in
    [-1.25, 1.25], standard deviation 1; sample i of class i % classes), not in bits."""
    import numpy as np
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-1.25, 1.25, size=(classes, 2, features)).astype("float32")
    labels = (np.arange(samples) % classes).astype("int64")
    cluster = rng.integers(0, 2, size=samples)
    x = centres[labels, cluster] + rng.standard_normal((samples, features)).astype("float32")
    return x, labels


def chief(strategy, coordinator, a):
    import tensorflow as tf
    sizes = [a.features, a.hidden, a.hidden, a.classes]
    with strategy.scope():
        init = tf.keras.initializers.GlorotUniform(seed=100)
        weights = []
        for l in range(3):
            weights.append(tf.Variable(init([sizes[l], sizes[l + 1]]), name="kernel_%d" % l))
            weights.append(tf.Variable(tf.zeros([sizes[l + 1]]), name="bias_%d" % l))
        if a.optimizer == "adam":
            m = [tf.Variable(tf.zeros_like(w)) for w in weights]
            v = [tf.Variable(tf.zeros_like(w)) for w in weights]
            t = tf.Variable(0.0)

    def dataset_fn():
        x, y = blobs(a.samples, a.features, a.classes)
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(a.samples, seed=7).repeat().batch(a.batch, True)

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            h = x
            for l in range(3):
                h = tf.matmul(h, weights[2 * l]) + weights[2 * l + 1]
                if l < 2:
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h))
        grads = tape.gradient(loss, weights)
        if a.optimizer == "adam":
            t.assign_add(1.0)
            lr_t = a.lr * tf.sqrt(1.0 - tf.pow(0.999, t)) / (1.0 - tf.pow(0.9, t))
            for w, g, mi, vi in zip(weights, grads, m, v):
                mi.assign(0.9 * mi + 0.1 * g)
                vi.assign(0.999 * vi + 0.001 * g * g)
                w.assign_sub(lr_t * mi / (tf.sqrt(vi) + 1e-7))
        else:
            for w, g in zip(weights, grads):
                w.assign_sub(a.lr * g)
        return loss

    losses = [coordinator.schedule(step, args=(iterator,))]
    coordinator.join()  # traced
    t0 = time.perf_counter()
    losses += [coordinator.schedule(step, args=(iterator,)) for _ in range(a.steps - 1)]
    coordinator.join()
    seconds = time.perf_counter() - t0
    values = [float(r.fetch()) for r in losses]
    k = min(10, len(values))
    print("tensorflow: %d steps of batch %d in %.4g s: %.6g samples/s loss_first=%.5g loss_last=%.5g"
          % (a.steps, a.batch, seconds, (a.steps - 1) * a.batch / seconds, sum(values[:k]) / k,
             sum(values[-k:]) / k), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args()
    with_cluster(lambda strategy, coordinator: chief(strategy, coordinator, a))


if __name__ == "__main__":
    main()
