#!/usr/bin/python3
"""pbt_search's dashboard in headless Chromium (harness.py's DevTools client): a chief and 2
workers on loopback (TF_CONFIG each), the chief serving the page, 4 trials searching for long.

1. the Actors card lists the 4 trials, "trial 0".."trial 3", of type pbt_trial, trial i on worker
   i % 2 (the chief places them round robin), running, each with a last reply and its accuracy,
   learning rate and momentum; every cell is what /api/actors says, and a generation's best
   accuracy on the card is the best the chief printed for that generation;
2. the card's chart draws one line per trial, with a point per generation;
3. by hand (the chief serves with a token): an actor command without the token is refused (401),
   one naming an actor that is not a row or an action not offered is 400 naming it, and the page
   shows the server's refusal on the card; trial 0's Stop and trial 1's Clone clicked: the chief
   prints both; trial 0's row says stopped and its step and accuracy stop where they were while
   later generations pass; "trial 4" is a new row on worker 0 (the one with the fewest trials
   running), its first learning rate and momentum each trial 1's of that generation times 0.8 or
   1.25 (as printed), and it trains in the generations after; both answers are listed on the card;
4. worker 1 SIGKILLed: trials 1 and 3 come back on worker 0, running, with 1 restart each, and the
   summary counts 2 down and 2 restarts; trial 2 and the clone keep their row, worker and no
   restart, trial 0 stays stopped; the screenshot (the card) is kept at SCREENSHOT;
5. Stop clicked on every trial still running: all stopped but the last, whose stop is refused,
   printed and shown on the card as a refusal, and which trains on;
6. Stop (no checkpoint) on the page ends the search: the chief exits 0 with the result line last,
   respawned=2, workers_lost=1, stopped_by_hand=4 and cloned_by_hand=1, and worker 0 exits 0.

Usage: pbt_browser_test.py PBT_SEARCH SCREENSHOT
Exit status: 0 passed, 1 failed.
"""
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the DevTools client)
from harness import fail, kill_all, open_page, request, save_screenshot, wait_for  # noqa: E402

