#!/usr/bin/python3
"""The dashboard in a real browser: headless Chromium (Debian's `chromium`) driven over the
DevTools protocol, against a running mlp_classifier.

1. it loads the page and sees points arrive on the loss chart (and, without a checkpoint
   directory, "Save checkpoint" and "Stop (with checkpoint)" disabled, saying why);
2. it clicks Pause and sees the step counter stop;
3. it clicks Resume and sees it move;
4. it types a learning rate, clicks Set, and sees the new value in the steps that follow, and the
   pause, resume and learning rate marked on the charts;
5. it clicks Stop (no checkpoint): the trainer exits 0 saying it stopped, the header says stopped;
6. a second run of about 10 s (sized by the first one's step rate) with a validation split, watched
   to its end: the header says "finished", the accuracy chart has points and val_accuracy points,
   the learning-rate axis holds the rate at its scale. A screenshot of the page after the end
   is kept at SCREENSHOT.

With --cluster, against multi_worker_trainer on 2 workers (troupe-launch, TROUPE_LAUNCH):
1. the cluster table shows both workers' heartbeat ages: each the server's at the last poll plus
   the time since, ticking between polls, and falling when a fresh heartbeat arrives;
   both rows show their process's CPU and memory (worker 1's from its heartbeat); after Pause and
   Resume, worker 1's "last lines" button shows its own "paused after step N" and "resumed after
   step N", which its heartbeat carried;
2. a stranger with the wrong token knocks on the chief's control port, and the failures list
   shows a "refused" row with its address;
3. the screenshot is kept, and Stop ends both workers with status 0.

Usage: browser_test.py MLP_CLASSIFIER SCREENSHOT
       browser_test.py --cluster TROUPE_LAUNCH MULTI_WORKER_TRAINER SCREENSHOT
Exit status: 0 passed, 1 failed (a missing chromium or websocket module fails too: the install script installs both).
"""
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the DevTools client)
from harness import fail, kill_all, open_page, save_screenshot, wait_for  # noqa: E402

harness.set_deadline(150)  # the whole test; every wait below is bounded by it too


