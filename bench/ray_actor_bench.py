"""Ray's actor calls on one machine, the peer of bench/actor_bench.cpp (bench/actor_bench.sh runs both).

Measures, with one actor in a local Ray cluster:
  - the 1:1 synchronous call round trip: ray.get(actor.echo.remote(x)) with a small argument;
  - asynchronous throughput: a window of calls in flight, ray.get on the oldest (as troupe's
    request_async window), and calls submitted all at once then gathered with one ray.get;
  - the round trip of a 1 MiB numpy argument echoed back.
Prints one "ray <what>: <value> <unit> ..." line per measurement.
"""
import argparse
import collections
import statistics
import time

import numpy as np
import ray


@ray.remote
class Echo:
    def echo(self, x):
        return x


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--messages", type=int, default=5000)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--big-iters", type=int, default=50)
    a = p.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    actor = Echo.remote()
    small = np.float32(1.0)
    for _ in range(200):
        ray.get(actor.echo.remote(small))

    rtts = []
    start = time.perf_counter()
    for _ in range(a.iters):
        t = time.perf_counter()
        ray.get(actor.echo.remote(small))
        rtts.append(time.perf_counter() - t)
    mean = (time.perf_counter() - start) / a.iters
    print("ray sync round trip: %.1f us median, %.1f us mean over %d" % (statistics.median(rtts) * 1e6, mean * 1e6, a.iters),
          flush=True)

    in_flight = collections.deque()
    start = time.perf_counter()
    for _ in range(a.messages):
        if len(in_flight) >= a.window:
            ray.get(in_flight.popleft())
        in_flight.append(actor.echo.remote(small))
    ray.get(list(in_flight))
    s = time.perf_counter() - start
    print("ray async requests: %.0f msgs/s (%d requests, %d in flight)" % (a.messages / s, a.messages, a.window), flush=True)
    start = time.perf_counter()
    ray.get([actor.echo.remote(small) for _ in range(a.messages)])
    s = time.perf_counter() - start
    print("ray async all at once: %.0f msgs/s (%d requests)" % (a.messages / s, a.messages), flush=True)

    big = np.zeros(1 << 18, dtype=np.float32)  # 1 MiB
    for _ in range(3):
        ray.get(actor.echo.remote(big))
    rtts = []
    for _ in range(a.big_iters):
        t = time.perf_counter()
        r = ray.get(actor.echo.remote(big))
        rtts.append(time.perf_counter() - t)
        assert r.nbytes == big.nbytes
    med = statistics.median(rtts)
    print("ray 1 MiB round trip: %.0f us median (%.0f MB/s each way)" % (med * 1e6, 2 * big.nbytes / med / 1e6), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
