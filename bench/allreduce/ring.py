"""Ring allreduce throughput against the bandwidth bound, measured in one run.

For N local processes and a buffer of M bytes, a bandwidth-optimal allreduce
moves 2 (N-1)/N * M bytes through every rank's link, so it cannot take less
than ``T* = 2 (N-1)/N * M / B``, where B is the bandwidth of one link. B is
measured here, in the same run, over the very sockets the ring uses, with raw
``sendall`` / ``recv_into`` and no framing, reduction or Python loop:

* ``B_ring``: every rank sends to the next while receiving from the previous
  one, all links at once (the ring's own traffic pattern). On loopback all
  links share the same CPUs and memory bus, which a real NIC-per-host cluster
  does not, so this is the bound the target applies to: ``ratio = T / T*``.
* ``B_pair``: one link alone (rank 0 -> 1, the others idle), for reference.

Usage: ``python -m bench.allreduce.ring [--sizes-mb 1 10 100] [--ranks 2 3] [--repeats 5] [--fp16 | --bf16]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import threading
import time

import numpy as np

from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce.transport import rendezvous  # noqa: E402
from sparkdl_train.halfwidth import BF16

TARGET = 1.3


class ProcessGroup:
    """all_gather across local processes (a manager list and a barrier)."""

    def __init__(self, rank, size, slots, barrier):
        self.rank, self.size, self._slots, self._barrier = rank, size, slots, barrier

    def all_gather(self, message):
        self._slots[self.rank] = message
        self._barrier.wait(60)
        out = list(self._slots)
        self._barrier.wait(60)
        return out

    def barrier(self):
        self._barrier.wait(120)


def _raw_ring(link, out, inc, send_enabled, recv_enabled):
    """Raw sockets: send ``out`` to next while receiving ``len(inc)`` bytes from prev into ``inc``
    (both allocated and touched before the clock starts)."""
    nbytes = len(inc)
    err = []

    def sender():
        try:
            link.to_next.sendall(memoryview(out))
        except BaseException as e:  # noqa: BLE001
            err.append(e)

    t = threading.Thread(target=sender) if send_enabled else None
    start = time.perf_counter()
    if t:
        t.start()
    if recv_enabled:
        view, pos = memoryview(inc), 0
        while pos < nbytes:
            pos += link.from_prev.recv_into(view[pos:], nbytes - pos)
    if t:
        t.join()
    if err:
        raise err[0]
    return time.perf_counter() - start


def _rank_main(rank, size, slots, barrier, sizes_mb, repeats, fp16, results, tls=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    group = ProcessGroup(rank, size, slots, barrier)
    link = rendezvous(group, "127.0.0.1", b"bench-secret-0123456789abcdef0123", 120, 60, tls=tls)
    out = {}
    try:
        for mb in sizes_mb:
            nbytes = int(mb * 1_000_000)
            n = nbytes // 4
            buf = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
            work = buf.copy()
            wire = {"fp16": np.float16, "bf16": BF16}.get(fp16) if isinstance(fp16, str) else (np.float16 if fp16 else None)
            per_link = ring.bytes_per_rank(nbytes, size)
            raw_out, raw_in = np.ones(per_link, np.uint8), np.ones(per_link, np.uint8)
            times = {"ring": [], "pair": [], "allreduce": []}
            for rep in range(repeats + 1):  # first round warms up buffers and sockets
                group.barrier()
                t_ring = _raw_ring(link, raw_out, raw_in, True, True)
                group.barrier()
                t_pair = _raw_ring(link, raw_out, raw_in, rank == 0, rank == 1)
                group.barrier()
                work[...] = buf
                start = time.perf_counter()
                ring.allreduce_sum(work, link, rank, size, wire_dtype=wire)
                t_ar = time.perf_counter() - start
                if rep:
                    times["ring"].append(t_ring)
                    times["pair"].append(t_pair)
                    times["allreduce"].append(t_ar)
            out[mb] = {k: statistics.median(v) for k, v in times.items()}
            out[mb]["per_link_bytes"] = per_link
    finally:
        link.close()
    results[rank] = json.dumps(out)


def run(size, sizes_mb, repeats, fp16, tls=None):
    ctx = mp.get_context("spawn")
    with ctx.Manager() as mgr:
        slots = mgr.list([None] * size)
        results = mgr.dict()
        barrier = ctx.Barrier(size)
        procs = [ctx.Process(target=_rank_main, args=(r, size, slots, barrier, sizes_mb, repeats, fp16, results, tls)) for r in range(size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(900)
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        per_rank = [json.loads(results[r]) for r in range(size)]
    rows = []
    for mb in sizes_mb:
        key = str(mb)
        t_ar = max(r[key]["allreduce"] for r in per_rank)  # the collective ends when the slowest rank does
        t_ring = max(r[key]["ring"] for r in per_rank)
        t_pair = per_rank[1][key]["pair"]
        per_link = per_rank[0][key]["per_link_bytes"]
        b_ring, b_pair = per_link / t_ring, per_link / t_pair
        bound_ring = per_link / b_ring
        bound_pair = per_link / b_pair
        rows.append({
            "ranks": size, "MB": mb, "allreduce_s": t_ar, "B_ring_GBps": b_ring / 1e9, "B_pair_GBps": b_pair / 1e9,
            "ratio": t_ar / bound_ring, "ratio_vs_pair": t_ar / bound_pair,
        })
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fp16", action="store_true", help="fp16 on the wire (the bound still counts fp32 bytes)")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 on the wire (the bound still counts fp32 bytes)")
    args = ap.parse_args()
    wire = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    print(f"bench/allreduce/ring.py  cpus={os.cpu_count()}  numpy={np.__version__}  wire={wire or 'fp32'}  repeats={args.repeats} (median)")
    print(f"{'N':>2} {'MB':>6} {'allreduce s':>12} {'B_ring GB/s':>12} {'B_pair GB/s':>12} {'T/T*(ring)':>11} {'T/T*(pair)':>11}")
    worst = 0.0
    for size in args.ranks:
        for row in run(size, args.sizes_mb, args.repeats, wire):
            worst = max(worst, row["ratio"])
            print(f"{row['ranks']:>2} {row['MB']:>6g} {row['allreduce_s']:>12.4f} {row['B_ring_GBps']:>12.2f} "
                  f"{row['B_pair_GBps']:>12.2f} {row['ratio']:>11.2f} {row['ratio_vs_pair']:>11.2f}")
    print(f"worst ratio T/T* (B_ring) = {worst:.2f}  (target <= {TARGET})  {'OK' if worst <= TARGET else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