def main_cluster(launch, trainer, screenshot):
    import cluster_run
    work = tempfile.mkdtemp(prefix="troupe-browser-cluster-")
    procs = []
    cluster = None
    try:
        # Steps of at least 5 ms: two trainers at full speed leave a browser on 2 cores too little
        # time to tick the ages it is checked on.
        cluster = cluster_run.Cluster(launch, trainer, work, ["--step-delay-ms", "5"])
        url = harness.dashboard_url(cluster.out, 30, rank=0)
        dt = open_page(work, url, procs)

        # 1. Both workers' heartbeat ages, ticking.
        ages = lambda: dt.eval("Array.from(document.querySelectorAll('#workers td.hb-age')).map(td => td.textContent)") or []
        states = lambda: dt.eval("Array.from(document.querySelectorAll('#workers td.hb-state')).map(td => td.textContent)") or []
        # The first rows wait for the page to come up, bounded by the deadline alone: on a loaded
        # machine Chromium's renderer, starved, showed them after more than 30 s; how fast it
        # starts is nothing this test asserts. A timeout prints what the table showed last.
        last = {}
        shown = wait_for("two heartbeat ages in the cluster table",
                         lambda: (lambda a: last.update(ages=a) or (a if len(a) == 2 and all(re.fullmatch(r"\d+ ms", x) for x in a)
                                                                   else None))(ages()),
                         harness.time_left(), lambda: "%s\n--- the table's ages last: %s" % (cluster.out()[-3000:], last.get("ages")))
        if states() != ["alive", "alive"]:
            fail("the cluster table shows heartbeat states %s, expected alive twice" % states())
        # Each reading, in one evaluation: the text shown, the ages the server gave at the last
        # poll and the time since that poll. The shown age must be the server's plus the time
        # since (never more), every row must see a fresh heartbeat (its server age falls) with an
        # age under one interval plus a poll, and the texts must tick. A loaded machine may delay
        # a poll or a heartbeat; none of these depends on how long.
        reading = lambda: dt.eval("(() => { const t = Array.from(document.querySelectorAll('#workers td.hb-age'))"
                                  ".map(td => td.textContent); return [t, heartbeats.ages.slice(0, t.length),"
                                  " performance.now() - heartbeats.at]; })()")
        seen = set()
        raw_seen = [[], []]
        fresh = [False, False]
        end = time.monotonic() + 15
        while time.monotonic() < end and (len(seen) < 3 or not all(fresh)):
            texts, raw, since = reading() or ([], [], 0)
            if len(texts) == 2 and len(raw) == 2 and all(re.fullmatch(r"\d+ ms", x) for x in texts):
                seen.add(tuple(texts))
                for i in range(2):
                    shown_ms = int(texts[i].split()[0])
                    if raw[i] is None or shown_ms < round(raw[i]) - 1 or shown_ms > round(raw[i] + since) + 1:
                        fail("worker %d's age on the page is %d ms, but the server said %s ms %.0f ms ago"
                             % (i, shown_ms, raw[i], since))
                    if raw_seen[i] and raw[i] < raw_seen[i][-1] and raw[i] <= cluster_run.HEARTBEAT_MS + 600:
                        fresh[i] = True
                    if not raw_seen[i] or raw[i] != raw_seen[i][-1]:
                        raw_seen[i].append(raw[i])
            time.sleep(0.05)
        if len(seen) < 3:
            fail("the heartbeat ages do not move: %s" % sorted(seen))
        if not all(fresh):
            fail("no fresh heartbeat reached the page in 15 s for worker(s) %s; the server's ages went %s"
                 % ([i for i in range(2) if not fresh[i]], raw_seen))
        print("heartbeat ages on the page: %s, then %d more readings; the server's ages went %s"
              % (shown, len(seen) - 1, raw_seen), flush=True)

        # CPU and memory on both rows, worker 1's as its heartbeat carried them.
        usage = lambda: dt.eval("Array.from(document.querySelectorAll('#workers tr')).map(tr => "
                                "[tr.querySelector('td.cpu').textContent, tr.querySelector('td.memory').textContent,"
                                " tr.querySelector('td.cpu').title])") or []
        cells = wait_for("CPU and memory on both rows of the cluster table",
                         lambda: (lambda u: u if len(u) == 2 and all(re.fullmatch(r"\d+ %", c) and
                                                                     re.fullmatch(r"[\d.]+ MiB", m) for c, m, _ in u)
                                  else None)(usage()), 15)
        if "heartbeat" not in cells[1][2] or "serving" not in cells[0][2]:
            fail("the usage cells say where they come from as %r and %r" % (cells[0][2], cells[1][2]))
        dt.click("pause")
        paused = wait_for("worker 1 to pause", lambda: re.search(r"\[rank 1\] paused after step (\d+)", cluster.out()), 15)
        dt.click("resume")
        said = ["paused after step " + paused[1], "resumed after step " + paused[1]]

        def worker1_lines():
            dt.eval("document.querySelector('#workers tr[data-worker=\"1\"] button.logs').click()")
            time.sleep(0.2)
            text = dt.eval("document.getElementById('logs').textContent") or ""
            return text if text.startswith("worker 1, last lines (") and text.split("\n")[-2:] == said else None
        shown_logs = wait_for("worker 1's own lines %s under its last lines" % said, worker1_lines, 10)
        if "from its heartbeat" not in shown_logs:
            fail("worker 1's last lines read %r" % shown_logs)
        print("usage on the page: %s; worker 1's lines: %r" % ([c[:2] for c in cells], shown_logs), flush=True)

        # 2. A stranger with the wrong token: a refused row with its address.
        row_text = None
        for attempt in range(3):  # refusals are recorded at powers of two: 1, 2, 4...
            address = cluster_run.stranger_knocks(work, cluster.port_base)
            end = time.monotonic() + 5
            while not row_text and time.monotonic() < end:
                rows = dt.eval("Array.from(document.querySelectorAll('#failures li.failure'))"
                               ".map(li => [li.dataset.kind, li.textContent])") or []
                row_text = next((t for k, t in rows if k == "connection_refused" and address in t), None)
                time.sleep(0.1)
            if row_text:
                break
        if not row_text:
            fail("no refused row for the stranger %s in the page's failures list" % address)
        print("failure row: %s" % row_text, flush=True)
        dt.eval("document.getElementById('workers').closest('.card').scrollIntoView()")  # the panel in the picture
        time.sleep(0.3)
        save_screenshot(dt, screenshot)

        # 3. Stop (no checkpoint: the trainers have no checkpoint directory) ends both workers.
        dt.click("stop-now")
        rc = harness.wait_exit(cluster.proc, "the workers after Stop")
        if rc != 0:
            fail("troupe-launch exited %d after Stop:\n%s" % (rc, cluster.out()[-2000:]))
        print("PASSED: heartbeat ages tick on the page, the stranger %s is a refused row" % address, flush=True)
        return 0
    finally:
        kill_all(procs)
        if cluster:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def start_trainer(trainer, work, name, args):
    """mlp_classifier with a dashboard on any free port, niced (the browser must keep up on 2 cores)."""
    return harness.Started(work, name, [trainer, "--replicas", "2", "--samples", "4096", "--batch", "128",
                                        "--optimizer", "sgd", "--lr", "0.01", "--dashboard-port", "0"] + args, nice=True)


