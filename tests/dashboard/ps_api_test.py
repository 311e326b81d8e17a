#!/usr/bin/python3
"""The dashboard's JSON API under ParameterServerStrategy: ps_trainer (Model::fit) under
troupe-launch with a chief, 2 workers and 2 ps tasks, the chief serving the dashboard.

- GET /api/state carries ps_cluster (and GET /api/ps_cluster the same): both workers running
  closures with a closures/s above 0, the closures done over the workers adding up to the total;
  each worker's samples/s above 0 and in line with its closures/s (64 samples a closure), the
  samples the workers' rows count adding up to 64 per step taken;
- the samples/s of /api/history (fit's throughput, one point per step) has no spikes: fit takes
  results in the order it scheduled them, and one that arrived while it waited for an older one is
  taken at once; measured from the previous take alone, it read hundreds of times the real rate.
  No point is above 4x the median (after the first few);
  both ps tasks reporting the bytes they hold (the model's 6532 float32 weights and Adam's two
  slots, over both, plus Adam's step count) and their updates, with an update rate above 0; every
  step sends one optimizer update per variable shard (12), so the ps tasks' updates reported after
  a moment are at least 12 x the closures done at that moment;
- POST /api/pause applies at a closure boundary: the chief says "paused after step N", nothing is
  queued or in flight afterwards, both workers idle, the closures done equal the steps (every
  closure in flight finished and was taken), and for a second neither the step, the closures done
  nor the ps tasks' updates move;
- POST /api/learning_rate while paused applies from the next step; POST /api/resume goes on;
- POST /api/checkpoint: the chief saves a sharded checkpoint of the step it says, and goes on;
- worker 1 SIGSTOPped misses its heartbeats: a worker_lost event names it with the chief's step,
  the closures it held are retried (ps_cluster.retried is the sum of the closures_retried events'
  counts), and once SIGCONTed it is back (a worker_back event) and runs closures again;
- POST /api/stop (with a checkpoint): the chief stops at a closure boundary, saves a sharded
  checkpoint of that step, says so, and the cluster exits 0 with the result line last.

Usage: ps_api_test.py TROUPE_LAUNCH PS_TRAINER
"""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the JSON API)
from harness import fail, request, wait_for  # noqa: E402

harness.set_deadline(110)
HEARTBEAT_MS = 200  # with 3 missed beats a silent worker is lost after about 0.6 s

# ps_trainer's MLP (32 features, 64 hidden units twice, 4 classes): its float32 weights.
WEIGHTS = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
SHARD_UPDATES_PER_STEP = 12  # 6 variables of 2 shards each (--shards 2)


