"""Workloads that run a namespace-wide kernel resource out, for the doctor's
tests. Run inside a fresh network namespace (`unshare -n python3 nsload.py
MODE`): everything it sets is that namespace's own and goes with it.

  tw       sets net.ipv4.tcp_max_tw_buckets (per namespace) to --buckets
           and churns short loopback connections, the client closing first
           so each leaves a TIME_WAIT: past the cap tcp_time_wait() closes
           the socket at once and counts TCPTimeWaitOverflow.
  noroute  sends SYNs to a loopback listener from an address the namespace
           has no route to (a raw socket writes the IP header): the listener
           cannot route its SYN-ACK, tcp_conn_request() drops the request
           and counts ListenDrops, not ListenOverflows.

Prints "ready PID"; stops by itself after --seconds.
"""

import argparse
import os
import socket
import struct
import subprocess
import threading
import time

PORT = 8080


def serve(ls: socket.socket) -> None:
    """Accept and read each connection to its end, then close (the client closed first: TIME_WAIT is its)."""
    while True:
        try:
            c, _ = ls.accept()
        except OSError:
            return
        with c:
            while c.recv(4096):
                pass


def churn(until: float, pause: float) -> None:
    while time.monotonic() < until:
        with socket.create_connection(("127.0.0.1", PORT)) as s:
            s.sendall(b"x")
        time.sleep(pause)


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def syn(src: str, sport: int, dst: str, dport: int) -> bytes:
    """An IPv4 packet holding one TCP SYN (the kernel fills the IP length, id and checksum)."""
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1000 + sport, 0, 5 << 4, 0x02, 65535, 0, 0)
    tcp = tcp[:16] + struct.pack("!H", checksum(s + d + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(tcp)) + tcp)) \
        + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, socket.IPPROTO_TCP, 0, s, d)
    return ip + tcp


def unroutable_syns(until: float, pause: float) -> None:
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)     # IP_HDRINCL implied
    n = 0
    while time.monotonic() < until:
        n += 1
        raw.sendto(syn("198.51.100.7", 1024 + n % 60000, "127.0.0.1", PORT), ("127.0.0.1", 0))
        time.sleep(pause)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["tw", "noroute"])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--pause", type=float, default=0.005)
    a = ap.parse_args()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if a.mode == "tw":
        with open("/proc/sys/net/ipv4/tcp_max_tw_buckets", "w") as f:
            f.write(str(a.buckets))
    ls = socket.socket()
    ls.bind(("127.0.0.1", PORT))
    ls.listen(4096)
    if a.mode == "tw":
        threading.Thread(target=serve, args=(ls,), daemon=True).start()
    print(f"ready {os.getpid()}", flush=True)
    until = time.monotonic() + a.seconds
    (churn if a.mode == "tw" else unroutable_syns)(until, a.pause)


if __name__ == "__main__":
    main()