def main():
    if sys.argv[1] == "--cluster":
        return main_cluster(sys.argv[2], sys.argv[3], sys.argv[4])
    trainer, screenshot = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-browser-")
    procs = []
    try:
        # Part 1: a long run steered from the page (no checkpoint directory).
        train = start_trainer(trainer, work, "steered", ["--epochs", "100000"])
        trainer_log = train.out
        procs.append(train)
        url = train.dashboard_url(30)
        dt = open_page(work, url, procs)

        # 1. Points arrive on the loss chart.
        points = lambda: dt.eval("window.troupe ? window.troupe.lossChart.data.datasets[0].data.length : 0") or 0
        newest = lambda: dt.eval("window.troupe.lossChart.data.datasets[0].data.at(-1).x") or 0
        # The first points wait for the page to come up, bounded by the deadline alone: a loaded
        # machine starts Chromium late, and how fast is nothing this test asserts.
        wait_for("points on the loss chart", lambda: points() > 0, harness.time_left())
        first = newest()
        wait_for("newer points on the loss chart (pushed, not only loaded)", lambda: newest() > first + 20, 20)
        replicas = dt.eval("window.troupe.lossChart.data.datasets.filter(d => d.replica !== undefined).length")
        if replicas != 2:
            fail("the loss chart has %s replica lines, expected 2" % replicas)
        step = lambda: int(dt.eval("document.getElementById('step').textContent") or 0)
        print("loss chart: %d points, step %d" % (points(), step()), flush=True)

        # Without a checkpoint directory the controls that would save nothing are disabled, saying why.
        wait_for("Save checkpoint disabled", lambda: dt.eval("document.getElementById('checkpoint').disabled"), 10)
        for button in ("checkpoint", "stop"):
            title = dt.eval("document.getElementById('%s').title" % button) or ""
            if not dt.eval("document.getElementById('%s').disabled" % button) or "checkpoint directory" not in title:
                fail("#%s is not disabled with a reason (title %r)" % (button, title))

        # 2. Pause: the step counter stops.
        dt.click("pause")
        wait_for("the page to say paused", lambda: dt.eval("document.getElementById('status').textContent") == "paused", 10)
        paused_at = step()
        time.sleep(1.5)
        if step() != paused_at:
            fail("the step counter moved while paused: %d then %d" % (paused_at, step()))
        if not re.search(r"paused after step %d\b" % paused_at, trainer_log()):
            fail("the trainer did not report pausing after step %d" % paused_at)
        print("paused at step %d, still %d after 1.5 s" % (paused_at, step()), flush=True)

        # 4 (set while paused, so the very next step uses it). The learning rate field and Set.
        dt.click("lr-input")
        dt.call("Input.insertText", text="0.0123")
        dt.click("lr-set")
        wait_for("the trainer to take the new learning rate",
                 lambda: re.search(r"learning rate 0\.0123 from step %d\b" % (paused_at + 1), trainer_log()), 10)

        # 3. Resume: the counter moves.
        dt.click("resume")
        wait_for("the step counter to move after resume", lambda: step() > paused_at + 5, 15)
        wait_for("the page to say running", lambda: dt.eval("document.getElementById('status').textContent") == "running", 10)
        print("resumed: step %d" % step(), flush=True)

        # 4. The new learning rate in the steps after the pause, on the chart and in the header.
        lr_points = lambda: dt.eval("window.troupe.lrChart.data.datasets[0].data.filter(p => p.x > %d).map(p => p.y)"
                                    % paused_at) or []
        wait_for("learning-rate points after the pause", lambda: len(lr_points()) > 3, 10)
        bad = [y for y in lr_points() if abs(y - 0.0123) > 1e-6]
        if bad:
            fail("steps after the change show learning rates %s, expected 0.0123" % bad[:5])
        before = dt.eval("window.troupe.lrChart.data.datasets[0].data.filter(p => p.x <= %d).map(p => p.y)" % paused_at)
        if not before or abs(before[-1] - 0.01) > 1e-6:
            fail("the steps before the change should show 0.01, got %s" % (before[-3:] if before else before))
        header = dt.eval("document.getElementById('lr').textContent")
        if header != "0.01230":
            fail("the header shows learning rate %r, expected 0.01230" % header)
        # The pause, the resume and the learning rate are marked on the charts at that step.
        kinds = lambda: sorted(set(dt.eval("window.troupe.marks.filter(m => m.step === %d).map(m => m.kind)" % paused_at) or []))
        wait_for("marks of the pause, the resume and the learning rate", lambda: kinds() == ["learning_rate", "pause", "resume"], 10)
        print("learning rate 0.0123 in %d later steps; marks %s at step %d" % (len(lr_points()), kinds(), paused_at), flush=True)

        # 5. Stop (no checkpoint): the trainer ends cleanly, and the page says stopped.
        dt.click("stop-now")
        rc = train.wait("the trainer after Stop")
        out = trainer_log()
        if rc != 0 or "training stopped from the dashboard after step" not in out:
            fail("the trainer exited %d after Stop:\n%s" % (rc, out[-2000:]))
        wait_for("the header to say stopped", lambda: dt.eval("document.getElementById('status').textContent") == "stopped", 10)
        print("stopped cleanly (%s)" % re.search(r"stopped after step \d+", out).group(0), flush=True)

        # Part 2: a run of about 10 s (sized by part 1's epoch times) with a validation split,
        # watched to its end.
        # An epoch's time, as the trainer printed it ("Epoch 12/100000: ..., 0.193 s, ..."): the median.
        seconds = sorted(float(x) for x in re.findall(r"^Epoch \d+/\d+: .*?, ([0-9.]+) s,", out, re.M))
        if not seconds:
            fail("the trainer printed no epoch times:\n" + out[-2000:])
        epochs = max(3, min(2000, int(10 / max(seconds[len(seconds) // 2], 1e-3))))
        train = start_trainer(trainer, work, "finished", ["--epochs", str(epochs), "--validation-split", "0.1"])
        trainer_log = train.out
        procs.append(train)
        url = train.dashboard_url(30, what="the second trainer's dashboard URL")
        dt.call("Page.navigate", url=url)
        wait_for("the header to say finished",
                 lambda: dt.eval("window.troupe && window.troupe.status") == "finished", max(30, harness.DEADLINE - time.monotonic()))
        if dt.eval("document.getElementById('status').textContent") != "finished":
            fail("the header does not say finished")
        rc = train.wait("the trainer after its last epoch")
        if rc != 0:
            fail("the trainer exited %d:\n%s" % (rc, trainer_log()[-2000:]))
        time.sleep(1.5)  # the page after the trainer is gone: the history stays readable
        accuracy = dt.eval("window.troupe.metricCharts.accuracy ? window.troupe.metricCharts.accuracy.data.datasets[0].data.length : 0") or 0
        if accuracy < 10:
            fail("the accuracy chart has %d points after %d epochs" % (accuracy, epochs))
        val = dt.eval("(window.troupe.metricCharts.accuracy.data.datasets.find(d => d.label === 'val_accuracy') || {data: []}).data.length") or 0
        if val < 1:
            fail("the accuracy chart has no val_accuracy points")
        rate_now = dt.eval("window.troupe.lrChart.data.datasets[0].data.at(-1).y")
        axis = dt.eval("[window.troupe.lrChart.scales.y.min, window.troupe.lrChart.scales.y.max]")
        if not axis or not (axis[0] <= rate_now <= axis[1]) or axis[1] - axis[0] > 10 * rate_now:
            fail("the learning-rate axis %s does not show the rate %s at its scale" % (axis, rate_now))
        if dt.eval("document.getElementById('epoch').textContent") != "%d / %d" % (epochs, epochs):
            fail("the header shows epoch %r, expected %d / %d" % (dt.eval("document.getElementById('epoch').textContent"), epochs, epochs))
        print("header: %s" % dt.eval("document.querySelector('header').innerText.replace(/\\s+/g, ' ')"), flush=True)
        print("finished after %d epochs: accuracy chart %d points, %d val_accuracy; learning-rate axis %s holds %s"
              % (epochs, accuracy, val, axis, rate_now), flush=True)
        save_screenshot(dt, screenshot)
        print("PASSED", flush=True)
        return 0
    finally:
        kill_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