def main():
    launch, trainer = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-ps-api-")
    ckpt = os.path.join(work, "ckpt")
    token = "ps-api-%d" % os.getpid()
    env = dict(os.environ, TROUPE_HEARTBEAT_MS=str(HEARTBEAT_MS), TROUPE_MISSED_HEARTBEATS="3",
               TROUPE_TEST_RUN=token)
    cluster = None
    stopped_pid = None
    try:
        cluster = harness.Started(work, "cluster", [launch, "--ps", "2", "-n", "2", "--chief", "--timeout", "100", "--",
                                                    trainer, "--closures", "1000000", "--shards", "2", "--step-delay-ms",
                                                    "4", "--dashboard-port", "0", "--checkpoint-dir", ckpt], env=env)
        out = cluster.out
        base = harness.base_of(cluster.dashboard_url(40, rank=0))

        def ps_state():
            status, state = request(base, "/api/state")
            if status != 200:
                fail("GET /api/state answered %d: %s" % (status, state))
            if not isinstance(state.get("ps_cluster"), dict):
                fail("GET /api/state has no ps_cluster object: %s" % json.dumps(state)[:2000])
            return state

        # Both workers run closures; both ps tasks report.
        def busy(s):
            ps = s["ps_cluster"]
            return s if (all(w["closures_done"] > 0 for w in ps["workers"]) and ps["closures_per_s"] > 0
                         and all(p["state"] == "up" and p["updates_per_s"] > 0 for p in ps["ps"])) else None
        state = wait_for("both workers running closures and both ps tasks updating", lambda: busy(ps_state()), 40, out)
        ps = state["ps_cluster"]
        if [w.get("task") for w in state["workers"]] != ["/job:chief/replica:0/task:0"]:
            fail("the chief's own row names %s, expected /job:chief/replica:0/task:0"
                 % [w.get("task") for w in state["workers"]])
        if [w["task"] for w in ps["workers"]] != ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]:
            fail("ps_cluster.workers names %s" % [w["task"] for w in ps["workers"]])
        if [p["task"] for p in ps["ps"]] != ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]:
            fail("ps_cluster.ps names %s" % [p["task"] for p in ps["ps"]])
        for key in ("closures_per_s", "queued", "in_flight", "scheduled", "done", "retried", "cancelled", "workers_lost",
                    "events", "events_total"):
            if key not in ps:
                fail("ps_cluster has no %r: %s" % (key, ps))
        if sum(w["closures_done"] for w in ps["workers"]) != ps["done"]:
            fail("the workers' closures done %s do not add up to %d" % ([w["closures_done"] for w in ps["workers"]],
                                                                         ps["done"]))
        if any(w["state"] not in ("running", "idle") for w in ps["workers"]):
            fail("a worker is neither running nor idle: %s" % ps["workers"])
        held = sum(p["bytes_held"] for p in ps["ps"])
        # Adam's slots exist on a shard once it took its first update: a moment after the start,
        # every shard has them. Plus Adam's step count (one int64, no slots).
        expected = 3 * 4 * WEIGHTS
        wait_for("both ps tasks to hold the weights with Adam's slots",
                 lambda: expected <= sum(p["bytes_held"] for p in ps_state()["ps_cluster"]["ps"]) <= expected + 64,
                 10, out)
        # Each worker's throughput in samples: above 0 and in line with its closures (64 samples each).
        def sampling(s):
            ws = s["ps_cluster"]["workers"]
            return s if all(w.get("samples_per_s") and w["samples_per_s"] > 0 and w["closures_per_s"] > 0
                            for w in ws) else None
        state = wait_for("every worker's samples/s above 0", lambda: sampling(ps_state()), 10, out)
        for w in state["ps_cluster"]["workers"]:
            if not 0.5 * 64 * w["closures_per_s"] <= w["samples_per_s"] <= 2 * 64 * w["closures_per_s"]:
                fail("worker %d: %.0f samples/s against %.1f closures/s of 64 samples" % (
                    w["worker"], w["samples_per_s"], w["closures_per_s"]))
            if w["samples"] % 64 != 0 or w["state"] not in ("running", "idle"):
                fail("worker %d: %d samples (not whole batches of 64), state %s" % (w["worker"], w["samples"], w["state"]))
        if sum(w["samples"] for w in state["ps_cluster"]["workers"]) > 64 * state["ps_cluster"]["done"]:
            fail("the workers' samples %s exceed 64 x the %d closures done" % (
                [w["samples"] for w in state["ps_cluster"]["workers"]], state["ps_cluster"]["done"]))

        # fit's samples/s, step by step: level, with no spike from results taken in a burst.
        wait_for("60 steps", lambda: ps_state()["step"] >= 60, 20, out)
        status, history = request(base, "/api/history")
        rates = [e["samples_per_s"] for e in history.get("events", []) if e.get("samples_per_s")][5:]
        if status != 200 or len(rates) < 20:
            fail("GET /api/history answered %d with %d samples/s points" % (status, len(rates)))
        median = sorted(rates)[len(rates) // 2]
        if max(rates) > 4 * median:
            fail("fit's samples/s spikes to %.0f, %.1fx its median %.0f: %s" % (
                max(rates), max(rates) / median, median, [round(r) for r in rates]))
        print("fit: %.0f samples/s (median of %d steps, the highest %.2fx it); per worker %s" % (
            median, len(rates), max(rates) / median, [round(w["samples_per_s"]) for w in state["ps_cluster"]["workers"]]),
            flush=True)

        status, direct = request(base, "/api/ps_cluster")
        if status != 200 or [w["task"] for w in direct["workers"]] != [w["task"] for w in ps["workers"]]:
            fail("GET /api/ps_cluster answered %d %s" % (status, direct))
        print("cluster: %.0f closures/s, queue %d, in flight %d; ps tasks hold %d bytes, %s updates/s" % (
            ps["closures_per_s"], ps["queued"], ps["in_flight"], held,
            [round(p["updates_per_s"]) for p in ps["ps"]]), flush=True)

        # The ps tasks' updates, reported after a moment, cover every step done before it.
        t0 = time.monotonic()
        done0 = ps_state()["ps_cluster"]["done"]

        def reported_after(s, t):
            ages = [p["report_age_ms"] for p in s["ps_cluster"]["ps"]]
            return s if all(a is not None and time.monotonic() - a / 1000.0 > t + 0.05 for a in ages) else None
        later = wait_for("reports from both ps tasks", lambda: reported_after(ps_state(), t0), 5, out)
        updates = sum(p["updates"] for p in later["ps_cluster"]["ps"])
        if updates < SHARD_UPDATES_PER_STEP * done0:
            fail("the ps tasks applied %d updates after %d closures of one step (expected at least %d)"
                 % (updates, done0, SHARD_UPDATES_PER_STEP * done0))

        # Pause: at a closure boundary, with nothing in flight.
        if request(base, "/api/pause", "POST")[0] != 200:
            fail("POST /api/pause was refused")
        paused_at = int(wait_for("the chief to pause",
                                 lambda: (re.findall(r"\[rank 0\] paused after step (\d+)", out()) or [None])[0], 15, out))
        state = wait_for("the state to show the pause", lambda: (lambda s: s if s["paused"] else None)(ps_state()), 5, out)
        ps = state["ps_cluster"]
        if state["step"] != paused_at:
            fail("paused after step %d, the state says step %d" % (paused_at, state["step"]))
        if ps["queued"] != 0 or ps["in_flight"] != 0 or any(w["state"] != "idle" for w in ps["workers"]):
            fail("paused, but the cluster still has closures: %s" % ps)
        if ps["done"] != paused_at:
            fail("paused after step %d (one step per closure) with %d closures done: a closure in flight was not "
                 "taken before the pause" % (paused_at, ps["done"]))
        # For a second, neither the step, the closures nor the ps tasks' updates move (each count
        # as a ps task reported it after the pause was in place, then a second later).
        t_paused = time.monotonic()
        before = wait_for("a ps report after the pause", lambda: reported_after(ps_state(), t_paused), 5, out)
        updates_paused = sum(p["updates"] for p in before["ps_cluster"]["ps"])
        time.sleep(1.0)
        t_later = time.monotonic()
        after = wait_for("a ps report a second into the pause", lambda: reported_after(ps_state(), t_later), 5, out)
        if after["step"] != paused_at or after["ps_cluster"]["done"] != paused_at:
            fail("the step or the closures moved while paused: %s" % after["ps_cluster"])
        if sum(p["updates"] for p in after["ps_cluster"]["ps"]) != updates_paused:
            fail("the ps tasks took updates while paused: %d, then %d"
                 % (updates_paused, sum(p["updates"] for p in after["ps_cluster"]["ps"])))

        # A learning rate while paused, from the next step.
        request(base, "/api/learning_rate?value=0.0007", "POST")
        wait_for("the learning rate from step %d" % (paused_at + 1),
                 lambda: re.search(r"\[rank 0\] learning rate 0\.0007 from step %d\b" % (paused_at + 1), out()), 10, out)
        request(base, "/api/resume", "POST")
        wait_for("steps after resume", lambda: ps_state()["step"] > paused_at + 10, 15, out)
        if abs(ps_state()["learning_rate"] - 0.0007) > 1e-9:
            fail("the state does not show learning rate 0.0007 after resume")

        # A checkpoint from the dashboard: saved at a closure boundary, training going on after it.
        if request(base, "/api/checkpoint", "POST")[0] != 200:
            fail("POST /api/checkpoint was refused")
        saved_at = int(wait_for("the chief to save the checkpoint",
                                lambda: (re.findall(r"\[rank 0\] checkpoint requested at step (\d+)", out()) or [None])[0],
                                15, out))
        wait_for("the sharded checkpoint ckpt-%d" % saved_at,
                 lambda: os.path.isdir(os.path.join(ckpt, "ckpt-%d" % saved_at)), 10, out)
        wait_for("steps after the checkpoint", lambda: ps_state()["step"] > saved_at + 5, 15, out)

        # Worker 1 stopped: lost, its closures retried; continued: back.
        stopped_pid = harness.task_pid(token, "worker", 1, exe="ps_trainer")
        if stopped_pid is None:
            fail("cannot find worker 1's process")
        step_before = ps_state()["step"]
        os.kill(stopped_pid, signal.SIGSTOP)
        lost = wait_for("a worker_lost event for worker 1", lambda: (lambda s: s if any(
            e["kind"] == "worker_lost" and e["worker"] == 1 for e in s["ps_cluster"]["events"]) else None)(ps_state()),
            10, out)
        ps = lost["ps_cluster"]
        event = next(e for e in ps["events"] if e["kind"] == "worker_lost")
        if event["step"] is None or event["step"] < step_before or "/job:worker/replica:0/task:1" not in event["text"]:
            fail("the worker_lost event: %s (the chief was at step %d before)" % (event, step_before))
        if ps["workers"][1]["state"] != "lost" or ps["workers_lost"] < 1 or ps["workers"][1]["times_lost"] < 1:
            fail("worker 1 lost, but ps_cluster says %s" % ps)
        retried = sum(e["count"] for e in ps["events"] if e["kind"] == "closures_retried")
        if retried != ps["retried"]:
            fail("the closures_retried events count %d closures, ps_cluster.retried says %d" % (retried, ps["retried"]))
        os.kill(stopped_pid, signal.SIGCONT)
        stopped_pid = None
        back = wait_for("worker 1 back", lambda: (lambda s: s if any(
            e["kind"] == "worker_back" and e["worker"] == 1 for e in s["ps_cluster"]["events"]) else None)(ps_state()),
            10, out)
        done1 = back["ps_cluster"]["workers"][1]["closures_done"]
        wait_for("worker 1 running closures again",
                 lambda: ps_state()["ps_cluster"]["workers"][1]["closures_done"] > done1 + 5, 15, out)
        print("worker 1 lost at step %d (%d closure(s) retried), then back" % (event["step"], ps["retried"]),
              flush=True)

        # Stop with a checkpoint, at a closure boundary.
        if request(base, "/api/stop", "POST")[0] != 200:
            fail("POST /api/stop was refused")
        rc = cluster.wait("the cluster after stop")
        text = out()
        if rc != 0:
            fail("troupe-launch exited %d after stop" % rc, text)
        stopped = re.findall(r"\[rank 0\] stopped after step (\d+)", text)
        if len(stopped) != 1:
            fail("the chief's stop lines: %s" % stopped, text)
        stop_step = int(stopped[0])
        if "[rank 0] ps_trainer: stopped from the dashboard after step %d" % stop_step not in text:
            fail("the chief did not say it stopped from the dashboard after step %d" % stop_step, text)
        if not os.path.isdir(os.path.join(ckpt, "ckpt-%d" % stop_step)):
            fail("no checkpoint of step %d in %s: %s" % (stop_step, ckpt, os.listdir(ckpt)), text)
        chief = [line for line in text.splitlines() if line.startswith("[rank 0] ")]
        if not chief or not re.match(r"\[rank 0\] result: closures=\d+ done=\d+ .* step=%d$" % stop_step, chief[-1]):
            fail("the chief's last line is %r, expected its result line with step=%d" % (chief[-1:], stop_step), text)
        print("PASSED: paused after step %d with nothing in flight, learning rate from step %d, worker 1 lost and "
              "back, stopped after step %d with checkpoint ckpt-%d" % (paused_at, paused_at + 1, stop_step, stop_step),
              flush=True)
        return 0
    finally:
        harness.resume(stopped_pid)
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
