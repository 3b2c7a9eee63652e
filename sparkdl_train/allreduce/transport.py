"""TCP links of the ring: rendezvous, mutual authentication, framed exchanges.

Each rank keeps two connections: one *to* the next rank (it only sends there)
and one *from* the previous rank (it only receives there). A message is a
20-byte header (magic ``SDAR``, type, sequence number, length) and raw bytes:
both sides know every size from the ring schedule, so the header is only
checked, never trusted to allocate. Nothing is ever unpickled; an abort
message carries UTF-8 JSON.

An exchange (send to next while receiving from previous) runs in the calling
thread over non-blocking sockets and a selector, writing and reading whichever
is ready, so neither side can block the other however large the segment; the
received bytes are handed to the reduction chunk by chunk as they arrive.
Every wait has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from .. import net
from ..net import ports as port_range
from .ring import DEFAULT_CHUNK_BYTES

log = logging.getLogger(__name__)

MAGIC = b"SDAR"
FRAME = struct.Struct("<4sB3xIQ")
DATA = 1
ABORT = 2
INLINE_BYTES = 32 * 1024  # small sends are joined with their header
# a non-blocking send or receive that cannot make progress now (plain TCP, or TLS)
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
MAX_ABORT_BYTES = 64 * 1024


class RingError(ConnectionError):
    """The ring broke: a peer closed, timed out or sent something unexpected."""


class RingTimeout(RingError, TimeoutError):
    """A peer sent nothing within the timeout (a slow or dead rank)."""


class PeerAborted(RingError):
    """Another rank failed and told the ring; carries that rank and its traceback."""

    def __init__(self, origin: int, detail: str):
        super().__init__(f"rank {origin} failed:\n{detail}")
        self.origin = origin
        self.detail = detail

    def __reduce__(self):
        return (PeerAborted, (self.origin, self.detail))


class Group(Protocol):
    """Who is in the ring: Spark's BarrierTaskContext on executors, threads in tests."""

    rank: int
    size: int

    def all_gather(self, message: str) -> list[str]: ...


# -- one link ------------------------------------------------------------------------

