#!/usr/bin/python3
"""The dashboard's cluster view of an elastic cluster: multi_worker_trainer --elastic on 3 workers
under troupe-launch --elastic --min 2 --max-restarts 1, the chief serving. Worker 2 is killed
(SIGKILL); the others go on without it, and the launcher's replacement joins. Then GET /api/state:

- cluster.members lists 4 workers by id: 0 and 1 alive in ring ranks 0 and 1, id 2 (task 2, the
  killed one) lost and out of the ring, id 3 (task 2 again, the replacement) alive, heard, in ring
  rank 2;
- cluster.changes holds both changes in order: task 2 left (2 workers, generation 1, ring [0, 1]),
  then task 2 joined (3 workers, generation 2, ring [0, 1, 3], the state's bytes), each with its
  step (the second not before the first) and its pause;
- the worker rows are ring ranks 0..2 with ids 0, 1 and 3, the last with task 2's name;
- the failures list has the loss, the join (worker 3) and both changes as events;
- GET /api/flight_recorder has one "membership" entry per change, labelled elastic:worker_left and
  elastic:admission, both done;
and the run ends with status 0.

Usage: mw_elastic_test.py TROUPE_LAUNCH MULTI_WORKER_TRAINER
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_run  # noqa: E402

DEADLINE = time.monotonic() + 150
TASK2 = "/job:worker/replica:0/task:2"
log_path = None


def out():
    with open(log_path) as f:
        return f.read()


def fail(why):
    print("FAILED: " + why, flush=True)
    if log_path:
        print("--- output\n" + out()[-6000:], flush=True)
    raise SystemExit(1)


def wait_for(what, predicate, timeout):
    return cluster_run.wait_for(what, predicate, timeout, DEADLINE, fail)


def request(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        fail("the chief's dashboard does not answer GET %s: %s" % (path, e))


def check(condition, why):
    if not condition:
        fail(why)


def main():
    global log_path
    launch, trainer = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-mw-elastic-")
    log_path = os.path.join(work, "run.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([launch, "-n", "3", "--elastic", "--min", "2", "--max-restarts", "1", "--timeout", "120",
                                 "--", trainer, "--elastic", "--epochs", "8", "--batch", "192", "--step-delay-ms", "50",
                                 "--dashboard-port", "0"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = wait_for("the chief's dashboard URL",
                        lambda: (re.search(r"\[rank 0\] dashboard: (http://[0-9.:]+)/", out()) or [None, None])[1], 30)
        pid2 = wait_for("worker 2's pid",
                        lambda: (re.search(r"^\[rank 2\] worker 2 of 3 workers \(pid ([0-9]+)\)", out(), re.M) or
                                 [None, None])[1], 30)
        state = lambda: request(base, "/api/state")
        wait_for("a few steps", lambda: state()["step"] > 5, 30)
        s = state()
        check([m["id"] for m in s["cluster"]["members"]] == [0, 1, 2] and
              all(m["state"] == "alive" for m in s["cluster"]["members"]),
              "before the kill the members are %s, expected ids 0, 1, 2 alive" % s["cluster"]["members"])
        check(s["cluster"]["changes"] == [], "changes before any: %s" % s["cluster"]["changes"])

        os.kill(int(pid2), signal.SIGKILL)
        wait_for("both changes on the chief's dashboard", lambda: len(state()["cluster"]["changes"]) >= 2, 60)
        s = state()
        recorder = request(base, "/api/flight_recorder")
        c = s["cluster"]

        members = {m["id"]: m for m in c["members"]}
        check(sorted(members) == [0, 1, 2, 3], "the members' ids are %s, expected 0..3" % sorted(members))
        for i in (0, 1):
            check(members[i]["state"] == "alive" and members[i]["ring_rank"] == i,
                  "member %d is %s, expected alive in ring rank %d" % (i, members[i], i))
        check(members[2]["task"] == TASK2 and members[2]["state"] == "lost" and members[2]["ring_rank"] is None,
              "member 2 is %s, expected %s lost and out of the ring" % (members[2], TASK2))
        check(members[3]["task"] == TASK2 and members[3]["state"] == "alive" and members[3]["ring_rank"] == 2,
              "member 3 is %s, expected the replacement %s alive in ring rank 2" % (members[3], TASK2))
        wait_for("a heartbeat from the replacement",
                 lambda: [m for m in state()["cluster"]["members"] if m["id"] == 3][0]["heard"], 20)

        left, joined = c["changes"][0], c["changes"][1]
        check(left["left"] == [TASK2] and left["joined"] == [] and left["workers"] == 2 and left["generation"] == 1 and
              left["ring"] == [0, 1] and left["step"] >= 0 and left["paused_ms"] >= 0,
              "the first change is %s, expected task 2 left, 2 workers, generation 1, ring [0, 1]" % left)
        check(joined["joined"] == [TASK2] and joined["left"] == [] and joined["workers"] == 3 and
              joined["generation"] == 2 and joined["ring"] == [0, 1, 3] and joined["state_bytes"] > 0 and
              joined["step"] >= left["step"] and joined["paused_ms"] >= 0,
              "the second change is %s, expected task 2 joined, 3 workers, generation 2, ring [0, 1, 3]" % joined)
        # The printed lines agree on the steps.
        check(re.search(r"^\[rank 0\] troupe: warning: elastic membership: %s left; 2 workers continue from step %d "
                        r"as ring generation 1 \(paused %d ms\)$" % (TASK2, left["step"], left["paused_ms"]), out(), re.M),
              "the chief's line on the loss does not name step %d and %d ms" % (left["step"], left["paused_ms"]))

        rows = s["workers"]
        check([r["worker"] for r in rows] == [0, 1, 2] and [r["id"] for r in rows] == [0, 1, 3],
              "the worker rows are %s, expected ring ranks 0..2 with ids 0, 1, 3" % [(r["worker"], r["id"]) for r in rows])
        check(rows[2]["task"] == TASK2, "ring rank 2's row names %r, expected %s" % (rows[2].get("task"), TASK2))

        kinds = [(f["kind"], f["worker"]) for f in s["failures"]]
        for want in [("worker_lost", 2), ("worker_joined", 3), ("membership_changed", None)]:
            check(want in kinds, "the failures list lacks %s: %s" % (want, kinds))
        check(sum(1 for k, _ in kinds if k == "membership_changed") == 2,
              "the failures list has %d membership_changed events, expected 2" %
              sum(1 for k, _ in kinds if k == "membership_changed"))

        changes = [e for e in recorder["entries"] if e["op"] == "membership"]
        check([(e["label"], e["state"]) for e in changes] == [("elastic:worker_left", "done"),
                                                              ("elastic:admission", "done")],
              "the flight recorder's membership entries are %s" % changes)
        check(changes[0]["participants"] == 3 and changes[1]["participants"] == 2,
              "the membership entries' participants are %s, expected 3 then 2 (the workers before each)" %
              [e["participants"] for e in changes])

        try:
            rc = proc.wait(timeout=max(1, DEADLINE - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail("the run did not end in time")
        check(rc == 0, "troupe-launch exited %d" % rc)
        print("PASSED: task 2 lost and a replacement joined as worker 3; the chief's dashboard shows both changes "
              "(paused %d and %d ms), the members and the flight recorder's entries" %
              (left["paused_ms"], joined["paused_ms"]), flush=True)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
