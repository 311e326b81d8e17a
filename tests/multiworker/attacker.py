#!/usr/bin/env python3
"""A stranger on loopback, for run_cluster.sh: it knows the cluster's addresses but not its token.

Usage: attacker.py basp-header HOST PORT HOLD_S
  Connects to HOST:PORT as soon as it listens and sends 40 bytes: a CAF 0.17 BASP header
  (client handshake) declaring a payload of 4 GiB - 1, then 8 bytes of it. Holds the connection
  for HOLD_S seconds. A middleman that faces it unauthenticated reserves the whole payload.
Usage: attacker.py bad-token HOST PORT
  Three times: connects and sends a TLS record header and random bytes, failing the handshake as
  a worker with another token (or none) would.
Usage: attacker.py idle HOST PORT COUNT HOLD_S
  Opens COUNT connections to HOST:PORT and sends nothing on them (a TLS handshake that never
  starts); holds them for HOLD_S seconds.
Prints what it did; exits 0 once it sent its bytes (or held its connections).
"""
import os
import socket
import struct
import sys
import time


def connect(host, port, within_s=30.0):
    deadline = time.time() + within_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.time() > deadline:
                sys.exit(f"attacker: {host}:{port} never listened")
            time.sleep(0.01)


def main():
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = connect(host, port)
    if mode == "basp-header":
        # operation (client_handshake = 1), 2 padding bytes, flags, payload_len, operation_data,
        # source actor, destination actor: 32 bytes, big-endian as BASP writes them.
        header = struct.pack(">BBBBIQQQ", 1, 0, 0, 0, 0xFFFFFFFF, 3, 0, 0)
        s.sendall(header + b"\0" * 8)
        print(f"attacker: sent a {len(header) + 8}-byte BASP message declaring {0xFFFFFFFF} bytes", flush=True)
        time.sleep(float(sys.argv[4]))
    elif mode == "bad-token":
        for k in range(3):
            if k > 0:
                s = connect(host, port)
            s.sendall(b"\x16\x03\x01\x00\x05" + os.urandom(5) + os.urandom(1000))
            time.sleep(0.2)
            s.close()
        print("attacker: sent 3 bad handshakes", flush=True)
    elif mode == "idle":
        held = [s] + [connect(host, port) for _ in range(int(sys.argv[4]) - 1)]
        print(f"attacker: holding {len(held)} idle connections", flush=True)
        time.sleep(float(sys.argv[5]))
        for c in held:
            c.close()
    else:
        sys.exit(f"attacker: unknown mode {mode}")
    s.close()


if __name__ == "__main__":
    main()
