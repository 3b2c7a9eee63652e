"""Fuzzing the network surfaces with random and malformed frames (seeded, no Spark): the wire
decoder, the parameter server (before and after authentication), a ring rank's listener during
the rendezvous, and a ring link's data phase. Nothing may crash, hang or grow memory."""

import json
import random
import socket
import threading
import time

import numpy as np
import pytest
from helpers import settle

from sparkdl_train import net, wire
from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce.local import ThreadGroup
from sparkdl_train.allreduce.transport import DATA, FRAME, MAGIC, RingError, TcpLink, rendezvous
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState

SECRET = b"f" * 32


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One random mutation: bit flips, truncation, insertion, duplication or splice."""
    b = bytearray(data)
    op = rng.randrange(6)
    if op == 0 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == 1:
        b = b[: rng.randrange(len(b) + 1)]
    elif op == 2:
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = rng.randbytes(rng.randint(1, 64))
    elif op == 3 and b:
        pos = rng.randrange(len(b))
        b[pos : pos + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff"])
    elif op == 4:
        b = b + b[: rng.randrange(len(b) + 1)]
    else:
        b = rng.randbytes(rng.randint(0, 200))
    return bytes(b)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_wire_decoder_raises_only_frame_errors():
    rng = random.Random(1)
    good = [
        wire.encode({"k": 1, "rows": [1, 2]}, [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, 5], np.int64)]),
        wire.encode({}, []),
        wire.encode({"x": "y"}, [np.zeros(0, np.float16), np.ones((2, 2, 2), np.uint8)]),
    ]
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(5000):
        data = mutate(rng, rng.choice(good))
        try:
            meta, arrays = wire.decode(data)
        except wire.FrameError:
            outcomes["rejected"] += 1
            continue
        outcomes["ok"] += 1
        assert isinstance(meta, dict)
        assert all(a.dtype.kind in "biuf" for a in arrays)
    assert outcomes["rejected"] > 2500 and outcomes["ok"] > 0, outcomes


def _frames() -> list[bytes]:
    """Valid frames of every kind a worker sends, to mutate."""
    out = []

    class Sink:
        def sendall(self, data):
            out[-1] += bytes(data)

    for kind, meta, arrays in [
        (net.Msg.HELLO, {"worker": 0, "nonce": "ab" * 16}, []),
        (net.Msg.AUTH, {"proof": "00" * 32}, []),
        (net.Msg.PULL, {"want": []}, []),
        (net.Msg.PUSH, {"base_version": 0, "samples": 8}, [np.ones((4, 3), np.float32), np.ones(3, np.float32)]),
        (net.Msg.PUSH, {"base_version": 3, "samples": 2, "rows": [0]},
         [np.array([1, 2], np.int64), np.ones((2, 3), np.float32), np.ones(3, np.float32)]),
        (net.Msg.DONE, {}, []),
    ]:
        out.append(b"")
        net.send(Sink(), kind, meta, arrays)
    return out


def _fuzz_connection(rng: random.Random, port: int, frames: list[bytes]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
    except OSError:
        return
    with s:
        s.settimeout(3)
        try:
            if rng.random() < 0.5:  # authenticate first, then misbehave
                net.client_handshake(s, rng.randrange(4), SECRET)
            for _ in range(rng.randint(1, 4)):
                s.sendall(mutate(rng, rng.choice(frames)))
            if rng.random() < 0.5:
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
        except OSError:
            pass


def test_parameter_server_survives_random_and_malformed_frames():
    weights = [np.zeros((4, 3), np.float32), np.zeros(3, np.float32)]
    state = ServerState(weights, "asynchronous", sparse=[0])
    server = ParameterServer(state, "127.0.0.1", SECRET, handshake_timeout=2.0, idle_timeout=5.0)
    frames = _frames()
    with server:
        port = server.address[1]

        def burst(seed, n):
            rng = random.Random(seed)
            for _ in range(n):
                _fuzz_connection(rng, port, frames)

        def run(round_, n):
            threads = [threading.Thread(target=burst, args=(round_ * 10 + i, n)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads)

        run(0, 50)  # warm-up: buffers, thread stacks and imports reach their steady size
        before = rss_mb()
        run(1, 150)
        grown = rss_mb() - before
        settle(lambda: server.threads_alive() <= 1, 10)
        assert server.threads_alive() == 1, "only the accept thread remains"
        assert state.stats.as_dict()["rejected_connections"] > 50
        # still serving: a well-behaved worker pulls and pushes
        with PSClient("127.0.0.1", port, SECRET, worker=9, connect_timeout=5) as client:
            version, arrays = client.pull(None)
            assert [a.shape for a in arrays] == [(4, 3), (3,)]
    assert grown < 25, f"RSS grew by {grown:.1f} MiB over 600 fuzz connections"
    assert server.threads_alive() == 0


def test_ring_listener_ignores_fuzz_during_rendezvous():
    rng = random.Random(3)
    groups = ThreadGroup.create(2)
    original = groups[0].all_gather
    hello = b""

    class Sink:
        def sendall(self, data):
            nonlocal hello
            hello += bytes(data)

    net.send(Sink(), net.Msg.HELLO, {"rank": 0, "nonce": "cd" * 16})

    def gather_and_fuzz(message):
        out = original(message)
        port = json.loads(out[1])["port"]  # rank 1's listener
        for _ in range(40):
            payload = mutate(rng, hello) if rng.random() < 0.7 else rng.randbytes(rng.randint(0, 300))
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
            except OSError:  # the listener's backlog may be full while rank 1 is mid-handshake
                pass
        return out

    groups[0].all_gather = gather_and_fuzz
    bufs = [np.full(1000, r + 1.0, np.float32) for r in range(2)]
    errors = [None, None]

    def work(r):
        try:
            with rendezvous(groups[r], "127.0.0.1", SECRET, 20.0, 60.0) as link:
                ring.allreduce_sum(bufs[r], link, r, 2)
        except BaseException as exc:  # noqa: BLE001
            errors[r] = exc

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == [None, None], errors
    assert np.all(bufs[0] == 3.0) and np.all(bufs[1] == 3.0)


def test_ring_link_rejects_malformed_data_frames():
    rng = random.Random(4)
    payload = np.arange(256, dtype=np.float32)
    good = FRAME.pack(MAGIC, DATA, 1, payload.nbytes) + payload.tobytes()
    before = rss_mb()
    for i in range(300):
        a, b = socket.socketpair()
        out_a, out_b = socket.socketpair()
        link = TcpLink(1, 2, out_a, a, timeout=1.0)
        try:
            data = mutate(rng, good)
            try:
                b.sendall(data)
            except OSError:
                pass
            b.shutdown(socket.SHUT_WR)
            buf = np.empty(256, np.float32)
            start = time.monotonic()
            try:
                link.recv_into(memoryview(buf).cast("B"))
                assert data[: len(good)] == good or FRAME.unpack(data[: FRAME.size])[3] == payload.nbytes
            except RingError:
                pass
            assert time.monotonic() - start < 3
        finally:
            link.close()
            for s in (b, out_b):
                s.close()
    assert rss_mb() - before < 25


@pytest.mark.parametrize("seed", range(3))
def test_protocol_recv_raises_only_protocol_errors(seed):
    rng = random.Random(100 + seed)
    frames = _frames()
    for _ in range(400):
        a, b = socket.socketpair()
        with a, b:
            a.settimeout(1.0)
            b.sendall(mutate(rng, rng.choice(frames)))
            b.shutdown(socket.SHUT_WR)
            try:
                kind, meta, arrays, _ = net.recv(a, 1 << 20)
                assert isinstance(meta, dict)
            except (net.ProtocolError, ConnectionError):
                pass
