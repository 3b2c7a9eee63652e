"""The parameter server's table shards (``ps.tableShards``): pushes/s of the server's own work.

The CTR job's shape: a table of 1M ids x 9 floats and 65 KB of dense weights, asynchronous mode;
each push carries 13,224 distinct rows (a batch of 512 x 26 fields, uniform draws) and asks for
the same rows back. ``--threads`` threads push at once into one :class:`ServerState` (no sockets:
the work a server does under and around its lock), with 1 shard (everything under the state's
lock) against more (rows added and gathered range by range, each range under its own lock).
Ratios are against 1 shard with the same threads, measured in the same run, alternating.

    python -m bench.ps.shards [--threads 1 2] [--shards 1 2 4] [--pushes 150] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np

from sparkdl_train.ps.state import ServerState, SparseRows  # noqa: E402


def pushes_per_second(shards: int, threads: int, pushes: int, deltas: list, table_rows: int, width: int) -> float:
    table = np.zeros((table_rows, width), np.float32)
    dense = np.zeros(65 * 1024 // 4, np.float32)
    state = ServerState([table, dense], "asynchronous", sparse=[0], shards=shards)
    start = threading.Barrier(threads + 1)

    def worker(w: int) -> None:
        start.wait()
        for k in range(pushes):
            ids, rows, d = deltas[(w * pushes + k) % len(deltas)]
            state.release(state.push(w, 0, [SparseRows(ids, rows), d], 512, want={0: ids}))

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return threads * pushes / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--pushes", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--table-rows", type=int, default=1 << 20)
    ap.add_argument("--width", type=int, default=9)
    ap.add_argument("--draws", type=int, default=512 * 26)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    deltas = []
    for _ in range(16):
        ids = np.unique(rng.integers(0, args.table_rows, args.draws)).astype(np.int64)
        deltas.append((ids, rng.standard_normal((len(ids), args.width)).astype(np.float32) * 1e-3,
                       np.zeros(65 * 1024 // 4, np.float32)))
    rows = statistics.mean(len(d[0]) for d in deltas)
    print(f"bench/ps/shards.py  table {args.table_rows} x {args.width} float32, {rows:.0f} rows per push, "
          f"{args.pushes} pushes per thread, medians of {args.repeats}, cpus={os.cpu_count()}")
    result = {}
    for threads in args.threads:
        got: dict[int, list[float]] = {s: [] for s in args.shards}
        pushes_per_second(1, threads, 10, deltas, args.table_rows, args.width)  # warm
        for _ in range(args.repeats):
            for s in args.shards:
                got[s].append(pushes_per_second(s, threads, args.pushes, deltas, args.table_rows, args.width))
        base = statistics.median(got[args.shards[0]])
        for s in args.shards:
            med = statistics.median(got[s])
            result[f"{threads} threads, {s} shards"] = {"pushes_per_s": med, "ratio": med / base}
            print(f"  {threads} thread(s), {s} shard(s): {med:7.0f} pushes/s  ({med / base:.2f}x)")
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()
