#!/usr/bin/env python3
"""The PyTorch peer of tcp_allreduce_bench: torch.distributed.all_reduce over the gloo backend
(float32 SUM, in place) between N local processes on loopback, measured the same way: per size,
repetitions of about TARGET_MS each, the median over repetitions of the time per operation of the
slowest rank. Prints lines in tcp_allreduce_bench's format:
  gloo_allreduce bytes=4096 ranks=4 iters=... median_us=... algbw_GBps=... busbw_GBps=...

  python3 bench/torch_gloo_allreduce.py -n 4 --reps 3 --target-ms 30 4096 1048576 16777216
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, n, port, sizes, reps, target_ms, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32)
        dist.all_reduce(t)  # warm-up, and the connections
        # Iterations per repetition: about target_ms, agreed by taking rank 0's estimate.
        start = time.perf_counter()
        dist.all_reduce(t)
        one = max(time.perf_counter() - start, 1e-6)
        iters = torch.tensor([max(1, int(target_ms / 1000.0 / one))])
        dist.broadcast(iters, 0)
        iters = int(iters.item())
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            per_op = torch.tensor([(time.perf_counter() - start) / iters])
            dist.all_reduce(per_op, op=dist.ReduceOp.MAX)  # the slowest rank
            times.append(per_op.item())
        if rank == 0:
            results.put((size, iters, statistics.median(times)))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--target-ms", type=float, default=30.0)
    p.add_argument("sizes", type=int, nargs="*", default=[4, 4096, 65536, 1048576, 16777216, 67108864])
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a.n, port, a.sizes, a.reps, a.target_ms, results))
             for r in range(a.n)]
    for proc in procs:
        proc.start()
    lines = []
    for _ in a.sizes:
        size, iters, seconds = results.get(timeout=600)
        algbw = size / seconds / 1e9
        busbw = algbw * 2 * (a.n - 1) / a.n
        lines.append(f"gloo_allreduce bytes={size} ranks={a.n} iters={iters} median_us={seconds * 1e6:.2f} "
                     f"algbw_GBps={algbw:.3f} busbw_GBps={busbw:.3f}")
    for proc in procs:
        proc.join(timeout=60)
        if proc.exitcode != 0:
            raise SystemExit(f"torch_gloo_allreduce.py: a rank exited with {proc.exitcode}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
