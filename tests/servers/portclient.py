"""A client that exhausts its ephemeral ports, for the doctor's tests.

Run inside a fresh network namespace (`unshare -n python3 portclient.py`):
it brings lo up, narrows net.ipv4.ip_local_port_range to ten ports, turns
tcp_tw_reuse off (all of it in its own namespace only), serves a listener
on 127.0.0.1 and connects to it over and over, closing first so every
local port waits in TIME_WAIT. Once ten are used, connect() fails with
EADDRNOTAVAIL. Prints "ready PID"; stops by itself after --seconds.
"""

import argparse
import errno
import os
import socket
import subprocess
import threading
import time


def serve(ls: socket.socket) -> None:
    while True:
        try:
            c, _ = ls.accept()
            c.close()
        except OSError:
            return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--ports", type=int, default=10)
    a = ap.parse_args()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write(f"40000 {40000 + a.ports - 1}")
    with open("/proc/sys/net/ipv4/tcp_tw_reuse", "w") as f:
        f.write("0")
    ls = socket.socket()
    ls.bind(("127.0.0.1", 8080))
    ls.listen(128)
    threading.Thread(target=serve, args=(ls,), daemon=True).start()
    print(f"ready {os.getpid()}", flush=True)
    until, ok, fails = time.monotonic() + a.seconds, 0, 0
    while time.monotonic() < until:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", 8080))
            ok += 1
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                raise
            fails += 1
            time.sleep(0.01)
        finally:
            s.close()
    print(f"connected {ok}, EADDRNOTAVAIL {fails}", flush=True)


if __name__ == "__main__":
    main()
