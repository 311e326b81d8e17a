"""What the dashboard tests share: one deadline for the whole test, failing with the output, bounded
waits, the JSON API, trainers started as process groups with their output in a file, the chief's
dashboard URL, finding a task's process, stopping everything on the way out, and headless
Chromium driven over the DevTools protocol (Debian's `chromium` and `python3-websocket`, which
tools/install-deps.sh installs: a missing one fails the test, saying what to install).

A test sets its deadline first (set_deadline), then every wait is bounded by it too.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

DEADLINE = time.monotonic() + 150


def set_deadline(seconds):
    """The whole test ends within `seconds` from now: every wait below is bounded by it."""
    global DEADLINE
    DEADLINE = time.monotonic() + seconds


def fail(why, log=None):
    """Ends the test: FAILED and why, then the end of `log` (the trainer's output) when given."""
    print("FAILED: " + why, flush=True)
    if log:
        print("--- output\n" + log[-5000:], flush=True)
    raise SystemExit(1)


def wait_for(what, predicate, timeout, log=lambda: None):
    """predicate()'s first true value, polled every 50 ms for at most `timeout` s (and never past
    the deadline); else the test fails, with log() when it gives the output."""
    end = min(time.monotonic() + timeout, DEADLINE)
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    fail("timed out waiting for " + what, log())


def request(base, path, method="GET"):
    """(status, parsed JSON body) of one request to the dashboard at `base` (http://host:port)."""
    req = urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Started:
    """A program started in a process group of its own (so that everything it starts goes with
    it), its output (stdout and stderr) in work/NAME.log."""

    def __init__(self, work, name, argv, env=None, nice=False):
        self.log_path = os.path.join(work, name + ".log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                         preexec_fn=(lambda: os.nice(10)) if nice else None)
        self.pid = self.proc.pid

    def out(self):
        """Its output so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def dashboard_url(self, timeout, rank=None, what=None):
        """dashboard_url(self.out, ...)."""
        return dashboard_url(self.out, timeout, rank, what)

    def wait(self, what):
        """wait_exit(self.proc, what, self.out)."""
        return wait_exit(self.proc, what, self.out)

    def stop(self):
        """SIGCONT and SIGTERM to its group (a stopped task must be able to die), SIGKILL after 10 s."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.pid, signal.SIGCONT)
            os.killpg(self.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def wait_exit(proc, what, out=lambda: None):
    """The exit status of `proc`, waited for until the deadline; else the test fails saying that
    `what` did not exit, with out()."""
    try:
        return proc.wait(timeout=max(1, DEADLINE - time.monotonic()))
    except subprocess.TimeoutExpired:
        fail("%s did not exit" % what, out())


def dashboard_url(out, timeout, rank=None, what=None):
    """The URL a trainer's output `out()` says its dashboard serves (`dashboard: http://...`; with
    `rank`, the line of that rank under troupe-launch), waited for at most `timeout` s."""
    prefix = r"\[rank %d\] " % rank if rank is not None else ""
    what = what or "the %s dashboard URL" % ("chief's" if rank is not None else "trainer's")
    return wait_for(what, lambda: (re.search(prefix + r"dashboard: (http://\S+)", out()) or [None, None])[1],
                    timeout, out)


def base_of(url):
    """http://host:port of a dashboard URL."""
    return re.match(r"http://[^/?]+", url).group(0)


def task_pid(marker, job, index, exe=None):
    """The pid of the task (job, index) of the run whose processes carry TROUPE_TEST_RUN=marker (by
    its TF_CONFIG), optionally only a process whose executable ends with `exe`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if env.get(b"TROUPE_TEST_RUN") != marker.encode():
                continue
            if exe and not os.readlink("/proc/%s/exe" % entry).endswith(exe):
                continue
            task = json.loads(env.get(b"TF_CONFIG", b"{}")).get("task", {})
            if task.get("type") == job and task.get("index") == index:
                return int(entry)
        except (OSError, ValueError):
            continue
    return None


def resume(pid):
    """SIGCONT to a process the test stopped (None: nothing), ignoring one that is gone."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def kill_all(procs):
    """SIGKILL to the group of every process (subprocess.Popen or Started) still running."""
    for p in procs:
        proc = p.proc if isinstance(p, Started) else p
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


try:
    import websocket  # Debian's python3-websocket
except ImportError:
    websocket = None


def time_left():
    """Seconds until the test's deadline (at least 1)."""
    return max(1.0, DEADLINE - time.monotonic())


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket. An uncaught exception on
    the page, reported while any call waits, fails the test. Every call is bounded by the test's
    deadline, not by a time of its own: a page busy on a loaded machine answers late (30 s and more
    were seen under ctest -j2 beside a build), and how fast Chromium answers is nothing a test
    asserts; what the page shows is, by its own bounded waits."""

    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=time_left(), suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.settimeout(time_left())
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                fail("Chromium did not answer %s before the test's deadline" % method)
            if msg.get("method") == "Runtime.exceptionThrown":
                # An error the page's own scripts did not catch (a script that did not load, a name
                # one script reads of another): the page is broken, whatever it still shows.
                details = msg["params"]["exceptionDetails"]
                fail("the page threw: %s (%s:%s)" % (details.get("exception", {}).get("description") or details.get("text"),
                                                     details.get("url", "?"), details.get("lineNumber", "?")))
            if msg.get("id") == my_id:
                if "error" in msg:
                    fail("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            return None
        return r.get("result", {}).get("value")

    def click(self, element_id):
        """A real mouse click in the middle of the element (scrolled into view first)."""
        box = self.eval("(() => { const e = document.getElementById(%s); e.scrollIntoView({block: 'center'});"
                        " const r = e.getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % json.dumps(element_id))
        if not box:
            fail("no element #" + element_id + " on the page")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def text(self, element_id):
        """The element's textContent (None when there is no such element)."""
        return self.eval("(() => { const e = document.getElementById(%s); return e ? e.textContent : null; })()"
                         % json.dumps(element_id))

    def rows(self, tbody_id):
        """The text of every cell of every row of a table body, row by row."""
        return self.eval("Array.from(document.querySelectorAll('#%s tr')).map(r => Array.from(r.cells).map(c => c.textContent))"
                         % tbody_id)


def open_page(work, url, procs):
    """Headless Chromium (added to `procs`) showing `url`; its DevTools client."""
    if websocket is None:
        # tools/install-deps.sh installs it: its absence is a broken setup, not a reason to skip.
        fail("the python3 websocket module is missing (tools/install-deps.sh installs python3-websocket)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        fail("no chromium on PATH (tools/install-deps.sh installs Debian's chromium)")
    profile = os.path.join(work, "profile")
    browser = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                                "--no-first-run", "--no-default-browser-check", "--user-data-dir=" + profile,
                                "--remote-debugging-port=0", "--window-size=1400,1000", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    procs.append(browser)
    port_file = os.path.join(profile, "DevToolsActivePort")
    # Chromium's start is bounded by the deadline alone (it asserts nothing: a loaded machine
    # starts it slowly).
    port = wait_for("chromium's DevTools port",
                    lambda: os.path.exists(port_file) and open(port_file).read().split("\n")[0], time_left())
    targets = json.load(urllib.request.urlopen("http://127.0.0.1:%s/json/list" % port, timeout=time_left()))
    page = next(t for t in targets if t.get("type") == "page")
    dt = DevTools(page["webSocketDebuggerUrl"])
    dt.call("Page.enable")
    dt.call("Runtime.enable")  # its exceptions end the test (DevTools.call)
    dt.call("Page.navigate", url=url)
    return dt


def save_screenshot(dt, screenshot):
    """The page as a PNG at `screenshot` (the build tree's artifacts)."""
    shot = dt.call("Page.captureScreenshot", format="png")
    os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
    with open(screenshot, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print("screenshot: " + screenshot, flush=True)
