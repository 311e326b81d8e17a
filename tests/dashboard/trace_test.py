#!/usr/bin/python3
"""mlp_classifier --trace: the Chrome trace of steps 3..12 on 2 replicas.

- it is written as soon as step 12 ends (before the first epoch, 32 steps, is over);
- it parses as JSON ({"traceEvents": [...]}, what Perfetto and chrome://tracing open);
- every step 3..12 has a step span and a span on each replica's track;
- every all-reduce event has a duration, a replica (0 or 1), its bytes and a sequence number that
  grows along each replica's track.

Usage: trace_test.py MLP_CLASSIFIER
"""
import json
import os
import subprocess
import sys
import tempfile


def fail(why, out=""):
    print("FAILED: " + why + ("\n--- output\n" + out[-3000:] if out else ""), flush=True)
    sys.exit(1)


def main():
    with tempfile.TemporaryDirectory(prefix="troupe-trace-") as work:
        path = os.path.join(work, "trace.json")
        r = subprocess.run([sys.argv[1], "--epochs", "1", "--samples", "4096", "--batch", "128", "--replicas", "2",
                            "--trace", path, "--trace-steps", "3:12"],
                           capture_output=True, text=True, timeout=60)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            fail("mlp_classifier exited %d" % r.returncode, out)
        written = out.find("trace of steps 3..12 written to " + path)
        epoch = out.find("Epoch 1/1")
        if written < 0 or epoch < 0 or written > epoch:
            fail("the trace was not reported written before the epoch ended", out)
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        steps = sorted(e["args"]["step"] for e in events if e.get("name") == "step")
        if steps != list(range(3, 13)):
            fail("step spans for steps %s, expected 3..12" % steps)
        for tid in (1, 2):
            spans = sorted(e["args"]["step"] for e in events if e.get("name") == "replica step" and e["tid"] == tid)
            if spans != list(range(3, 13)):
                fail("replica track %d has spans for steps %s, expected 3..12" % (tid, spans))
        reduces = [e for e in events if e.get("name") == "all_reduce"]
        if len(reduces) < 20:
            fail("%d all-reduce events, expected at least one per replica per step (20)" % len(reduces))
        for e in reduces:
            a = e.get("args", {})
            if e.get("ph") != "X" or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                fail("an all-reduce without a duration: %s" % e)
            if a.get("replica") not in (0, 1) or not a.get("bytes", 0) > 0 or "sequence" not in a:
                fail("an all-reduce without its replica, bytes or sequence number: %s" % e)
        for replica in (0, 1):
            seq = [e["args"]["sequence"] for e in sorted(reduces, key=lambda e: e["ts"]) if e["args"]["replica"] == replica]
            if seq != sorted(seq) or len(set(seq)) != len(seq):
                fail("replica %d's all-reduce sequence numbers do not grow: %s" % (replica, seq))
        print("PASSED: %d events, %d all-reduces over steps 3..12" % (len(events), len(reduces)), flush=True)


if __name__ == "__main__":
    main()
