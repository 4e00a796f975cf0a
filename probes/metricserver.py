"""`watch --listen`: the watcher's metrics over HTTP for a Prometheus scrape.

GET /metrics answers the text of the last window (the exposition format's
content type); anything else is 404, any other method 405. It binds to
loopback unless told otherwise: the findings name the proxy's caps and
config files, which is nothing to show the network by accident. A thread of
http.server's ThreadingHTTPServer serves it; no request is logged to stderr
(the watcher's own lines go there). Any local user can connect, so a client
has CLIENT_TIMEOUT_S to send its request and read the answer, and at most
MAX_CLIENTS are served at once, MAX_PER_PEER of one local user's (a scrape is
one short request): the rest are closed at once. Held open, each would keep a thread and a file descriptor of
root's watcher, and enough of them run it out of descriptors.
"""

import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from proxytune.core import tcpdiag
from proxytune.core.errors import ProxytuneError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_HOST = "127.0.0.1"
MAX_CLIENTS = 8
MAX_PER_PEER = 2            # served at once for one local uid (or one remote address)
CLIENT_TIMEOUT_S = 5.0


def parse_listen(value: str) -> tuple[str, int]:
    """'PORT', 'HOST:PORT' or '[V6]:PORT' -> (host, port); loopback when no host is given."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise ProxytuneError(f"--listen {value!r} is no address: give PORT or IP:PORT (e.g. 127.0.0.1:9464)") from None
    if not 0 < number < 65536:
        raise ProxytuneError(f"--listen port {number} is out of range (1-65535)")
    return host, number


class BoundedServer(ThreadingHTTPServer):
    """A thread per client, MAX_CLIENTS at once (one over that is closed unanswered), each client's
    whole exchange within CLIENT_TIMEOUT_S: the handler's timeout bounds each read only, and a client
    sending a byte every few seconds would hold its slot for ever, so one reaper thread shuts the
    sockets past their deadline."""
    daemon_threads = True
    request_queue_size = 64                         # listen backlog: a burst is accepted, then bounded here

    def __init__(self, *args, **kw):
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.clients: dict = {}                     # client socket -> (when it is shut, its peer key)
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.client_errors = 0
        super().__init__(*args, **kw)
        threading.Thread(target=self._reap, daemon=True, name="metrics-reaper").start()

    def process_request(self, request, client_address):
        peer = self._peer(request, client_address)
        with self.lock:
            crowded = sum(1 for _, p in self.clients.values() if p == peer) >= MAX_PER_PEER
        if crowded or not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        with self.lock:
            self.clients[request] = (time.monotonic() + CLIENT_TIMEOUT_S, peer)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request) -> None:
        with self.lock:
            self.clients.pop(request, None)
        self.slots.release()

    @staticmethod
    def _peer(request, client_address) -> tuple:
        """Who a client is: the uid owning its socket when it is on this host (sock_diag), so one local
        user holding connections open cannot keep Prometheus's scrape out; else its address."""
        try:
            uid = tcpdiag.owner_uid(request.getpeername()[:2], request.getsockname()[:2])
        except OSError:
            uid = None
        return ("uid", uid) if uid is not None else ("address", client_address[0])

    def _reap(self) -> None:
        while not self.closing.wait(0.25):
            now = time.monotonic()
            with self.lock:
                late = [s for s, (t, _) in self.clients.items() if t < now]
            for s in late:
                try:
                    s.shutdown(socket.SHUT_RDWR)        # its handler's read ends; a closed socket raises
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        """A client's reset or garbage is its own affair: socketserver printed a traceback for each
        (twenty lines; a reset storm from any local user would flood root's journal past its rate
        limit and push out the episode lines). Counted, not printed."""
        self.client_errors += 1

    def server_close(self) -> None:
        self.closing.set()
        super().server_close()


class V6Server(BoundedServer):
    address_family = socket.AF_INET6


class Endpoint:
    """The metrics endpoint; update(text) is the Loop's publisher."""

    def __init__(self, host: str, port: int):
        self.text = "# no window yet\n"
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            timeout = CLIENT_TIMEOUT_S                  # StreamRequestHandler: the client socket's timeout

            def do_GET(self):
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = endpoint.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.send_error(405)

            do_PUT = do_DELETE = do_POST

            def log_message(self, *args):
                pass

        try:
            self.server = (V6Server if ":" in host else BoundedServer)((host, port), Handler)
        except OSError as e:
            raise ProxytuneError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                                 "pick a free port with --listen") from None
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def update(self, text: str) -> None:
        self.text = text

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
