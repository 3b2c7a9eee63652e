"""Parameter-server transport: push + pull throughput vs a raw loopback socket.

For a model of M bytes, one PS round trip sends an M-byte delta (framed, from
numpy buffers, no copies), the server applies it (copy-on-write add, async
mode) and sends the M-byte weights back. The baseline, measured in the same
run, is a raw TCP echo on loopback: ``sendall`` M bytes, the peer ``recv_into``
a preallocated buffer and ``sendall``s them back. Both servers are threads of
this process. The printed ratio is baseline_time / ps_time (target >= 0.5).

    python -m bench.ps.transport [--sizes-mb 10 100] [--reps 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import numpy as np

from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState


def model_arrays(nbytes: int) -> list[np.ndarray]:
    # a few tensors of uneven size, like a real model (embedding, dense kernels, biases)
    n = nbytes // 4
    sizes = [n * 6 // 10, n * 3 // 10, n // 10 - 1000, 1000]
    return [np.random.default_rng(i).random(s, dtype=np.float32) for i, s in enumerate(sizes)]


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        n = sock.recv_into(view[pos:])
        if not n:
            raise ConnectionError("closed")
        pos += n


def raw_echo_seconds(nbytes: int, reps: int) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    payload = np.ones(nbytes, np.uint8)

    def serve() -> None:
        conn, _ = listener.accept()
        buf = bytearray(nbytes)
        view = memoryview(buf)
        for _ in range(reps + 1):
            _recv_into(conn, view)
            conn.sendall(view)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = memoryview(bytearray(nbytes))
    times = []
    for i in range(reps + 1):  # first round trip warms up
        start = time.perf_counter()
        client.sendall(memoryview(payload))
        _recv_into(client, back)
        if i:
            times.append(time.perf_counter() - start)
    client.close()
    t.join()
    listener.close()
    return times


def ps_seconds(nbytes: int, reps: int, tls=None) -> list[float]:
    """Seconds per push + pull round trip; with ``tls`` (a TlsIdentity) over TLS."""
    weights = model_arrays(nbytes)
    secret = b"bench-secret-000000000000000000"
    server = ParameterServer(ServerState(weights, "asynchronous"), "127.0.0.1", secret, tls=tls).start()
    try:
        client = PSClient(*server.address, secret, worker=0, tls=tls.for_clients() if tls is not None else None)
        delta = [np.full_like(w, 1e-3) for w in weights]
        version, _ = client.pull()
        times = []
        for i in range(reps + 1):
            start = time.perf_counter()
            version, fresh = client.push(delta, version, 1)
            if i:
                times.append(time.perf_counter() - start)
        assert abs(float(fresh[0][0]) - float(weights[0][0]) - (reps + 1) * 1e-3) < 1e-4
        client.done()
        client.close()
    finally:
        server.stop()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    print(f"{'model':>8} {'raw echo MB/s':>14} {'PS push+pull MB/s':>18} {'ratio':>6}  (target >= 0.5)")
    worst = float("inf")
    for mb in args.sizes_mb:
        nbytes = int(mb * 1e6)
        raw = statistics.median(raw_echo_seconds(nbytes, args.reps))
        ps = statistics.median(ps_seconds(nbytes, args.reps))
        ratio = raw / ps
        worst = min(worst, ratio)
        moved = 2 * nbytes / 1e6
        print(f"{mb:>6.0f}MB {moved / raw:>14.0f} {moved / ps:>18.0f} {ratio:>6.2f}")
    print(f"worst ratio {worst:.2f}: {'meets' if worst >= 0.5 else 'MISSES'} the 0.5 target")


if __name__ == "__main__":
    main()
