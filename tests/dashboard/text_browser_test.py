#!/usr/bin/python3
"""text_transformer's dashboard in headless Chromium (harness.py's DevTools client): the
samples the trainer publishes, and the controls a person steers it with.

1. the page shows the "sample" text, replaced by a newer one every --sample-every steps;
2. a temperature that is not a number is refused on the page, with the error shown;
3. a temperature of 0.02 set from the page: the trainer says "temperature 0.02 from step N+1", the
   next samples (step > N) are made at 0.02, as the page and the trainer's own output say, they
   differ from the samples before and use fewer distinct characters (near the argmax, where a
   temperature of 1 spreads over the alphabet);
4. Pause stops the step counter (the trainer says "paused after step P"), a learning rate set
   while paused is taken from step P+1, Resume moves the counter again;
5. Stop (no checkpoint) ends the trainer with status 0. The screenshot is kept at SCREENSHOT;
6. TensorBoard's own reader (the tensorboard package that tools/install-deps.sh installs into
   $TROUPE_TENSORBOARD_VENV, default /opt/troupe-tensorboard) finds the samples in the event file
   as text tensors, the one at 0.02 that the page showed among them.

Usage: text_browser_test.py TEXT_TRANSFORMER SCREENSHOT
Exit status: 0 passed, 1 failed.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, the DevTools client)
from harness import fail, kill_all, open_page, save_screenshot, wait_for  # noqa: E402

SAMPLE_EVERY = 5
harness.set_deadline(170)  # the whole test; every wait is bounded by it


def main():
    trainer, screenshot = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="troupe-text-browser-")
    procs = []
    try:
        # A small model (a step of tens of ms on 2 cores), sampled every 5 steps, run until stopped.
        train = harness.Started(work, "trainer", [trainer, "--replicas", "2", "--epochs", "1000", "--steps-per-epoch",
                                                  "1000", "--dim", "32", "--blocks", "1", "--heads", "2", "--length", "32",
                                                  "--batch", "16", "--sample-every", str(SAMPLE_EVERY), "--sample-length",
                                                  "80", "--temperature", "1", "--dashboard-port", "0", "--tensorboard-dir",
                                                  os.path.join(work, "tb")], nice=True)
        procs.append(train)
        out = train.out
        url = train.dashboard_url(60)
        dt = open_page(work, url, procs)

        # 1. The sample text, refreshed every SAMPLE_EVERY steps.
        sample = lambda: dt.eval("(() => { const t = window.troupe && window.troupe.texts.sample;"
                                 " return t ? [t.sequence, t.step, t.text, t.pre.textContent, t.h.textContent] : null; })()")
        first = wait_for("a sampled text on the page", sample, 60)
        if first[3] != first[2] or not first[2].startswith("temperature 1:\n"):
            fail("the page shows the sample as %r (expected the text published, at temperature 1)" % first[3][:200])
        if first[1] % SAMPLE_EVERY != 0 or first[4] != "sample at step %d" % first[1]:
            fail("the sample's heading reads %r at step %d" % (first[4], first[1]))
        later = wait_for("a newer sample", lambda: (lambda s: s if s and s[0] > first[0] and s[1] > first[1] else None)(sample()), 30)
        if (later[1] - first[1]) % SAMPLE_EVERY != 0:
            fail("samples at steps %d and %d are not %d steps apart" % (first[1], later[1], SAMPLE_EVERY))
        print("samples at steps %d, %d: %r" % (first[1], later[1], later[2][:60]), flush=True)
        before = [later[2]]
        while len(before) < 3:  # a few samples at temperature 1, to compare with
            s = wait_for("another sample at temperature 1", lambda: (lambda s: s if s and s[2] != before[-1] else None)(sample()), 30)
            before.append(s[2])

        # 2. Not a number: refused on the page, nothing applied.
        dt.click("control-temperature-input")
        dt.call("Input.insertText", text="hot")
        dt.click("control-temperature-set")
        message = wait_for("the refusal shown on the page", lambda: dt.eval("document.getElementById('message').textContent"), 10)
        if "control temperature: value \"hot\" is not a number in 0.01..100" not in message:
            fail("the page shows %r for a temperature of 'hot'" % message)
        print("refused on the page: %s" % message, flush=True)

        # 3. 0.02 from the page.
        dt.eval("document.getElementById('control-temperature-input').value = ''")
        dt.click("control-temperature-input")
        dt.call("Input.insertText", text="0.02")
        dt.click("control-temperature-set")
        applied = wait_for("the trainer to take temperature 0.02", lambda: re.search(r"temperature 0\.02 from step (\d+)", out()), 20)
        from_step = int(applied[1])
        # The refusal's text goes once the page has the answer to the valid one (which may come after
        # the trainer applied it).
        wait_for("the page to clear the refusal after a valid temperature",
                 lambda: dt.eval("document.getElementById('message').textContent") == "", 10)
        # Told apart by their steps: at 0.02 sampling is nearly greedy, so two samples a few steps
        # apart may read the same.
        low, low_steps = [], []
        while len(low) < 3:
            s = wait_for("a sample at temperature 0.02",
                         lambda: (lambda s: s if s and s[1] >= from_step and (not low_steps or s[1] > low_steps[-1])
                                  else None)(sample()), 30)
            low_steps.append(s[1])
            if not s[2].startswith("temperature 0.02:\n"):
                fail("the sample at step %d, after the change at step %d, reads %r" % (s[1], from_step, s[2][:80]))
            if not re.search(r"--- sampled at step %d \(temperature 0\.02\)" % s[1], out()):
                fail("the trainer did not print its sample at step %d at temperature 0.02" % s[1])
            low.append(s[2])
        if set(low) & set(before):
            fail("a sample at 0.02 is one made at 1")
        shown = dt.eval("document.getElementById('control-temperature-value').textContent")
        if shown != "(0.02)":
            fail("the page shows the temperature in use as %r" % shown)
        body = lambda text: text.split("\n", 1)[1]
        spread = lambda texts: sum(len(set(body(t))) for t in texts) / len(texts)
        if not spread(low) < spread(before):
            fail("samples at 0.02 use %.1f distinct characters, at 1 %.1f: %r / %r"
                 % (spread(low), spread(before), low[-1][:100], before[-1][:100]))
        marks = dt.eval("window.troupe.marks.filter(m => m.kind === 'control').map(m => m.step)") or []
        if from_step - 1 not in marks:
            fail("no V mark at step %d on the charts (control marks %s)" % (from_step - 1, marks))
        print("temperature 0.02 from step %d: %.1f distinct characters per sample (%.1f at 1): %r"
              % (from_step, spread(low), spread(before), low[-1][:60]), flush=True)

        # 4. Pause, a learning rate while paused, resume.
        step = lambda: int(dt.eval("document.getElementById('step').textContent") or 0)
        dt.click("pause")
        wait_for("the page to say paused", lambda: dt.eval("document.getElementById('status').textContent") == "paused", 15)
        paused_at = step()
        time.sleep(1.5)
        if step() != paused_at:
            fail("the step counter moved while paused: %d then %d" % (paused_at, step()))
        if not re.search(r"paused after step %d\b" % paused_at, out()):
            fail("the trainer did not report pausing after step %d" % paused_at)
        dt.click("lr-input")
        dt.call("Input.insertText", text="0.0005")
        dt.click("lr-set")
        wait_for("the trainer to take the learning rate", lambda: re.search(r"learning rate 0\.0005 from step %d\b" % (paused_at + 1), out()), 15)
        dt.click("resume")
        wait_for("the step counter to move after resume", lambda: step() > paused_at + 2, 30)
        wait_for("the page to say running", lambda: dt.eval("document.getElementById('status').textContent") == "running", 10)
        print("paused at step %d, learning rate 0.0005 from step %d, resumed: step %d" % (paused_at, paused_at + 1, step()), flush=True)

        dt.eval("window.scrollTo(0, 0)")  # the header, the controls and the text card
        time.sleep(0.3)
        save_screenshot(dt, screenshot)

        # 5. Stop: the trainer ends with status 0.
        dt.click("stop-now")
        rc = train.wait("the trainer after Stop")
        if rc != 0 or "stopped after step" not in out():
            fail("the trainer exited %d after Stop:\n%s" % (rc, out()[-2000:]))

        # 6. The samples in TensorBoard's Text tab, as its reader finds them.
        python = os.path.join(os.environ.get("TROUPE_TENSORBOARD_VENV", "/opt/troupe-tensorboard"), "bin", "python")
        reader = ("import json, sys\n"
                  "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
                  "from tensorboard.util import tensor_util\n"
                  "acc = EventAccumulator(sys.argv[1], size_guidance={'tensors': 0})\n"
                  "acc.Reload()\n"
                  "print(json.dumps({e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode('utf-8')"
                  " for e in acc.Tensors('sample')}))\n")
        try:
            read = subprocess.run([python, "-c", reader, os.path.join(work, "tb", "train")], capture_output=True,
                                  text=True, timeout=max(1, harness.DEADLINE - time.monotonic()))
        except FileNotFoundError:
            fail("no TensorBoard reader at %s (tools/install-deps.sh installs it)" % python)
        if read.returncode != 0:
            fail("TensorBoard's reader failed: %s" % read.stderr[-1500:])
        texts = {int(k): v for k, v in json.loads(read.stdout).items()}
        # TensorBoard renders Markdown: the trainer indents the sample four spaces (a code block).
        unindent = lambda t: t.replace("\n    ", "\n").replace(":\n\n", ":\n", 1)
        if s[1] not in texts or unindent(texts[s[1]]) != s[2]:
            fail("TensorBoard holds %r at step %d, the page showed %r" % (texts.get(s[1]), s[1], s[2]))
        if sorted(texts) != list(range(SAMPLE_EVERY, max(texts) + 1, SAMPLE_EVERY)):
            fail("TensorBoard holds samples at steps %s" % sorted(texts))
        print("TensorBoard: %d samples, steps %d..%d, the one at step %d as the page showed it"
              % (len(texts), min(texts), max(texts), s[1]), flush=True)
        print("PASSED", flush=True)
        return 0
    finally:
        kill_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