harness.set_deadline(170)  # the whole test; every wait is bounded by it


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main():
    pbt, screenshot = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-pbt-browser-")
    procs = []
    try:
        w0, w1, chief_port = free_ports(3)
        cluster = {"chief": ["127.0.0.1:%d" % chief_port], "worker": ["127.0.0.1:%d" % w0, "127.0.0.1:%d" % w1]}
        args = [pbt, "--trials", "4", "--generations", "100000", "--steps", "10", "--step-delay-ms", "10"]
        token = "pbt" + os.urandom(8).hex()
        tasks = {}
        for name, kind, index, extra in (("w0", "worker", 0, []), ("w1", "worker", 1, []),
                                         ("chief", "chief", 0, ["--dashboard-port", "0", "--dashboard-token", token])):
            # A worker killed closes its connection: the chief hears it at once. Silence is given 10 s
            # (20 x 500 ms) before a host counts as lost, so that a loaded machine loses no worker
            # the test did not kill.
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}),
                       TROUPE_MISSED_HEARTBEATS="20")
            tasks[name] = harness.Started(work, name, args + extra, env=env, nice=True)
            procs.append(tasks[name])
        out = lambda name="chief": tasks[name].out()
        url = tasks["chief"].dashboard_url(60, what="the chief's dashboard URL")
        dt = open_page(work, url, procs)

        rows = lambda: dt.rows("actors")
        head = lambda: dt.eval("Array.from(document.querySelectorAll('#actors-head th')).map(c => c.textContent)")
        data = lambda: dt.eval("window.troupe.actors")

        def press(button):
            """A row's button, clicked as browser_test.py clicks a worker row's: by the element, since the
            cells beside it change width at every poll (a mouse at a position read before could miss)."""
            if not dt.eval("(() => { const b = document.getElementById(%s); if (!b || b.disabled) return false;"
                           " b.click(); return true; })()" % json.dumps(button)):
                fail("no enabled button #%s on the card: %s" % (button, rows()))

        # 1. Four trials, round robin over the workers, each with a reply and its numbers.
        def four_trials():
            r, a = rows(), data()
            if not r or len(r) != 4 or not a or any(x["step"] is None or x["last_reply_age_ms"] is None for x in a["actors"]):
                return None
            return r, a
        # Bounded by the deadline alone: the page's first rows wait for Chromium to come up, which
        # on a loaded machine took over 60 s (its renderer starved while the search ran on).
        seen = {}
        def four_trials_seen():
            seen["rows"] = rows()
            return four_trials()
        wait_for("four trials on the Actors card, each with a reply and its numbers", four_trials_seen, harness.time_left(),
                 lambda: "%s\n--- the card's rows last: %s" % (out()[-3000:], seen.get("rows")))
        if dt.eval("getComputedStyle(document.getElementById('actors-card')).display") == "none":
            fail("the Actors card is hidden")
        columns = head()
        if columns != ["actor", "type", "task", "state", "restarts", "last reply", "step", "accuracy", "lr", "momentum",
                       "actions"]:
            fail("the card's columns are %s" % columns)
        # The cells and the JSON they were drawn from, read at once.
        r, a = dt.eval("[Array.from(document.querySelectorAll('#actors tr')).map(r => Array.from(r.cells).map(c => c.textContent)),"
                       " window.troupe.actors]")
        for i, (row, actor) in enumerate(zip(r, a["actors"])):
            task = "/job:worker/replica:0/task:%d" % (i % 2)
            if row[:5] != ["trial %d" % i, "pbt_trial", task, "running", "0"] or actor["task"] != task:
                fail("row %d reads %s (expected trial %d, pbt_trial, on %s, running, 0 restarts)" % (i, row, i, task))
            if not re.fullmatch(r"\d+ ms ago", row[5]) or row[10] != "StopClone":
                fail("row %d's last reply reads %r" % (i, row[5]))
            if row[6] != str(actor["step"]):
                fail("row %d shows step %r, the JSON %r" % (i, row[6], actor["step"]))
            for col, name in ((7, "accuracy"), (8, "lr"), (9, "momentum")):
                v = actor["values"][name]
                if abs(float(row[col]) - v) > 1e-3 * max(1.0, abs(v)):
                    fail("row %d's %s reads %r, the JSON %r" % (i, name, row[col], v))
            if not 0 <= actor["values"]["accuracy"] <= 1:
                fail("trial %d's accuracy is %r" % (i, actor["values"]["accuracy"]))
        # A generation's best on the card, as the chief printed it.
        history = {h["label"]: {p["step"]: p["values"]["accuracy"] for p in h["points"]} for h in a["history"]}
        printed = {int(g): float(b) for g, b in re.findall(r"^generation (\d+)/\d+: best ([0-9.]+)", out(), re.M)}
        common = [g for g in printed if all(g in h for h in history.values())]
        if not common:
            fail("no generation both printed and on the card: printed %s, card %s" % (sorted(printed), history))
        for g in common:
            best = max(h[g] for h in history.values())
            if abs(best - printed[g]) > 6e-5:
                fail("generation %d: the card's best accuracy is %r, the chief printed %r" % (g, best, printed[g]))
        # The same through /api/actors.
        base = harness.base_of(url)
        status, api = request(base, "/api/actors?token=" + token)
        if status != 200:
            fail("GET /api/actors answered %d: %s" % (status, api))
        if [x["label"] for x in api["actors"]] != ["trial 0", "trial 1", "trial 2", "trial 3"] or api["spawned"] != 4:
            fail("/api/actors lists %s, %d spawned" % ([x["label"] for x in api["actors"]], api["spawned"]))
        print("card: %s; generations %s match the printed bests" % ([x[:3] + x[7:8] for x in r], common[:3]), flush=True)

        # 2. One line per trial on the chart, a point per generation.
        wait_for("the card's chart: four lines of 3 points or more", lambda: dt.eval(
            "(() => { const d = window.troupe.actorsChart.data.datasets;"
            " return d.length === 4 && d.every(s => s.data.length >= 3) ? d.map(s => s.label) : null; })()"), 60)

        # 3. By hand. The server's guards first: no token, an id that is no row, an action not offered.
        a = data()
        ids = {x["label"]: x["id"] for x in a["actors"]}
        if [x["name"] for x in a["actions"]] != ["stop", "clone"]:
            fail("the card offers %s (expected stop and clone)" % a["actions"])
        status, body = request(base, "/api/actor_command?id=%d&action=stop" % ids["trial 0"], "POST")
        if status != 401:
            fail("an actor command without the token answered %d: %s" % (status, body))
        status, body = request(base, "/api/actor_command?id=99999&action=stop&token=" + token, "POST")
        if status != 400 or "no actor with id 99999" not in body.get("error", ""):
            fail("an actor command for id 99999 answered %d: %s" % (status, body))
        status, body = request(base, "/api/actor_command?id=%d&action=explode&token=%s" % (ids["trial 0"], token), "POST")
        if status != 400 or 'no action named "explode" (this trainer offers: stop, clone)' not in body.get("error", ""):
            fail("an actor command with action explode answered %d: %s" % (status, body))
        dt.eval("postActorCommand(99999, 'stop')")  # as a stale page would ask: the refusal shows on the card
        wait_for("the server's refusal on the card", lambda: "no actor with id 99999" in (dt.text("actors-message") or ""), 10)
        if "by hand:" in out():
            fail("a refused command was applied:\n" + out()[-2000:])
        press("actor-%d-stop" % ids["trial 0"])
        press("actor-%d-clone" % ids["trial 1"])
        stop_re = r"^by hand: trial 0 stopped after generation (\d+)$"
        clone_re = (r"^by hand: trial 4 cloned from trial 1 on (/job:worker/replica:0/task:\d) after generation (\d+), "
                    r"lr ([0-9.]+), momentum ([0-9.]+)$")
        wait_for("the chief's by-hand lines", lambda: re.search(stop_re, out(), re.M) and re.search(clone_re, out(), re.M), 30, out)
        stopped_at = int(re.search(stop_re, out(), re.M).group(1))
        task, cloned_at, lr, momentum = re.search(clone_re, out(), re.M).groups()
        cloned_at, lr, momentum = int(cloned_at), float(lr), float(momentum)
        if task != "/job:worker/replica:0/task:0":
            fail("the clone went to %s (worker 0 holds the fewest trials running)" % task)
        # The clicks were accepted: the page cleared the refusal it showed.
        wait_for("the card's refusal cleared by the accepted clicks", lambda: dt.text("actors-message") == "", 10,
                 lambda: "the card still says %r" % dt.text("actors-message"))
        # Two more generations: the clone trained, the stopped trial did not.
        def after_two():
            a = data()
            rows_by = {x["label"]: x for x in (a or {}).get("actors", [])}
            clone = rows_by.get("trial 4")
            if not clone or clone["step"] is None or clone["step"] < cloned_at + 2 or "accuracy" not in clone["values"]:
                return None
            return a
        a = wait_for("the clone to train two generations", after_two, 30, out)
        rows_by = {x["label"]: x for x in a["actors"]}
        history = {h["label"]: {p["step"]: p["values"] for p in h["points"]} for h in a["history"]}
        stopped = rows_by["trial 0"]
        if stopped["state"] != "stopped" or stopped["step"] != stopped_at or max(history["trial 0"]) != stopped_at:
            fail("trial 0 after its stop at generation %d: %s, its points at %s" % (stopped_at, stopped, sorted(history["trial 0"])))
        if stopped["values"]["accuracy"] != history["trial 0"][stopped_at]["accuracy"]:
            fail("trial 0's accuracy moved after its stop: %s" % stopped)
        clone = rows_by["trial 4"]
        if clone["type"] != "pbt_trial" or clone["task"] != task or clone["state"] != "running" or clone["restarts"] != 0:
            fail("the clone's row: %s" % clone)
        first, source = history["trial 4"][cloned_at], history["trial 1"][cloned_at]
        # Printed with 5 and 3 decimals.
        for name, bounds, printed, digits in (("lr", (1e-5, 1.0), lr, 6e-6), ("momentum", (0.0, 0.99), momentum, 6e-4)):
            got = first[name]
            if abs(got - printed) > digits:
                fail("the clone's %s on the card %r, printed %r" % (name, got, printed))
            if not any(abs(got - min(max(source[name] * f, bounds[0]), bounds[1])) <= 1e-5 * max(1e-3, got) for f in (0.8, 1.25)):
                fail("the clone's %s %r is not trial 1's %r times 0.8 or 1.25" % (name, got, source[name]))
        r = rows()
        if r[0][3] != "stopped" or r[4][:5] != ["trial 4", "pbt_trial", task, "running", "0"]:
            fail("the card's rows after the clicks: %s" % r)
        answers = dt.eval("Array.from(document.querySelectorAll('#actors-answers li')).map(l => [l.className, l.textContent])")
        for line in (re.search(stop_re, out(), re.M).group(0), re.search(clone_re, out(), re.M).group(0)):
            if not any(c == "" and t.endswith(line) for c, t in answers):
                fail("the card lists %s, not %r" % (answers, line))
        print("by hand: trial 0 stopped after generation %d; trial 4 cloned on %s after generation %d with lr %s, momentum %s "
              "(trial 1's %s, %s)" % (stopped_at, task, cloned_at, first["lr"], first["momentum"], source["lr"], source["momentum"]),
              flush=True)

        # 4. Worker 1 killed: its trials come back on worker 0, with a restart each.
        os.kill(tasks["w1"].pid, signal.SIGKILL)

        def respawned():
            r = rows()
            if not r or len(r) != 5:
                return None
            moved = [r[1], r[3]]
            ok = all(x[2] == "/job:worker/replica:0/task:0" and x[3] == "running" and x[4] == "1" for x in moved)
            return r if ok else None
        r = wait_for("trials 1 and 3 running again on worker 0 with a restart each", respawned, 60, lambda: out() + "\n--- worker 0\n" + out("w0"))
        for i in (2, 4):
            if r[i][:5] != ["trial %d" % i, "pbt_trial", "/job:worker/replica:0/task:0", "running", "0"]:
                fail("trial %d's row changed after worker 1 died: %s" % (i, r[i]))
        if r[0][:5] != ["trial 0", "pbt_trial", "/job:worker/replica:0/task:0", "stopped", "0"]:
            fail("trial 0's row after worker 1 died: %s" % r[0])
        summary = wait_for("the summary to count 2 down and 2 restarts", lambda: (lambda s: s if s == ["2", "2"] else None)(
            dt.eval("[document.getElementById('actors-down').textContent, document.getElementById('actors-restarts').textContent]")), 10)
        print("after the kill: %s; down and restarts %s" % ([x[:5] for x in r], summary), flush=True)
        dt.eval("document.getElementById('actors-card').scrollIntoView({block: 'start'})")
        time.sleep(0.5)
        save_screenshot(dt, screenshot)

        # 5. Stop on every trial still running: the last one asked is refused, and trains on.
        ids = {x["label"]: x["id"] for x in data()["actors"]}
        for i in (1, 2, 3, 4):
            press("actor-%d-stop" % ids["trial %d" % i])
        refused = "by hand: trial 4 not stopped: it is the last trial running"
        wait_for("the refusal to stop the last trial", lambda: re.search("^" + refused + "$", out(), re.M), 30, out)
        for i in (1, 2, 3):
            if not re.search(r"^by hand: trial %d stopped after generation \d+$" % i, out(), re.M):
                fail("no stop line for trial %d:\n%s" % (i, out()[-3000:]))
        wait_for("the refusal on the card", lambda: any(
            c == "refused" and t.endswith(refused) for c, t in
            dt.eval("Array.from(document.querySelectorAll('#actors-answers li')).map(l => [l.className, l.textContent])") or []), 10)
        last_step = data()["actors"][4]["step"]
        wait_for("trial 4 to train on", lambda: (lambda x: x["state"] == "running" and x["step"] >= last_step + 2)(data()["actors"][4]), 30, out)
        states = [x[3] for x in rows()]
        if states != ["stopped", "stopped", "stopped", "stopped", "running"]:
            fail("the states after stopping all but the last: %s" % states)

        # 6. Stop from the page: the search ends with its result line.
        dt.click("stop-now")
        for name in ("chief", "w0"):
            rc = tasks[name].wait("%s after Stop" % name)
            if rc != 0:
                fail("%s exited %d after Stop:\n%s" % (name, rc, out(name)[-2000:]))
        last = out().strip().splitlines()[-1]
        m = re.fullmatch(r"result: trials=4 generations=\d+ best_initial=[0-9.]+ best_final=[0-9.]+ respawned=(\d+) "
                         r"workers_lost=(\d+) stopped_by_hand=(\d+) cloned_by_hand=(\d+)", last)
        if not m or m.groups() != ("2", "1", "4", "1"):
            fail("the chief's last line after Stop is %r (expected the result line with respawned=2 workers_lost=1 "
                 "stopped_by_hand=4 cloned_by_hand=1)" % last)
        print(last, flush=True)
        print("PASSED", flush=True)
        return 0
    finally:
        kill_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
