#!/usr/bin/env python3
"""Checks the rows multi_worker_trainer --record-examples DIR recorded: every example of every
epoch trained on once, none twice, across changes of membership.

Usage: examples_exactly_once.py DIR SAMPLES STEPS_PER_EPOCH EPOCHS [--across C1,C2]... [--no-rollback]

Each DIR/worker-TASK-PID.txt holds one line per training call of a replica of that process:
  step=S changes=C ids=I,J,...
written as the replica computes (a worker killed mid-step has recorded that step). A step that a
change rolled back runs again after it, with a higher C: for each step, the lines with its
highest C are the rows that went into the weights; the others do not count. The global batch
divides SAMPLES (STEPS_PER_EPOCH x global batch = SAMPLES), so each epoch is one pass over a
shuffle of the set, and every id 0..SAMPLES-1 must be kept exactly once per epoch.
--across C1,C2: some epoch's kept lines include lines of C1 and of C2 changes (the epoch went on
across a change). --no-rollback: no step ran twice (a change that rolls back runs the steps after
its commit again; a leave at a step boundary runs none twice). Exit 0 and one summary line, or 1
naming the first thing wrong.
"""
import collections
import glob
import os
import re
import sys

LINE = re.compile(r"^step=(\d+) changes=(\d+) ids=([-0-9,]*)$")


def fail(message):
    print("exactly-once: " + message)
    sys.exit(1)


def main(argv):
    if len(argv) < 5:
        fail("usage: examples_exactly_once.py DIR SAMPLES STEPS_PER_EPOCH EPOCHS [--across C1,C2]... [--no-rollback]")
    folder, samples, steps_per_epoch, epochs = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    across = []
    no_rollback = False
    rest = argv[5:]
    while rest:
        if rest[0] == "--no-rollback":
            no_rollback = True
            rest = rest[1:]
            continue
        if rest[0] != "--across" or len(rest) < 2:
            fail("unexpected argument " + rest[0])
        across.append(tuple(int(c) for c in rest[1].split(",")))
        rest = rest[2:]

    by_step = collections.defaultdict(list)  # step -> [(changes, file, ids)]
    files = sorted(glob.glob(os.path.join(folder, "worker-*.txt")))
    if not files:
        fail("no worker-*.txt in " + folder)
    for path in files:
        name = os.path.basename(path)
        with open(path) as f:
            for number, text in enumerate(f, 1):
                m = LINE.match(text.rstrip("\n"))
                if not m:
                    # A process killed while writing may leave its last line cut short.
                    if number == sum(1 for _ in open(path)) and not text.endswith("\n"):
                        continue
                    fail("%s:%d: not a record: %r" % (name, number, text))
                ids = [int(i) for i in m.group(3).split(",")] if m.group(3) else []
                if any(i < 0 or i >= samples for i in ids):
                    fail("%s:%d: a row that is not in the set (id %s)" % (name, number, ids))
                by_step[int(m.group(1))].append((int(m.group(2)), name, ids))

    last = steps_per_epoch * epochs
    extra = sorted(s for s in by_step if s < 1 or s > last)
    if extra:
        fail("steps recorded outside 1..%d: %s" % (last, extra[:5]))
    rolled_back = 0
    spans = []
    for epoch in range(epochs):
        seen = collections.defaultdict(list)  # id -> [(step, file)]
        changes_in_epoch = set()
        for step in range(epoch * steps_per_epoch + 1, (epoch + 1) * steps_per_epoch + 1):
            records = by_step.get(step)
            if not records:
                fail("step %d (epoch %d): no worker recorded it" % (step, epoch + 1))
            kept = max(c for c, _, _ in records)
            changes_in_epoch.add(kept)
            for c, name, ids in records:
                if c != kept:
                    if no_rollback:
                        fail("step %d ran twice (by %s with %d changes, and again with %d): a rollback" %
                             (step, name, c, kept))
                    rolled_back += 1
                    continue
                for i in ids:
                    seen[i].append((step, name))
        twice = sorted(i for i, where in seen.items() if len(where) > 1)
        if twice:
            i = twice[0]
            fail("epoch %d: %d examples trained on more than once, e.g. id %d at %s" %
                 (epoch + 1, len(twice), i, ", ".join("step %d by %s" % w for w in seen[i])))
        missing = [i for i in range(samples) if i not in seen]
        if missing:
            fail("epoch %d: %d examples never trained on in the steps kept, e.g. ids %s" %
                 (epoch + 1, len(missing), missing[:5]))
        spans.append(changes_in_epoch)
    for pair in across:
        if not any(set(pair) <= s for s in spans):
            fail("no epoch went on across changes %s (the changes seen per epoch: %s)" %
                 (",".join(map(str, pair)), [sorted(s) for s in spans]))
    print("exactly-once: %d epochs of %d examples, each trained on once in the steps kept, from %d files; "
          "%d records of rolled-back steps not counted; changes per epoch %s" %
          (epochs, samples, len(files), rolled_back, [sorted(s) for s in spans]))


if __name__ == "__main__":
    main(sys.argv)
