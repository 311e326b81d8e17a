#!/usr/bin/python3
"""The recommender's dashboard under ParameterServerStrategy in headless Chromium (harness.py's
DevTools client): the recommender under troupe-launch with a chief, 2 workers and 2 ps tasks, the
chief serving the page.

1. the Parameter servers card shows both workers (running, a closures/s and a samples/s above 0)
   and both ps tasks (the bytes they hold, their updates and update rate), and the closures/s and
   queue chart draws; the samples/s chart (fit's throughput) draws with no spike: no point above
   4x the median (fit takes results in order, and one taken at once after an older one read
   hundreds of times the real rate when measured from the previous take alone);
2. the AUC chart draws val_auc at each epoch's end, the values the trainer printed for them;
3. Pause on the page: the status says paused, the card shows nothing queued or in flight and both
   workers idle, the step counter stands still; Resume moves it again;
4. worker 1 SIGSTOPped: the card lists "worker lost (worker 1)"; SIGCONTed: "worker back";
5. Stop (no checkpoint) ends the cluster with status 0 and the result line last. The screenshot
   (the card) is kept at SCREENSHOT.

Usage: ps_browser_test.py TROUPE_LAUNCH RECOMMENDER SCREENSHOT
Exit status: 0 passed, 1 failed.
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the DevTools client)
from harness import fail, kill_all, open_page, save_screenshot, wait_for  # noqa: E402

harness.set_deadline(170)  # the whole test; every wait is bounded by it


def main():
    launch, trainer, screenshot = sys.argv[1], sys.argv[2], sys.argv[3]
    work = tempfile.mkdtemp(prefix="troupe-ps-browser-")
    procs = []
    stopped_pid = None
    run = "ps-browser-%d" % os.getpid()
    try:
        env = dict(os.environ, TROUPE_HEARTBEAT_MS="200", TROUPE_MISSED_HEARTBEATS="3", TROUPE_TEST_RUN=run)
        cluster = harness.Started(work, "cluster", [launch, "--ps", "2", "-n", "2", "--chief", "--timeout", "160", "--",
                                                    trainer, "--epochs", "100000", "--steps-per-epoch", "40",
                                                    "--step-delay-ms", "20", "--dashboard-port", "0"],
                                  env=env, nice=True)
        procs.append(cluster)
        out = cluster.out
        url = cluster.dashboard_url(60, rank=0)
        dt = open_page(work, url, procs)

        # 1. The card: both workers running closures, both ps tasks updating.
        rows = dt.rows
        seen = {}
        def busy():
            w, p = rows("ps-workers"), rows("ps-tasks")
            seen["rows"] = (w, p)
            if not w or not p or len(w) != 2 or len(p) != 2:
                return None
            running = all(r[2] in ("running", "idle") and float(r[5]) > 0 and r[6] != "-" and float(r[6]) > 0
                          for r in w)
            updating = all(r[2] == "up" and r[4].endswith("B") and r[6] != "-" and float(r[6]) > 0 for r in p)
            return (w, p) if running and updating else None
        # The first rows wait for the page to come up, bounded by the deadline alone: on a loaded
        # machine Chromium took over 60 s to show them (its renderer starved, the API serving them
        # all along); how fast it starts is nothing this test asserts.
        w, p = wait_for("both workers running closures and both ps tasks updating on the page", busy, harness.time_left(),
                        lambda: "%s\n--- the card's rows last: %s" % (out()[-3000:], seen.get("rows")))
        if dt.eval("getComputedStyle(document.getElementById('ps-card')).display") == "none":
            fail("the Parameter servers card is hidden")
        if [r[1] for r in w] != ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"] or \
                [r[1] for r in p] != ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]:
            fail("the card's rows name %s and %s" % ([r[1] for r in w], [r[1] for r in p]))
        points = wait_for("the closures/s chart's points",
                          lambda: (lambda n: n if n and n >= 3 else None)(
                              dt.eval("window.troupe.psChart.data.datasets[0].data.length")), 20)
        rates = wait_for("30 points on the samples/s chart", lambda: (lambda d: d if d and len(d) >= 30 else None)(
            dt.eval("window.troupe.rateChart.data.datasets[0].raw.map(p => p.y).filter(y => y !== null && y > 0)")), 60)
        median = sorted(rates[5:])[len(rates[5:]) // 2]
        if max(rates[5:]) > 4 * median:
            fail("the samples/s chart spikes to %.0f, %.1fx its median %.0f: %s"
                 % (max(rates[5:]), max(rates[5:]) / median, median, [round(r) for r in rates]))
        print("samples/s chart: median %.0f, highest %.2fx it (%d points); per worker %s"
              % (median, max(rates[5:]) / median, len(rates), [r[6] for r in w]), flush=True)
        rate = float(dt.eval("document.getElementById('ps-rate').textContent"))
        if not rate > 0:
            fail("the card's closures/s reads %r" % rate)
        print("card: %.1f closures/s, workers %s, ps tasks %s (%d chart points)"
              % (rate, [r[5] for r in w], [(r[4], r[6]) for r in p], points), flush=True)

        # 2. val_auc at each epoch's end, the values the trainer printed.
        aucs = wait_for("two epochs' val_auc on the AUC chart", lambda: (lambda d: d if d and len(d) >= 2 else None)(dt.eval(
            "(() => { const c = window.troupe.metricCharts.auc; if (!c) return null;"
            " const d = c.data.datasets.find(d => d.label === 'val_auc'); return d ? d.raw.map(p => p.y) : null; })()")), 60)
        printed = [float(x) for x in re.findall(r"\[rank 0\] epoch \d+/\d+: .* val_auc ([0-9.]+)", out())]
        for i, a in enumerate(aucs[:len(printed)]):
            if abs(a - printed[i]) > 5e-4:
                fail("the page's val_auc of epoch %d is %r, the trainer printed %r" % (i + 1, a, printed[i]))
        if not all(0 <= a <= 1 for a in aucs):
            fail("val_auc values out of [0, 1]: %s" % aucs)
        print("val_auc on the page: %s" % [round(a, 3) for a in aucs[:5]], flush=True)

        # 3. Pause and resume from the page.
        step = lambda: int(dt.eval("document.getElementById('step').textContent") or 0)
        dt.click("pause")
        wait_for("the page to say paused", lambda: dt.eval("document.getElementById('status').textContent") == "paused", 15)
        wait_for("the card to show nothing queued or in flight and both workers idle",
                 lambda: dt.eval("document.getElementById('ps-queued').textContent") == "0"
                 and dt.eval("document.getElementById('ps-in-flight').textContent") == "0"
                 and [r[2] for r in rows("ps-workers")] == ["idle", "idle"], 10)
        paused_at = step()
        time.sleep(1.0)
        if step() != paused_at:
            fail("the step counter moved while paused: %d then %d" % (paused_at, step()))
        if not re.search(r"\[rank 0\] paused after step %d\b" % paused_at, out()):
            fail("the chief did not say it paused after step %d" % paused_at)
        dt.click("resume")
        wait_for("the step counter to move after resume", lambda: step() > paused_at + 5, 30)
        print("paused at step %d with nothing in flight, resumed: step %d" % (paused_at, step()), flush=True)

        # 4. Worker 1 lost and back, as events on the card.
        stopped_pid = harness.task_pid(run, "worker", 1)
        if stopped_pid is None:
            fail("cannot find worker 1's process")
        os.kill(stopped_pid, signal.SIGSTOP)
        events = lambda: dt.eval("Array.from(document.querySelectorAll('#ps-events li.ps-event')).map(li =>"
                                 " [li.dataset.kind, li.querySelector('.kind').textContent, li.querySelector('.text').textContent])") or []
        lost = wait_for("a worker lost event for worker 1 on the card",
                        lambda: [e for e in events() if e[0] == "worker_lost" and "(worker 1)" in e[1]], 15)
        if "/job:worker/replica:0/task:1" not in lost[0][2]:
            fail("the lost event reads %r" % lost[0])
        os.kill(stopped_pid, signal.SIGCONT)
        stopped_pid = None
        wait_for("a worker back event for worker 1 on the card",
                 lambda: [e for e in events() if e[0] == "worker_back" and "(worker 1)" in e[1]], 15)
        print("events: %s" % [e[1] for e in events()][:4], flush=True)

        dt.eval("document.getElementById('ps-card').scrollIntoView({block: 'start'})")
        time.sleep(0.5)
        save_screenshot(dt, screenshot)

        # 5. Stop: the cluster ends with status 0, the result line last.
        dt.click("stop-now")
        rc = cluster.wait("the cluster after Stop")
        text = out()
        chief = [line for line in text.splitlines() if line.startswith("[rank 0] ")]
        if rc != 0 or not chief or not chief[-1].startswith("[rank 0] result: epochs="):
            fail("the cluster exited %d after Stop, the chief's last line %r:\n%s" % (rc, chief[-1:], text[-2000:]))
        print("PASSED", flush=True)
        return 0
    finally:
        harness.resume(stopped_pid)
        kill_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
