#!/usr/bin/env python3
"""The peer of cluster_bench: TensorFlow's ParameterServerStrategy and ClusterCoordinator on one
machine, with tf.distribute.Server tasks in separate processes (2 workers, 1 ps), measuring what
cluster_bench measures: empty closures per second, closures that read a variable of 4 KiB to
16 MiB (returning its sum) or add a tensor of its size to it, in MB/s of variable bytes, and
closures that look up (embedding_lookup) or scatter_sub 1024 rows of 256 bytes of a 64 MiB table.

    python tf_ps.py [--closures 2000] [--rounds 5]
"""
import argparse
import statistics
import time

from tf_ps_cluster import with_cluster

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def make_fn(tf, op, v, b):
    if op == "read":
        @tf.function
        def read():
            return tf.reduce_sum(v)
        return read

    @tf.function
    def update():
        v.assign_add(tf.ones([b // 4]))
        return tf.constant(0)
    return update


TABLE_ROWS, TABLE_DIM, BATCH_ROWS = 262144, 64, 1024


def make_row_fn(tf, op, table):
    if op == "lookup":
        @tf.function
        def lookup():
            ids = tf.random.uniform([BATCH_ROWS], 0, TABLE_ROWS, dtype=tf.int64)
            return tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
        return lookup

    @tf.function
    def scatter():
        ids = tf.random.uniform([BATCH_ROWS], 0, TABLE_ROWS, dtype=tf.int64)
        table.scatter_sub(tf.IndexedSlices(tf.fill([BATCH_ROWS, TABLE_DIM], 0.001), ids))
        return tf.constant(0)
    return scatter


def mb_per_s(coordinator, fn, n, b, rounds):
    """The median over rounds of n closures of fn, each moving b bytes, in MB/s."""
    mbs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            coordinator.schedule(fn)
        coordinator.join()
        mbs.append(n * b / (time.perf_counter() - t0) / 1e6)
    return statistics.median(mbs)


def chief(strategy, coordinator, closures, rounds):
    import tensorflow as tf
    with strategy.scope():
        variables = {b: tf.Variable(tf.zeros([b // 4])) for b in SIZES}
        table = tf.Variable(tf.zeros([TABLE_ROWS, TABLE_DIM]))

    @tf.function
    def empty():
        return tf.constant(0)

    coordinator.schedule(empty)
    coordinator.join()
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(closures):
            coordinator.schedule(empty)
        coordinator.join()
        rates.append(closures / (time.perf_counter() - t0))
    print("tensorflow empty closures: 2 workers, %d per round: %.0f closures/s (median of %d)"
          % (closures, statistics.median(rates), rounds), flush=True)
    for op in ("read", "update"):
        for b in SIZES:
            fn = make_fn(tf, op, variables[b], b)
            coordinator.schedule(fn)
            coordinator.join()
            n = max(8, min(500, (64 << 20) // b))
            m = mb_per_s(coordinator, fn, n, b, rounds)
            print("tensorflow %s %d bytes: %d closures: %.1f MB/s, %.1f us per closure (median of %d)"
                  % (op, b, n, m, b / m, rounds), flush=True)
    for op in ("lookup", "scatter"):
        fn = make_row_fn(tf, op, table)
        coordinator.schedule(fn)
        coordinator.join()
        n, b = 200, BATCH_ROWS * TABLE_DIM * 4
        m = mb_per_s(coordinator, fn, n, b, rounds)
        print("tensorflow %s %d rows of %d bytes: %d closures: %.1f MB/s, %.1f us per closure (median of %d)"
              % (op, BATCH_ROWS, TABLE_DIM * 4, n, m, b / m, rounds), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--closures", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with_cluster(lambda strategy, coordinator: chief(strategy, coordinator, a.closures, a.rounds))


if __name__ == "__main__":
    main()
