#!/usr/bin/python3
"""The dashboard's cluster view under MultiWorkerMirroredStrategy: multi_worker_trainer on 2
workers (troupe-launch, a known cluster token, heartbeats every second), the chief serving.

- while healthy, GET /api/state gives every worker a heartbeat age, as the chief's control plane
  received the beats, below 2 beat intervals, and the state "alive";
- a stranger that connects to the chief's control port over TLS with a certificate of another
  token shows up in "failures" as a refused connection with its own address, and training goes on;
- a SIGSTOPped worker turns "late" (or "lost"), with a "worker_late" event at the step the chief
  was at (between the step before the stop and the step it waits at), while the chief stays
  alive; after SIGCONT it is "alive" again, with a "worker_back" event, and training goes on;
- the failures list is newest first; POST /api/stop is 409 (no checkpoint directory);
  POST /api/stop?checkpoint=0 ends both workers with status 0.

Usage: mw_cluster_test.py TROUPE_LAUNCH MULTI_WORKER_TRAINER
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_run  # noqa: E402
import harness  # noqa: E402  (what the dashboard tests share: waits, the JSON API, the dashboard URL)

harness.set_deadline(100)  # the whole test; every wait is bounded by it
INTERVAL = cluster_run.HEARTBEAT_MS
cluster = None


def fail(why):
    """harness.fail, with the cluster's output once it runs."""
    harness.fail(why, cluster.out()[-4000:] if cluster else None)


def wait_for(what, predicate, timeout):
    return harness.wait_for(what, predicate, timeout, lambda: cluster.out()[-4000:] if cluster else None)


def request(base, path, method="GET"):
    """harness.request; a dashboard that does not answer fails the test, saying so."""
    try:
        return harness.request(base, path, method)
    except (urllib.error.URLError, OSError) as e:
        fail("the chief's dashboard does not answer %s %s: %s" % (method, path, e))


