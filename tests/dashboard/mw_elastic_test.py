#!/usr/bin/python3
"""The dashboard's cluster view of an elastic cluster: multi_worker_trainer --elastic on 3 workers
under troupe-launch --elastic --min 2 --max 4 --max-restarts 1, the chief serving. Worker 2 is
killed (SIGKILL); the others go on without it, and the launcher's replacement joins. Then GET
/api/state:

- cluster.members lists 4 workers by id: 0 and 1 alive in ring ranks 0 and 1, id 2 (task 2, the
  killed one) lost and out of the ring, id 3 (task 2 again, the replacement) alive, heard, in ring
  rank 2;
- cluster.changes holds both changes in order: task 2 left (2 workers, generation 1, ring [0, 1]),
  then task 2 joined (3 workers, generation 2, ring [0, 1, 3], the state's bytes), each with its
  step (the second not before the first) and its pause;
- the worker rows are ring ranks 0..2 with ids 0, 1 and 3, the last with task 2's name;
- the failures list has the loss, the join (worker 3) and both changes as events;
- GET /api/flight_recorder has one "membership" entry per change, labelled elastic:worker_left and
  elastic:admission, both done.

Then a fourth worker (task 3, started by the test with TROUPE_JOIN=1) joins, beyond the size at
the start: its row is ring rank 3 with id 4 and task 3's name, with its step and its replica
(3 of replicas_in_sync 4), and the steps the chief publishes after it carry 4 workers' parts. The
run and the fourth worker end with status 0 and one weights digest.

Usage: mw_elastic_test.py TROUPE_LAUNCH MULTI_WORKER_TRAINER
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

TASK2 = "/job:worker/replica:0/task:2"
TASK3 = "/job:worker/replica:0/task:3"
TRAINER_ARGS = ["--elastic", "--epochs", "12", "--batch", "192", "--step-delay-ms", "50"]


def free_ports(n):
    """P with P..P+n-1 free on loopback (the launcher's workers and a joiner's address)."""
    for _ in range(200):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p + i))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d free consecutive ports on 127.0.0.1" % n)


def main():
    launch, trainer = sys.argv[1], sys.argv[2]
    harness.set_deadline(170)
    work = tempfile.mkdtemp(prefix="troupe-mw-elastic-")
    token = secrets.token_hex(16)
    base_port = free_ports(4)
    env = dict(os.environ, TROUPE_CLUSTER_TOKEN=token)
    run = harness.Started(work, "run", [launch, "-n", "3", "--port-base", str(base_port), "--elastic", "--min", "2",
                                        "--max", "4", "--max-restarts", "1", "--timeout", "150", "--", trainer,
                                        *TRAINER_ARGS, "--dashboard-port", "0"], env=env)
    procs = [run]

    def fail(why):
        harness.fail(why, run.out())

    def check(condition, why):
        if not condition:
            fail(why)

    def wait_for(what, predicate, timeout):
        return harness.wait_for(what, predicate, timeout, run.out)

    def get(base, path):
        status, body = harness.request(base, path)
        check(status == 200, "GET %s answered %d: %s" % (path, status, body))
        return body

    try:
        base = harness.base_of(run.dashboard_url(30, rank=0))
        pid2 = wait_for("worker 2's pid",
                        lambda: (re.search(r"^\[rank 2\] worker 2 of 3 workers \(pid ([0-9]+)\)", run.out(), re.M) or
                                 [None, None])[1], 30)
        state = lambda: get(base, "/api/state")
        wait_for("a few steps", lambda: state()["step"] > 5, 30)
        s = state()
        check([m["id"] for m in s["cluster"]["members"]] == [0, 1, 2] and
              all(m["state"] == "alive" for m in s["cluster"]["members"]),
              "before the kill the members are %s, expected ids 0, 1, 2 alive" % s["cluster"]["members"])
        check(s["cluster"]["changes"] == [], "changes before any: %s" % s["cluster"]["changes"])

        os.kill(int(pid2), signal.SIGKILL)
        wait_for("both changes on the chief's dashboard", lambda: len(state()["cluster"]["changes"]) >= 2, 60)
        s = state()
        recorder = get(base, "/api/flight_recorder")
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
                        r"as ring generation 1 \(paused %d ms\)$" % (TASK2, left["step"], left["paused_ms"]),
                        run.out(), re.M),
              "the chief's line on the loss does not name step %d and %d ms" % (left["step"], left["paused_ms"]))

        # The rows follow the members from the chief's first step boundary after the join.
        rows = wait_for("a step after the join", lambda: (lambda x: x if x["step"] > joined["step"] + 1 else None)(state()),
                        30)["workers"]
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

        # A fourth worker joins, beyond the 3 of the start (max_workers 4).
        cluster = ["127.0.0.1:%d" % (base_port + i) for i in range(4)]
        tf_config = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": 3}})
        fourth = harness.Started(work, "fourth", [trainer, *TRAINER_ARGS],
                                 env=dict(env, TF_CONFIG=tf_config, TROUPE_ELASTIC="1", TROUPE_JOIN="1"))
        procs.append(fourth)
        wait_for("the fourth worker's join on the chief's dashboard", lambda: len(state()["cluster"]["changes"]) >= 3,
                 60)
        grown = state()["cluster"]["changes"][2]
        check(grown["joined"] == [TASK3] and grown["workers"] == 4 and grown["ring"] == [0, 1, 3, 4],
              "the third change is %s, expected task 3 joined, 4 workers, ring [0, 1, 3, 4]" % grown)
        # The rows and the step's parts follow from the first step after the join.
        s = wait_for("a step after the fourth worker's join",
                     lambda: (lambda x: x if x["step"] > grown["step"] + 1 else None)(state()), 30)
        rows = s["workers"]
        check([(r["worker"], r["id"]) for r in rows] == [(0, 0), (1, 1), (2, 3), (3, 4)],
              "the worker rows are %s, expected ring ranks 0..3 with ids 0, 1, 3, 4" %
              [(r["worker"], r["id"]) for r in rows])
        check(rows[3]["task"] == TASK3 and rows[3]["replicas"] == [3] and rows[3].get("step", -1) > grown["step"],
              "ring rank 3's row is %s, expected %s with replica 3 and a step after %d" % (rows[3], TASK3, grown["step"]))
        check(s["replicas_in_sync"] == 4, "replicas_in_sync is %s after the join, expected 4" % s["replicas_in_sync"])
        after = wait_for("a step after the fourth worker's join in the history",
                         lambda: [e for e in get(base, "/api/history")["events"] if e["step"] > grown["step"] + 1], 20)
        check(all(len(e["workers"]) == 4 and len(e["replica_loss"]) == 4 for e in after),
              "steps after the join carry %s workers' parts and %s replica losses, expected 4 each" %
              (sorted({len(e["workers"]) for e in after}), sorted({len(e["replica_loss"]) for e in after})))
        check(any(e["workers"][3]["compute_ms"] and e["workers"][3]["compute_ms"] > 0 for e in after),
              "no step after the join has the fourth worker's compute time: %s" % [e["workers"][3] for e in after])

        rc = run.wait("the run")
        check(rc == 0, "troupe-launch exited %d" % rc)
        rc4 = fourth.wait("the fourth worker")
        check(rc4 == 0, "the fourth worker exited %d:\n%s" % (rc4, fourth.out()[-3000:]))
        digests = set(re.findall(r"weights_digest=([0-9a-f]+)", run.out() + fourth.out()))
        check(len(digests) == 1, "the workers ended with weights %s, expected one digest" % digests)
        print("PASSED: task 2 lost and a replacement joined as worker 3, then task 3 joined as worker 4 beyond the "
              "start's 3; the chief's dashboard shows the changes (paused %d, %d and %d ms), the members, a row and "
              "step parts for each of the 4 workers, and the flight recorder's entries" %
              (left["paused_ms"], joined["paused_ms"], grown["paused_ms"]), flush=True)
    finally:
        harness.kill_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
