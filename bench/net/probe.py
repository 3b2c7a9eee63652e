"""A link's probe: a 1-byte ping-pong for the round trip, then a stream for the throughput.

One side serves (:func:`serve`), the other measures (:func:`send`); bench.net.links runs either in a host's
network namespace as ``python -m bench.net.probe serve ADDRESS`` (prints its port, answers one sender) or
``python -m bench.net.probe send ADDRESS PORT BYTES`` (prints the median round trip in seconds, the bytes
sent and the seconds they took), and serves the driver's side from a thread of its own process.
"""

from __future__ import annotations

import socket
import sys
import time

ROUNDS = 200  # ping-pongs whose median is the round trip
BLOCK = 1 << 20  # the stream's writes
TIMEOUT_S = 60.0  # no wait of either side longer than this


def listener(host: str) -> socket.socket:
    """A socket listening on ``host`` at a port the system picks (``getsockname()[1]``)."""
    srv = socket.create_server((host, 0))
    srv.settimeout(TIMEOUT_S)
    return srv


def serve(srv: socket.socket) -> None:
    """Answer one sender on ``srv`` (closed afterwards): each ping, then read the stream to its end and acknowledge."""
    with srv:
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(TIMEOUT_S)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(ROUNDS):
            if not conn.recv(1):
                raise ConnectionError("the sender closed during the round trips")
            conn.sendall(b"q")
        while conn.recv(BLOCK):
            pass
        conn.sendall(b"k")


def send(host: str, port: int, nbytes: int) -> tuple[float, int, float]:
    """To a :func:`serve` at ``host:port``: the median round trip (s), the bytes streamed (``nbytes`` rounded
    up to whole blocks) and the seconds from the first block to the server's acknowledgement of the last."""
    with socket.create_connection((host, port), TIMEOUT_S) as s:
        s.settimeout(TIMEOUT_S)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(ROUNDS):
            t = time.perf_counter()
            s.sendall(b"p")
            if not s.recv(1):
                raise ConnectionError("the server closed during the round trips")
            rtts.append(time.perf_counter() - t)
        block, sent = b"x" * BLOCK, 0
        t = time.perf_counter()
        while sent < nbytes:
            s.sendall(block)
            sent += len(block)
        s.shutdown(socket.SHUT_WR)
        if s.recv(1) != b"k":
            raise ConnectionError("the server did not acknowledge the stream")
        return sorted(rtts)[len(rtts) // 2], sent, time.perf_counter() - t


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) == 2:
        srv = listener(argv[1])
        print(srv.getsockname()[1], flush=True)
        serve(srv)
    elif argv[:1] == ["send"] and len(argv) == 4:
        print(*send(argv[1], int(argv[2]), int(argv[3])))
    else:
        raise SystemExit("usage: python -m bench.net.probe serve ADDRESS | send ADDRESS PORT BYTES")


if __name__ == "__main__":
    main(sys.argv[1:])
