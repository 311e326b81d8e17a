#!/usr/bin/env python3
"""The cluster both TensorFlow ParameterServerStrategy peers run on (tf_ps.py, tf_ps_fit.py): on
one machine, a chief in the calling process and tf.distribute.Server tasks (2 workers, 1 ps) in
separate processes, on free loopback ports, gRPC between them.

    with_cluster(lambda strategy, coordinator: ...)

Run as a program, it is one of those tasks (what with_cluster starts):

    python tf_ps_cluster.py CLUSTER_JSON JOB INDEX
"""
import json
import os
import socket
import subprocess
import sys

TASKS = (("worker", 0), ("worker", 1), ("ps", 0))


def free_ports(n):
    """n distinct free loopback ports: every socket stays bound until all are picked."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def serve(cluster, job, index):
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                  protocol="grpc", start=True)
    server.join()


def with_cluster(chief):
    """Starts the tasks, calls chief(strategy, coordinator) in this process, kills the tasks, then
    ends the process (the coordinator's threads do not stop on their own)."""
    ports = free_ports(1 + len(TASKS))
    cluster = {"chief": ["127.0.0.1:%d" % ports[0]],
               "worker": ["127.0.0.1:%d" % ports[1], "127.0.0.1:%d" % ports[2]],
               "ps": ["127.0.0.1:%d" % ports[3]]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    tasks = [subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(cluster), job, str(i)], env=env)
             for job, i in TASKS]
    try:
        os.environ.update(env)
        import tensorflow as tf
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        chief(strategy, coordinator)
    finally:
        for t in tasks:
            t.kill()
            t.wait()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: tf_ps_cluster.py CLUSTER_JSON JOB INDEX (one task of with_cluster's cluster)")
    serve(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