class TcpLink:
    """A rank's place in the ring over TCP (see :class:`sparkdl_train.allreduce.ring.Link`)."""

    def __init__(self, rank: int, size: int, to_next: socket.socket, from_prev: socket.socket, timeout: float):
        self.rank, self.size = rank, size
        self.next_rank, self.prev_rank = (rank + 1) % size, (rank - 1) % size
        self.to_next, self.from_prev = to_next, from_prev
        self.timeout = timeout
        for s in (to_next, from_prev):
            s.settimeout(timeout)
        # where each neighbour is ("host:port"), named in errors: on a cluster, the host whose link or
        # process failed
        self.addresses = {self.next_rank: _peer(to_next), self.prev_rank: _peer(from_prev)}
        self._send_seq = 0
        self._recv_seq = 0
        self._head = bytearray(FRAME.size)
        self.bytes_sent = 0
        self.bytes_received = 0

    # sending
    def _frame(self, kind: int, n: int) -> bytes:
        self._send_seq += 1
        return FRAME.pack(MAGIC, kind, self._send_seq & 0xFFFFFFFF, n)

    def send(self, data: memoryview) -> None:
        head = self._frame(DATA, len(data))
        try:
            with self._errors("send to", self.next_rank):
                if len(data) <= INLINE_BYTES:
                    self.to_next.sendall(head + bytes(data))
                else:
                    self.to_next.sendall(head)
                    self.to_next.sendall(data)
        except RingError:
            self._raise_pending_abort()
            raise
        self.bytes_sent += len(data)

    def _raise_pending_abort(self) -> None:
        """After a failed send: if the previous rank has an abort waiting for us, report that
        (the rank that failed first) rather than our own broken pipe."""
        try:
            self.from_prev.settimeout(0.5)
            head = memoryview(self._head)
            self._recv_exact(head)
            if FRAME.unpack(head)[1] == ABORT:
                self._check_header(0)  # raises PeerAborted
        except (OSError, ValueError):
            pass
        finally:
            try:
                self.from_prev.settimeout(self.timeout)
            except OSError:
                pass

    # receiving
    def _recv_exact(self, view: memoryview) -> None:
        pos, n = 0, len(view)
        while pos < n:
            got = self.from_prev.recv_into(view[pos:], n - pos)
            if got == 0:
                raise ConnectionError(f"connection closed after {pos} of {n} bytes")
            pos += got

    def _recv_header(self, expected: int) -> None:
        head = memoryview(self._head)
        self._recv_exact(head)
        self._check_header(expected)

    def _check_header(self, expected: int) -> None:
        head = memoryview(self._head)
        magic, kind, seq, length = FRAME.unpack(head)
        if magic != MAGIC:
            raise RingError(f"rank {self.rank}: bad frame from rank {self.prev_rank} (magic {bytes(magic)!r})")
        if kind == ABORT:
            if length > MAX_ABORT_BYTES:
                raise RingError(f"rank {self.rank}: oversized abort message from rank {self.prev_rank}")
            body = bytearray(length)
            self._recv_exact(memoryview(body))
            try:
                info = json.loads(body.decode("utf-8"))
                raise PeerAborted(int(info["rank"]), str(info["error"]))
            except (ValueError, KeyError, TypeError):
                raise RingError(f"rank {self.rank}: malformed abort message from rank {self.prev_rank}") from None
        self._recv_seq += 1
        if kind != DATA or seq != self._recv_seq & 0xFFFFFFFF or length != expected:
            raise RingError(
                f"rank {self.rank}: out-of-step frame from rank {self.prev_rank} "
                f"(type {kind}, seq {seq} != {self._recv_seq}, {length} bytes != {expected})"
            )

    def recv_into(self, buf: memoryview, on_chunk: Callable[[int, int], None] | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        with self._errors("receive from", self.prev_rank):
            self._recv_header(len(buf))
            if on_chunk is None:
                self._recv_exact(buf)
            else:
                for lo in range(0, len(buf), chunk_bytes):
                    hi = min(len(buf), lo + chunk_bytes)
                    self._recv_exact(buf[lo:hi])
                    on_chunk(lo, hi)
        self.bytes_received += len(buf)

    def exchange(self, send: memoryview, recv: memoryview, on_chunk=None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        """One thread, non-blocking sockets: write to next and read from prev, trying both
        before each wait and waiting (``poll``) only when neither can make progress."""
        out = [memoryview(self._frame(DATA, len(send))), send]
        out_i = out_pos = 0
        hview = memoryview(self._head)
        got_head = pos = done_to = 0
        n = len(recv)
        nxt, prv = self.to_next, self.from_prev
        nxt.setblocking(False)
        prv.setblocking(False)
        sending = receiving = True
        try:
            try:
                while True:
                    if sending:
                        with self._errors("send to", self.next_rank):
                            try:
                                while out_i < 2:
                                    part = out[out_i]
                                    out_pos += nxt.send(part[out_pos:out_pos + (4 << 20)])
                                    if out_pos >= len(part):
                                        out_i, out_pos = out_i + 1, 0
                            except WOULD_BLOCK:
                                pass
                        sending = out_i < 2
                    if receiving:
                        with self._errors("receive from", self.prev_rank):
                            try:
                                while True:
                                    if got_head < FRAME.size:
                                        k = prv.recv_into(hview[got_head:], FRAME.size - got_head)
                                        if k == 0:
                                            raise ConnectionError("connection closed")
                                        got_head += k
                                        if got_head == FRAME.size:
                                            if FRAME.unpack(hview)[1] == ABORT:
                                                prv.settimeout(self.timeout)
                                            self._check_header(n)
                                            if n == 0:
                                                break
                                        continue
                                    k = prv.recv_into(recv[pos:], n - pos)
                                    if k == 0:
                                        raise ConnectionError("connection closed")
                                    pos += k
                                    while on_chunk is not None and done_to < n and pos - done_to >= min(chunk_bytes, n - done_to):
                                        hi = min(n, done_to + chunk_bytes)
                                        on_chunk(done_to, hi)
                                        done_to = hi
                                    if pos >= n:
                                        break
                            except WOULD_BLOCK:
                                pass
                        receiving = got_head < FRAME.size or pos < n
                    if not (sending or receiving):
                        break
                    poller = select.poll()
                    if sending:
                        poller.register(nxt, select.POLLOUT)
                    if receiving:
                        poller.register(prv, select.POLLIN)
                    if not poller.poll(self.timeout * 1000):
                        peer, what = (self.prev_rank, "receive from") if receiving else (self.next_rank, "send to")
                        with _translate(self.rank, what, peer, self.timeout, self.addresses.get(peer)):
                            raise socket.timeout()
            except RingError as err:
                if got_head == 0 and not isinstance(err, PeerAborted):
                    self._raise_pending_abort()
                raise
        finally:
            nxt.settimeout(self.timeout)
            prv.settimeout(self.timeout)
        self.bytes_sent += len(send)
        self.bytes_received += n

    def _errors(self, what: str, peer: int):
        return _translate(self.rank, what, peer, self.timeout, self.addresses.get(peer))

    # failure and shutdown
    def abort(self, origin: int, detail: str) -> None:
        """Tell the next rank (best effort, short timeout) that ``origin`` failed."""
        body = json.dumps({"rank": origin, "error": detail[-(MAX_ABORT_BYTES // 2):]}).encode("utf-8")
        try:
            self.to_next.settimeout(2.0)
            self.to_next.sendall(FRAME.pack(MAGIC, ABORT, 0, len(body)) + body)
        except OSError:
            pass

    def close(self) -> None:
        for s in (self.to_next, self.from_prev):
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "TcpLink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _peer(sock: socket.socket) -> str | None:
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, ValueError):
        return None
    return f"{host}:{port}"


class _translate:
    """Turn socket errors into RingError naming this rank, the peer (and its address) and the timeout."""

    def __init__(self, rank: int, what: str, peer: int, timeout: float, address: str | None = None):
        self.rank, self.what, self.timeout = rank, what, timeout
        self.peer = f"{peer} at {address}" if address else str(peer)

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is None or isinstance(exc, RingError):
            return False
        if isinstance(exc, (socket.timeout, TimeoutError)):
            raise RingTimeout(
                f"rank {self.rank}: timed out after {self.timeout:g} s waiting to {self.what} rank {self.peer} "
                "(that rank is dead, stuck or much slower; see spark.sparkdl_train.allreduce.timeout)"
            ) from None
        if isinstance(exc, OSError):
            raise RingError(f"rank {self.rank}: lost the connection to rank {self.peer} ({self.what}): {exc}") from None
        return False


# -- rendezvous ------------------------------------------------------------------------

@dataclass(frozen=True)
class Peer:
    host: str
    port: int
    token: str


def _proof(secret: bytes, role: str, session: bytes, a: bytes, b: bytes) -> str:
    return net.proof(secret, role.encode() + b"|" + session, a, b)


def listen(host: str, ports: tuple[int, int] | None = None) -> socket.socket:
    """The rank's listening socket: bound (port 0, or a port of ``network.ports``) before its address is
    published, kept open."""
    return port_range.listener(host, ports, "ring listener")


def rendezvous(group: Group, host: str, secret: bytes, timeout: float, connect_timeout: float,
               tls: net.TlsIdentity | None = None, ports: tuple[int, int] | None = None) -> TcpLink | None:
    """Bind, publish ``host:port`` through ``group.all_gather``, then connect the ring.

    Returns ``None`` for a ring of one. The session id mixes a fresh token from
    every rank, so a connection from another fit, attempt or epoch is refused. With
    ``tls`` (the fit's shared identity) both links are TLS, the peer's certificate pinned.
    """
    rank, size = group.rank, group.size
    if size == 1:
        return None
    listener = listen(host, ports)
    try:
        port = listener.getsockname()[1]
        token = net.new_nonce().hex()
        raw = group.all_gather(json.dumps({"host": host, "port": port, "token": token}))
        peers = _parse_peers(raw, size)
        session = hashlib.sha256("|".join(p.token for p in peers).encode()).digest()
        return _connect(rank, size, listener, peers, secret, session, timeout, connect_timeout, tls)
    finally:
        listener.close()


def _parse_peers(raw: Sequence[str], size: int) -> list[Peer]:
    if len(raw) != size:
        raise RingError(f"rendezvous returned {len(raw)} addresses for {size} ranks")
    peers = []
    for i, m in enumerate(raw):
        try:
            d = json.loads(m)
            peers.append(Peer(str(d["host"]), int(d["port"]), str(d["token"])))
        except (ValueError, KeyError, TypeError):
            raise RingError(f"rendezvous message of rank {i} is malformed") from None
    return peers


def _connect(rank, size, listener, peers, secret, session, timeout, connect_timeout, tls=None) -> TcpLink:
    """Authenticate both ring neighbours. The outgoing side (to the next rank) runs here; the
    incoming side (accepting the previous rank) runs on a helper thread, so a stray or forged
    connection that holds the listener cannot block this rank from answering its next
    neighbour (which would stall the whole ring)."""
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    deadline = time.monotonic() + connect_timeout
    out = _dial(peers[nxt], nxt, deadline, rank)
    stop = threading.Event()
    box: dict[str, Any] = {}

    def incoming() -> None:
        try:
            box["sock"] = _accept_prev(listener, prev, rank, secret, session, deadline, stop, tls)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc

    helper = threading.Thread(target=incoming, name=f"sparkdl_train-ring-accept-{rank}", daemon=True)
    try:
        out.settimeout(connect_timeout)
        if tls is not None:
            # the next rank completes the TLS handshake on its accepting thread: start ours first,
            # or every rank would wait in its handshake for a neighbour that is not yet accepting
            helper.start()
            out = net.wrap_client(out, tls, connect_timeout)
        c_nonce = net.new_nonce()
        # 1. HELLO to the next rank (small: lands in its buffer, no waiting)
        net.send(out, net.Msg.HELLO, {"rank": rank, "nonce": c_nonce.hex()})
        if tls is None:
            helper.start()
        # 2. the next rank's challenge: check it knows the secret, prove we do
        kind, meta, _, _ = net.recv(out, net.PREAUTH_MAX_BYTES)
        net.expect(net.Msg.CHALLENGE, kind, meta)
        n_nonce = bytes.fromhex(str(meta.get("nonce", "")))
        net.check_proof(_proof(secret, f"ring-server|{rank}|{nxt}", session, c_nonce, n_nonce), meta.get("proof"))
        net.send(out, net.Msg.AUTH, {"proof": _proof(secret, f"ring-client|{rank}|{nxt}", session, n_nonce, c_nonce)})
        # 3. the next rank accepted us
        kind, meta, _, _ = net.recv(out, net.PREAUTH_MAX_BYTES)
        net.expect(net.Msg.AUTH_OK, kind, meta)
        helper.join(max(0.0, deadline - time.monotonic()) + 1.0)
        if helper.is_alive():
            raise RingTimeout(f"rank {rank}: rank {prev} did not authenticate within the connect timeout")
        if "error" in box:
            raise box["error"]
        inc = box["sock"]
    except net.AuthError as exc:
        _abandon(out, stop, helper, box)
        raise RingError(f"rank {rank}: ring authentication failed: {exc}") from None
    except (socket.timeout, TimeoutError) as exc:
        _abandon(out, stop, helper, box)
        if isinstance(exc, RingTimeout):
            raise
        raise RingTimeout(f"rank {rank}: ring handshake timed out after {connect_timeout:g} s") from None
    except BaseException:
        _abandon(out, stop, helper, box)
        raise
    for s in (out, inc):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return TcpLink(rank, size, out, inc, timeout)


def _abandon(out: socket.socket, stop: threading.Event, helper: threading.Thread, box: dict[str, Any]) -> None:
    out.close()
    stop.set()
    if helper.is_alive():
        helper.join(2.0)
    sock = box.get("sock")
    if sock is not None:
        sock.close()


def _accept_prev(listener, prev, rank, secret, session, deadline, stop, tls=None) -> socket.socket:
    """Accept and authenticate the previous rank; connections that claim its rank but fail the
    handshake are dropped and accepting goes on until the deadline."""
    while True:
        inc, p_nonce, s_nonce = _accept(listener, prev, deadline, rank, stop, tls)
        try:
            net.send(inc, net.Msg.CHALLENGE, {
                "nonce": s_nonce.hex(),
                "proof": _proof(secret, f"ring-server|{prev}|{rank}", session, p_nonce, s_nonce),
            })
            kind, meta, _, _ = net.recv(inc, net.PREAUTH_MAX_BYTES)
            net.expect(net.Msg.AUTH, kind, meta)
            net.check_proof(_proof(secret, f"ring-client|{prev}|{rank}", session, s_nonce, p_nonce), meta.get("proof"))
            net.send(inc, net.Msg.AUTH_OK)
            return inc
        except (OSError, ValueError) as exc:  # ProtocolError and AuthError are ConnectionErrors
            log.warning("rank %d: dropped a connection claiming to be rank %d: %s", rank, prev, exc)
            inc.close()


def _dial(peer: Peer, peer_rank: int, deadline: float, rank: int) -> socket.socket:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return socket.create_connection((peer.host, peer.port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as exc:  # the listener exists before publication; retry only transient errors
            last = exc
            time.sleep(0.05)
    raise RingTimeout(f"rank {rank}: cannot connect to rank {peer_rank} at {peer.host}:{peer.port}: {last}")


def _accept(listener: socket.socket, prev: int, deadline: float, rank: int, stop: threading.Event | None = None,
            tls: net.TlsIdentity | None = None) -> tuple[socket.socket, bytes, bytes]:
    """Accept until the previous rank says HELLO; strays and wrong ranks are dropped."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RingTimeout(f"rank {rank}: rank {prev} did not connect within the connect timeout")
        if stop is not None and stop.is_set():
            raise RingError(f"rank {rank}: rendezvous abandoned")
        listener.settimeout(min(left, 0.5))
        try:
            conn, addr = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(max(0.1, min(left, 10.0)))
        try:
            conn = net.wrap_server(conn, tls, max(0.1, min(left, 10.0)))
            kind, meta, _, _ = net.recv(conn, net.PREAUTH_MAX_BYTES)
            if kind != net.Msg.HELLO or meta.get("rank") != prev:
                raise net.ProtocolError(f"unexpected {kind.name} from {addr}")
            nonce = bytes.fromhex(str(meta.get("nonce", "")))
            return conn, nonce, net.new_nonce()
        except (OSError, ValueError) as exc:
            log.warning("rank %d: dropped a connection from %s: %s", rank, addr, exc)
            conn.close()
