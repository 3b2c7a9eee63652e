"""In-process stand-ins for tests and benchmarks: a thread group and an in-memory ring."""

from __future__ import annotations

import queue
import threading
from typing import Callable

from .ring import DEFAULT_CHUNK_BYTES


class ThreadGroup:
    """``size`` ranks as threads of one process; ``all_gather`` like BarrierTaskContext's."""

    class _Shared:
        def __init__(self, size: int, timeout: float):
            self.size = size
            self.timeout = timeout
            self.slots: list[str | None] = [None] * size
            self.barrier = threading.Barrier(size)

    def __init__(self, shared: "ThreadGroup._Shared", rank: int):
        self._shared = shared
        self.rank = rank
        self.size = shared.size

    @classmethod
    def create(cls, size: int, timeout: float = 30.0) -> list["ThreadGroup"]:
        shared = cls._Shared(size, timeout)
        return [cls(shared, r) for r in range(size)]

    def all_gather(self, message: str) -> list[str]:
        s = self._shared
        s.slots[self.rank] = message
        s.barrier.wait(s.timeout)
        out = list(s.slots)  # type: ignore[arg-type]
        s.barrier.wait(s.timeout)
        return out  # type: ignore[return-value]


class MemoryRing:
    """A ring of in-memory links (queues); bytes are copied like a socket would."""

    def __init__(self, size: int, timeout: float = 30.0):
        self.size = size
        self.timeout = timeout
        self.edges = [queue.Queue() for _ in range(size)]  # edges[r]: into rank r

    def link(self, rank: int) -> "MemoryLink":
        return MemoryLink(self, rank)


class MemoryLink:
    def __init__(self, ring: MemoryRing, rank: int):
        self.ring, self.rank = ring, rank
        self.bytes_sent = 0
        self.bytes_received = 0

    def send(self, data: memoryview) -> None:
        self.ring.edges[(self.rank + 1) % self.ring.size].put(bytes(data))
        self.bytes_sent += len(data)

    def recv_into(self, buf: memoryview, on_chunk: Callable[[int, int], None] | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        data = self.ring.edges[self.rank].get(timeout=self.ring.timeout)
        if len(data) != len(buf):
            raise ValueError(f"rank {self.rank}: expected {len(buf)} bytes, got {len(data)}")
        for lo in range(0, len(buf), chunk_bytes):
            hi = min(len(buf), lo + chunk_bytes)
            buf[lo:hi] = data[lo:hi]
            if on_chunk is not None:
                on_chunk(lo, hi)
        self.bytes_received += len(buf)

    def exchange(self, send, recv, on_chunk=None, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.send(send)
        self.recv_into(recv, on_chunk, chunk_bytes)