def main():
    global cluster
    launch, trainer = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-mw-cluster-")
    os.environ["TROUPE_STALL_WARNING_S"] = "1"  # the stopped worker below is a stall after 1 s
    try:
        cluster = cluster_run.Cluster(launch, trainer, work)
        base = harness.base_of(cluster.dashboard_url(30, rank=0))
        state = lambda: request(base, "/api/state")[1]
        wait_for("a few steps", lambda: state()["step"] > 5, 30)

        # Healthy: every worker has a heartbeat age below 2 intervals, and is alive.
        s = state()
        if not s["cluster"]["watching"] or s["cluster"]["heartbeat_interval_ms"] != INTERVAL:
            fail("the state's cluster section is %s, expected watching with interval %d" % (s["cluster"], INTERVAL))
        if s["cluster"]["stall"] != "":
            fail("the cluster reports a stall while healthy: %r" % s["cluster"]["stall"])
        if s["cluster"]["restart_count"] != 0:
            fail("the cluster's restart count is %r in its first start" % s["cluster"]["restart_count"])
        if len(s["cluster"]["incarnation"]) != 32:
            fail("the cluster's incarnation is %r, expected 32 hex digits" % s["cluster"]["incarnation"])
        samples = []
        for _ in range(8):
            s = state()
            for w in s["workers"]:
                age = w.get("heartbeat_age_ms")
                if not isinstance(age, (int, float)) or w.get("state") != "alive":
                    fail("healthy worker %d: heartbeat_age_ms %r, state %r (expected a number, alive)"
                         % (w["worker"], age, w.get("state")))
                if not 0 <= age < 2 * INTERVAL:
                    fail("healthy worker %d: heartbeat age %.0f ms, expected below 2 intervals (%d ms)"
                         % (w["worker"], age, 2 * INTERVAL))
                samples.append(age)
            time.sleep(0.25)
        tasks = [w.get("task") for w in s["workers"]]
        if tasks != ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]:
            fail("the workers' tasks are %s" % tasks)
        print("healthy: %d heartbeat ages, at most %.0f ms" % (len(samples), max(samples)), flush=True)

        # A stranger with the wrong token knocks on the chief's control port: refused, with its address.
        def refused_row(address):
            return next((f for f in state()["failures"]
                         if f["kind"] == "connection_refused" and f["address"] == address), None)
        row = None
        for attempt in range(3):  # the gate logs and records refusals at powers of two: 1, 2, 4...
            address = cluster_run.stranger_knocks(work, cluster.port_base)
            end = time.monotonic() + 5
            while not row and time.monotonic() < end:
                row = refused_row(address)
                time.sleep(0.1)
            if row:
                break
        if not row:
            fail("no refused connection from the stranger %s in the failures: %s" % (address, state()["failures"]))
        if "TLS handshake" not in row["text"] or not isinstance(row["time_unix_ms"], int) or \
                abs(row["time_unix_ms"] / 1000 - time.time()) > 60:
            fail("the stranger's row is %s" % row)
        step = state()["step"]
        wait_for("steps after the stranger", lambda: state()["step"] > step + 3, 15)
        print("stranger %s refused: %s" % (address, row["text"]), flush=True)

        # A stopped worker is late (or lost), and back after SIGCONT.
        pid = cluster.worker_pid(1)
        if not pid:
            fail("cannot find worker 1's process")
        before_stop = state()["step"]
        os.kill(pid, signal.SIGSTOP)
        try:
            late = wait_for("worker 1 to show late or lost",
                            lambda: (lambda s: s if s["workers"][1]["state"] in ("late", "lost") else None)(state()),
                            4 * INTERVAL / 1000 + 10)
            w0, w1 = late["workers"]
            if w0["state"] != "alive" or w0["heartbeat_age_ms"] >= 2 * INTERVAL:
                fail("the chief is %s (heartbeat age %.0f ms) while worker 1 is stopped; expected alive"
                     % (w0["state"], w0["heartbeat_age_ms"]))
            if w1["heartbeat_age_ms"] <= 2 * INTERVAL:
                fail("worker 1 is %s with a heartbeat age of %.0f ms (expected more than %d)"
                     % (w1["state"], w1["heartbeat_age_ms"], 2 * INTERVAL))
            kinds = [(f["kind"], f["worker"]) for f in late["failures"]]
            if ("worker_late", 1) not in kinds:
                fail("no worker_late event for worker 1 in %s" % late["failures"])
            # The event carries the step the chief was at when it learnt of it (where the page
            # marks it): the chief waits for worker 1 at that step.
            event = next(f for f in late["failures"] if (f["kind"], f["worker"]) == ("worker_late", 1))
            if not isinstance(event.get("step"), int) or not before_stop <= event["step"] <= late["step"]:
                fail("worker 1's worker_late event is at step %r; the chief was at %d before the stop and at %d "
                     "while it waited" % (event.get("step"), before_stop, late["step"]))
            print("stopped worker 1: %s, heartbeat age %.0f ms" % (w1["state"], w1["heartbeat_age_ms"]), flush=True)
            # The chief waits for it in a collective: the stall inspector's line names it.
            stalled = wait_for("the stall line naming worker 1",
                               lambda: (lambda c: c if re.match(r"stall: step \d+ .*; worker 1 is silent: its last "
                                                                r"heartbeat, [0-9.]+ s ago, had it ", c) else None)(
                                   state()["cluster"]["stall"]), 10)
            print("stall line: %s" % stalled, flush=True)
        finally:
            os.kill(pid, signal.SIGCONT)
        back = wait_for("worker 1 to be alive again",
                        lambda: (lambda s: s if s["workers"][1]["state"] == "alive" else None)(state()), 10)
        events = [f for f in back["failures"] if f["kind"] not in ("stall", "stall_cleared")]
        if not events or (events[0]["kind"], events[0]["worker"]) != ("worker_back", 1):
            fail("the newest failure is not worker 1 coming back: %s" % events[:3])
        sequences = [f["sequence"] for f in events if "sequence" in f]
        if sequences != sorted(sequences, reverse=True):
            fail("the failures are not newest first: sequences %s" % sequences)
        times = [f["time_unix_ms"] for f in events]
        if times != sorted(times, reverse=True):
            fail("the failures' times are not newest first: %s" % times)
        step = back["step"]
        wait_for("steps after worker 1 came back", lambda: state()["step"] > step + 3, 20)
        cleared = wait_for("the stall to clear", lambda: (lambda s: s if s["cluster"]["stall"] == "" else None)(state()), 10)
        if not any(f["kind"] == "stall" for f in cleared["failures"]) or \
                not any(f["kind"] == "stall_cleared" for f in cleared["failures"]):
            fail("no stall and stall_cleared events in %s" % cleared["failures"][:6])
        print("worker 1 back: %s" % events[0]["text"], flush=True)

        # No --checkpoint-dir: a stop with a checkpoint is refused, a stop without one acts.
        status, body = request(base, "/api/stop", "POST")
        if status != 409 or "checkpoint=0" not in body.get("error", ""):
            fail("POST /api/stop without a checkpoint directory answered %d %s, expected 409" % (status, body))
        request(base, "/api/stop?checkpoint=0", "POST")
        rc = cluster.wait("the workers after stop")
        if rc != 0:
            fail("troupe-launch exited %d after stop" % rc)
        print("PASSED: heartbeat ages below %d ms while healthy, the stranger %s refused, worker 1 late then back"
              % (2 * INTERVAL, address), flush=True)
        return 0
    finally:
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
