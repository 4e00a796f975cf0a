"""A hostile "proxy" for the doctor's adversarial tests: run by a copy of the
python binary named like a proxy (haproxy, squid, nginx), as an unprivileged
user, so the doctor recognises it and reads on its behalf what its command
line and config name. What it holds is chosen by its first arguments:

    fakeproxy.py unix PATH   ...   listen on a unix socket, answer one byte a second
    fakeproxy.py tcp [IP:PORT] ... listen there (or on a free port of 127.0.0.1), answer one byte a second
    fakeproxy.py swap PATH   ...   listen on PATH, then replace PATH by a symlink to PATH.link
    fakeproxy.py swapdir DIR TO ... listen on DIR/admin.sock, then move DIR away, link DIR to TO
    fakeproxy.py idle        ...   hold nothing

It prints 'ready PID [PORT]' once set up; the proxy's own options (-f CONF …) follow and are ignored.
"""

import os
import socket
import sys
import threading
import time


def slow(conn: socket.socket) -> None:
    """Answer whatever is asked with a long reply, one byte a second."""
    try:
        conn.recv(4096)
        for b in b"HTTP/1.0 200 OK\r\n\r\nMaxconn: 5\nActive connections: 1\n" * 100:
            conn.sendall(bytes([b]))
            time.sleep(1)
    except OSError:
        pass


def serve(srv: socket.socket) -> None:
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=slow, args=(conn,), daemon=True).start()


def main() -> None:
    mode, extra = sys.argv[1], ""
    if mode in ("unix", "swap"):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(sys.argv[2])
        srv.listen(8)
        if mode == "swap":
            os.unlink(sys.argv[2])
            os.symlink(sys.argv[2] + ".link", sys.argv[2])
    elif mode == "swapdir":
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(os.path.join(sys.argv[2], "admin.sock"))
        srv.listen(8)
        os.rename(sys.argv[2], sys.argv[2] + ".old")
        os.symlink(sys.argv[3], sys.argv[2])
    elif mode == "tcp":
        host, _, port = (sys.argv[2] if sys.argv[2:3] and sys.argv[2][:1].isdigit() else "127.0.0.1:0").partition(":")
        srv = socket.socket()
        srv.bind((host, int(port)))
        srv.listen(8)
        extra = f" {srv.getsockname()[1]}"
    if mode != "idle":
        threading.Thread(target=serve, args=(srv,), daemon=True).start()
    print(f"ready {os.getpid()}{extra}", flush=True)
    time.sleep(600)


main()
