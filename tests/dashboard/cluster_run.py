"""A 2-worker multi_worker_trainer cluster for the dashboard's cluster tests, and a stranger that
knocks on its chief's control port with the wrong credentials. Launching, the output, finding a
worker's process and stopping come from harness.py.

Used by mw_cluster_test.py (the JSON) and browser_test.py --cluster (the page).
"""
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (what the dashboard tests share: waits, launching, a task's process)

HEARTBEAT_MS = 1000  # TROUPE_HEARTBEAT_MS for the cluster: late after 2 s, lost after 6 s


def free_port_pair():
    """P with P and P+1 free on loopback (troupe-launch --port-base checks them again)."""
    for _ in range(200):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            if p >= 65535:
                continue
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", p + 1))
                    return p
            except OSError:
                continue
    raise RuntimeError("no two free consecutive ports on 127.0.0.1")


class Cluster(harness.Started):
    """troupe-launch -n 2 over multi_worker_trainer (harness.Started: its own process group, its
    output in work/cluster.log), the chief serving the dashboard, with a known cluster token and
    control ports (the chief's is port_base)."""

    def __init__(self, launch, trainer, work, extra_args=()):
        self.token = secrets.token_hex(16)
        self.port_base = free_port_pair()
        self.marker = "mw-cluster-%d-%s" % (os.getpid(), self.token[:8])
        env = dict(os.environ, TROUPE_CLUSTER_TOKEN=self.token, TROUPE_HEARTBEAT_MS=str(HEARTBEAT_MS),
                   TROUPE_TEST_RUN=self.marker)
        super().__init__(work, "cluster", [launch, "-n", "2", "--timeout", "80", "--port-base", str(self.port_base),
                                           "--", trainer, "--epochs", "100000", "--dashboard-port", "0", *extra_args],
                         env=env)

    def worker_pid(self, index):
        """The pid of worker `index` of this cluster (its TF_CONFIG, in this cluster's processes)."""
        return harness.task_pid(self.marker, "worker", index, exe="multi_worker_trainer")


def stranger_knocks(work, port):
    """Connects to the chief's control port over TLS with a certificate no cluster token made (a
    stranger with the wrong token) and returns its own address, "127.0.0.1:PORT", as the chief
    sees it."""
    key, cert = os.path.join(work, "stranger.key"), os.path.join(work, "stranger.pem")
    if not os.path.exists(cert):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-subj", "/CN=stranger", "-days", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(cert, key)
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    address = "%s:%d" % sock.getsockname()[:2]
    try:
        with ctx.wrap_socket(sock) as tls:
            tls.sendall(b"\0" * 64)  # TLS 1.3 finishes the client's side first: send, then read the refusal
            tls.recv(1)
    except (ssl.SSLError, OSError):
        pass  # refused, as it should be
    finally:
        sock.close()
    return address


def wait_for(what, predicate, timeout, deadline, fail):
    """harness.wait_for's bounded wait for a test with a deadline and fail() of its own."""
    end = min(time.monotonic() + timeout, deadline)
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    fail("timed out waiting for " + what)
