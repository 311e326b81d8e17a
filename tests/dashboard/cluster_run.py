"""A 2-worker multi_worker_trainer cluster for the dashboard's cluster tests, and a stranger that
knocks on its chief's control port with the wrong credentials.

Used by mw_cluster_test.py (the JSON) and browser_test.py --cluster (the page).
"""
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time

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


class Cluster:
    """troupe-launch -n 2 over multi_worker_trainer, the chief serving the dashboard, with a
    known cluster token and control ports (the chief's is port_base)."""

    def __init__(self, launch, trainer, work, extra_args=()):
        self.work = work
        self.token = secrets.token_hex(16)
        self.port_base = free_port_pair()
        self.log_path = os.path.join(work, "cluster.log")
        env = dict(os.environ, TROUPE_CLUSTER_TOKEN=self.token, TROUPE_HEARTBEAT_MS=str(HEARTBEAT_MS))
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([launch, "-n", "2", "--timeout", "80", "--port-base", str(self.port_base),
                                          "--", trainer, "--epochs", "100000", "--dashboard-port", "0",
                                          *extra_args],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def out(self):
        with open(self.log_path) as f:
            return f.read()

    def worker_pid(self, index):
        """The pid of worker `index` of this cluster (its TF_CONFIG and this cluster's token)."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/environ" % entry, "rb") as f:
                    env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
                if env.get(b"TROUPE_CLUSTER_TOKEN") != self.token.encode():
                    continue
                if not os.readlink("/proc/%s/exe" % entry).endswith("multi_worker_trainer"):
                    continue
                if json.loads(env.get(b"TF_CONFIG", b"{}")).get("task", {}).get("index") == index:
                    return int(entry)
            except (OSError, ValueError):
                continue
        return None

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped worker must be able to die
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass


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
    end = min(time.monotonic() + timeout, deadline)
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    fail("timed out waiting for " + what)
