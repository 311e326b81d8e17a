#!/usr/bin/python3
"""The dashboard's JSON API under MultiWorkerMirroredStrategy: multi_worker_trainer on 2 workers
(troupe-launch), the chief serving the dashboard, each worker tracing its steps.

- GET /api/state answers the documented fields, with both workers;
- every worker's row has its process's CPU and resident memory: the chief's measured by itself,
  worker 1's as its heartbeat carried them (its pid's /proc agrees on the memory);
- POST /api/pause on the chief pauses both workers after the same step: each reports it, the
  state shows both paused at that step, and the step does not move for a second; worker 1's line
  "paused after step N" reaches the chief's GET /api/logs?worker=1 on its heartbeat;
- POST /api/learning_rate while paused: both workers take the same value from the same step;
- POST /api/resume: both go on; POST /api/stop: both stop after the same step, save a checkpoint,
  exit 0 and hold the same weights;
- bad requests get 400 with a message naming the value; the chief's trace and worker 1's parse.

Usage: mw_api_test.py TROUPE_LAUNCH MULTI_WORKER_TRAINER
"""
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the JSON API)
from harness import fail, request, wait_for  # noqa: E402

harness.set_deadline(90)


def worker_rss(launcher, index):
    """The resident bytes of the worker of task `index` among `launcher`'s children, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher:
                    continue
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if json.loads(env.get(b"TF_CONFIG", b"{}")).get("task", {}).get("index") != index:
                continue
            with open("/proc/%s/status" % entry) as f:
                kib = re.search(r"VmRSS:\s+(\d+) kB", f.read())
            return int(kib.group(1)) * 1024 if kib else None
        except (OSError, ValueError, IndexError):
            continue
    return None


def main():
    launch, trainer = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-mw-api-")
    trace = os.path.join(work, "trace.json")
    ckpt = os.path.join(work, "ckpt")
    cluster = None
    try:
        cluster = harness.Started(work, "cluster", [launch, "-n", "2", "--timeout", "80", "--", trainer, "--epochs",
                                                    "100000", "--dashboard-port", "0", "--checkpoint-dir", ckpt,
                                                    "--trace", trace, "--trace-steps", "3:12"])
        proc, out = cluster.proc, cluster.out
        base = harness.base_of(cluster.dashboard_url(30, rank=0))
        if "[rank 1] dashboard:" in out():
            fail("worker 1 serves a dashboard too; only the chief should", out())

        wait_for("a few steps", lambda: request(base, "/api/state")[1]["step"] > 20, 20, out)
        status, state = request(base, "/api/state")
        if status != 200:
            fail("GET /api/state answered %d" % status)
        for key, kind in (("step", int), ("paused", bool), ("learning_rate", float), ("loss", float)):
            if not isinstance(state.get(key), kind):
                fail("GET /api/state: %r is %r, expected a %s" % (key, state.get(key), kind.__name__))
        if len(state["workers"]) != 2 or state["replicas_in_sync"] != 2:
            fail("GET /api/state shows %d workers and %s replicas, expected 2 and 2"
                 % (len(state["workers"]), state["replicas_in_sync"]))

        # CPU and memory on both rows: the chief's its own, worker 1's from its heartbeat (every
        # 500 ms; its CPU is known from its second beat on).
        def usage_of(s, w):
            row = s["workers"][w]
            return row if isinstance(row.get("cpu_percent"), (int, float)) and isinstance(row.get("rss_bytes"), int) \
                else None
        row1 = wait_for("worker 1's CPU and memory on the chief's state",
                        lambda: usage_of(request(base, "/api/state")[1], 1), 10, out)
        row0 = usage_of(request(base, "/api/state")[1], 0)
        if not row0 or row0["usage_from"] != "self" or row1["usage_from"] != "heartbeat":
            fail("the rows' usage: chief %s, worker 1 %s (expected the chief's own, worker 1's from its heartbeat)"
                 % (row0, row1))
        # The numbers are worker 1's own: its process (troupe-launch's child with task index 1)
        # holds about as much as its heartbeat said.
        rss1 = worker_rss(proc.pid, 1)
        if rss1 is None:
            fail("cannot find worker 1's process among troupe-launch's children")
        if not (10 << 20) < row1["rss_bytes"] < (64 << 30) or not rss1 / 2 < row1["rss_bytes"] < rss1 * 2:
            fail("worker 1's resident memory on the chief's state is %r bytes, its /proc says %d"
                 % (row1["rss_bytes"], rss1))
        if not 0 <= row1["cpu_percent"] <= 100 * os.cpu_count() + 50:
            fail("worker 1's CPU on the chief's state is %r %%" % row1["cpu_percent"])
        print("usage: chief %.0f %% %.0f MiB, worker 1 %.0f %% %.0f MiB (from its heartbeat)"
              % (row0["cpu_percent"], row0["rss_bytes"] / 2**20, row1["cpu_percent"], row1["rss_bytes"] / 2**20),
              flush=True)

        # Bad requests: a clear 400 naming the value.
        status, body = request(base, "/api/learning_rate?value=-1", "POST")
        if status != 400 or "-1" not in body.get("error", ""):
            fail("POST /api/learning_rate?value=-1 answered %d %s, expected 400 naming -1" % (status, body))
        status, _ = request(base, "/api/nothing", "POST")
        if status != 404:
            fail("POST /api/nothing answered %d, expected 404" % status)

        # Pause on the chief: both workers pause after the same step.
        status, _ = request(base, "/api/pause", "POST")
        if status != 200:
            fail("POST /api/pause answered %d" % status)
        both = lambda: [re.findall(r"\[rank %d\] paused after step (\d+)" % r, out()) for r in (0, 1)]
        wait_for("both workers to report the pause", lambda: all(both()), 15, out)
        steps = [int(b[0]) for b in both()]
        if steps[0] != steps[1]:
            fail("the workers paused after different steps: %s" % steps, out())
        paused_at = steps[0]
        state = wait_for("the state to show both paused",
                         lambda: (lambda s: s if s["paused"] and all(w["paused"] for w in s["workers"]) else None)(
                             request(base, "/api/state")[1]), 10, out)
        if state["step"] != paused_at or [w["step"] for w in state["workers"]] != [paused_at, paused_at]:
            fail("paused after step %d but the state says %s" % (paused_at, state))
        time.sleep(1.0)
        if request(base, "/api/state")[1]["step"] != paused_at:
            fail("the step moved while paused")

        # Worker 1's own line reaches the chief's page on its heartbeat.
        said = "paused after step %d" % paused_at
        logs1 = wait_for("worker 1's line %r on the chief's /api/logs?worker=1" % said,
                         lambda: (lambda r: r[1] if r[0] == 200 and r[1]["lines"] and r[1]["lines"][-1] == said
                                  else None)(request(base, "/api/logs?worker=1")), 5, out)
        if logs1["worker"] != 1 or logs1["from"] != "heartbeat" or logs1["lines_total"] < len(logs1["lines"]):
            fail("GET /api/logs?worker=1 answered %s" % logs1)
        logs0 = request(base, "/api/logs?worker=0")[1]
        if logs0.get("from") != "self" or said not in logs0["lines"]:
            fail("GET /api/logs?worker=0 answered %s, expected the chief's own lines with %r" % (logs0, said))
        status, body = request(base, "/api/logs?worker=2")
        if status != 400 or "0..1" not in body.get("error", ""):
            fail("GET /api/logs?worker=2 answered %d %s, expected 400 naming 0..1" % (status, body))
        print("worker 1's last line on the chief: %r (%d lines said)" % (logs1["lines"][-1], logs1["lines_total"]),
              flush=True)

        # A learning rate while paused: both workers, the same step.
        request(base, "/api/learning_rate?value=0.0007", "POST")
        lr = lambda: [re.findall(r"\[rank %d\] learning rate 0\.0007 from step (\d+)" % r, out()) for r in (0, 1)]
        wait_for("both workers to take the learning rate", lambda: all(lr()), 10, out)
        if [int(x[0]) for x in lr()] != [paused_at + 1, paused_at + 1]:
            fail("the learning rate applies from steps %s, expected %d on both" % (lr(), paused_at + 1))

        request(base, "/api/resume", "POST")
        wait_for("steps after resume", lambda: request(base, "/api/state")[1]["step"] > paused_at + 5, 15, out)
        if abs(request(base, "/api/state")[1]["learning_rate"] - 0.0007) > 1e-9:
            fail("the state does not show learning rate 0.0007 after resume")

        # Stop: both stop after the same step, with a checkpoint, and exit 0 in step.
        request(base, "/api/stop", "POST")
        rc = cluster.wait("the workers after stop")
        text = out()
        if rc != 0:
            fail("troupe-launch exited %d after stop" % rc, text)
        stopped = [re.findall(r"\[rank %d\] stopped after step (\d+)" % r, text) for r in (0, 1)]
        if not all(stopped) or stopped[0] != stopped[1]:
            fail("the workers' stops: %s (expected one, the same step, on both)" % stopped, text)
        stop_step = int(stopped[0][0])
        if not os.path.exists(os.path.join(ckpt, "ckpt-%d.ckpt" % stop_step)):
            fail("no checkpoint ckpt-%d.ckpt in %s: %s" % (stop_step, ckpt, os.listdir(ckpt)), text)
        digests = [re.findall(r"\[rank %d\] result: .* steps=%d .*weights_digest=(\w+)" % (r, stop_step), text)
                   for r in (0, 1)]
        if not all(digests) or digests[0] != digests[1]:
            fail("the workers' result lines after stop: %s" % digests, text)

        for path in (trace, trace + ".worker-1"):
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            reduces = [e for e in events if e.get("name") == "all_reduce"]
            if not reduces or any("dur" not in e or "replica" not in e["args"] for e in reduces):
                fail("%s: all-reduce events without a duration or a replica" % path)
        print("PASSED: both workers paused after step %d, took the learning rate from step %d, stopped after step "
              "%d with checkpoint ckpt-%d and weights %s" % (paused_at, paused_at + 1, stop_step, stop_step,
                                                              digests[0][0]), flush=True)
        return 0
    finally:
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
