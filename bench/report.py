#!/usr/bin/env python3
"""Markdown tables from allreduce_shm_bench's or strategy_run_bench's JSON output.

    allreduce_shm_bench --benchmark_repetitions=5 --benchmark_out=ar.json --benchmark_out_format=json
    bench/report.py ar.json

Uses the median aggregate of each benchmark when repetitions were run, else its single run.
"""
import json
import re
import sys

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def human_size(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def fmt_time(us):
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.2f} us"


def rows(data):
    out = {}
    for b in data["benchmarks"]:
        if b.get("error_occurred"):
            print(f"error in {b['name']}: {b.get('error_message')}", file=sys.stderr)
            continue
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        key = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate" or key not in out:
            out[key] = b
    return out


def main(path):
    with open(path) as f:
        data = json.load(f)
    ctx = data.get("context", {})
    if "stream_GBps" in ctx:
        print(f"stream bandwidth (2 threads, a[i] += b[i]): {float(ctx['stream_GBps']):.1f} GB/s\n")
    ar, sr = [], []
    for name, b in rows(data).items():
        us = b["real_time"] * TO_US[b["time_unit"]]
        m = re.match(r"BM_AllReduce_Shm/(\d+)/(\d+)", name)
        if m:
            ar.append((int(m.group(2)), int(m.group(1)), us, b))
        m = re.match(r"BM_StrategyRun/(\d+)", name)
        if m:
            sr.append((int(m.group(1)), us))
    if ar:
        for n in sorted({r[0] for r in ar}):
            print(f"n = {n} replicas")
            print("| size | time/op | algbw GB/s | busbw GB/s | efficiency |")
            print("|---|---|---|---|---|")
            for _, size, us, b in sorted(r for r in ar if r[0] == n):
                eff = f"{b['efficiency']:.3g}" if "efficiency" in b else "-"
                print(f"| {human_size(size)} | {fmt_time(us)} | {b['algbw']:.3g} | {b['busbw']:.3g} | {eff} |")
            print()
    if sr:
        print("| replicas | time per strategy.run |")
        print("|---|---|")
        for n, us in sorted(sr):
            print(f"| {n} | {fmt_time(us)} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
