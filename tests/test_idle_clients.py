"""The bench's idle clients (microbench/proxybench.IdleClients), against a loopback server we
control: each client is held, refused, cut or timed out, and counted as such, with a setup in
parallel windows, never more in flight than WINDOW."""

import socket
import threading

from proxytune.microbench import proxybench


class Server:
    """Accepts `answer` connections and answers each request once, closes the next `cut` after
    reading their request, and then stops accepting (the rest wait in the accept queue)."""

    def __init__(self, answer: int, cut: int):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4096)
        self.port = self.lsock.getsockname()[1]
        self.answer, self.cut, self.held, self.peak = answer, cut, [], 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for n in range(self.answer + self.cut):
            c, _ = self.lsock.accept()
            c.recv(4096)
            if n < self.answer:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n")
                threading.Timer(0.05, c.sendall, [b"x" * 70000]).start()    # the body after the head
                self.held.append(c)
            else:
                c.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        for c in self.held:
            c.close()
        self.lsock.close()


def test_every_client_answered_is_held_and_the_others_are_counted_by_what_happened(monkeypatch):
    monkeypatch.setattr(proxybench.IdleClients, "TIMEOUT_S", 1.0)
    with Server(answer=150, cut=20) as srv, proxybench.IdleClients("127.0.0.1", srv.port, 9, 200) as idle:
        assert len(idle.socks) == 150
        assert idle.failed == {"ConnectionResetError": 20, "TimeoutError": 30}
        assert idle.still_open() == 150
        for c in srv.held[:10]:                 # the server drops ten: still_open() sees it
            c.close()
        assert idle.still_open() == 140


def test_a_port_nobody_listens_on_refuses_every_client():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]                   # bound, never listening: connections are refused
    try:
        with proxybench.IdleClients("127.0.0.1", port, 9, 40) as idle:
            assert idle.socks == [] and idle.failed == {"ConnectionRefusedError": 40}
    finally:
        s.close()


def test_no_more_than_a_window_of_clients_is_set_up_at_once(monkeypatch):
    """A server that never accepts: only WINDOW clients wait at a time, so a proxy deferring its
    accepts sees a queue of WINDOW, and the n clients time out in n / WINDOW rounds."""
    monkeypatch.setattr(proxybench.IdleClients, "TIMEOUT_S", 0.3)
    monkeypatch.setattr(proxybench.IdleClients, "WINDOW", 8)
    seen = []
    real = proxybench.IdleClients._dial

    def dial(self, sel, i):
        seen.append(len(sel.get_map()))
        real(self, sel, i)
    monkeypatch.setattr(proxybench.IdleClients, "_dial", dial)
    with Server(answer=0, cut=0) as srv, proxybench.IdleClients("127.0.0.1", srv.port, 9, 24) as idle:
        assert idle.failed == {"TimeoutError": 24}
    assert max(seen) == 7 and len(seen) == 24
