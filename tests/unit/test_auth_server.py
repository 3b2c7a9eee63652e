"""AuthServer's lifecycle: a stop leaves no thread behind, also for connections that arrive as the
stop begins or are idle in their handshake. (A cancelled fit's last live report once kept a
report-server handler alive past the fit: accepted just before the listener closed, registered just
after stop() had listed the connections to close, so nothing closed it before the handshake's
timeout; tests/spark/test_progress.py's cancel test failed on it in CI at 2aa08ab. stop() now joins the
accept loop before it lists connections, and the loop refuses a connection once stopping: a window
this test cannot hold open, so it checks the outcome around it.)"""

import socket
import threading
import time

from sparkdl_train.net.server import AuthServer


class _Server(AuthServer):
    kind = "test server"

    def __init__(self):
        super().__init__("127.0.0.1", b"s" * 32, 0, 60.0, handshake_timeout=30.0)
        self.clients: list[socket.socket] = []

    def handle(self, conn, worker):  # pragma: no cover - no peer authenticates here
        conn.recv(1)

    def stopping(self):
        # a peer connects just as the stop begins; give the accept loop time to take it
        self.clients.append(socket.create_connection(self.address, timeout=5))
        time.sleep(0.3)


def _ours():
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-test server")]


def test_a_stop_leaves_no_handler_for_a_connection_that_arrived_as_it_began():
    for _ in range(5):
        server = _Server().start()
        idle = socket.create_connection(server.address, timeout=5)  # connected, never authenticates
        deadline = time.monotonic() + 5
        while len(_ours()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        server.stop(timeout=5)
        assert time.monotonic() - t0 < 5  # not the handshake's 30 s
        assert _ours() == []
        for c in [idle, *server.clients]:
            c.close()
