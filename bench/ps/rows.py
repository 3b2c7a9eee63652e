"""The parameter server's table-row work, numpy's fancy indexing against ``sparkdl_train/ps/rows.py``.

One push of the CTR job's shape: a table of 1M ids x 9 floats (DeepFM's 8-wide embedding and its
1-wide linear term), 8,192 distinct ids drawn per push, scatter-added, then the same ids gathered
for the reply. Measured in one run, per row:

* ``fancy``: ``table[ids] += rows`` and ``table[ids]`` (what the server did before);
* ``take/put``: ``rows.scatter_add`` and ``rows.gather`` (what it does now);
* the scatter alone, both ways (``table[ids] = rows`` against ``np.put`` on the row view);

and, for each, the speed-up of two threads applying the same pushes to two tables at once over one
thread doing both in turn: near 2 on 2 free cores when the calls release the interpreter's lock
(both ways do), near 1 when they hold it.

    python -m bench.ps.rows [--pushes 200] [--rows 8192] [--table-rows 1048576] [--width 9]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

from sparkdl_train.ps import rows as R  # noqa: E402


def fancy(table, view, ids, rows):
    table[ids] += rows
    return table[ids]


def take_put(table, view, ids, rows):
    R.scatter_add(table, view, ids, rows)
    return R.gather(table, ids)


def fancy_scatter(table, view, ids, rows):
    table[ids] = rows


def put_scatter(table, view, ids, rows):
    np.put(view, ids, R.row_view(rows))


def run(fn, tables, pushes, rows_of) -> None:
    views = [R.row_view(t) for t in tables]
    for ids in pushes:
        for t, v in zip(tables, views):
            fn(t, v, ids, rows_of[: len(ids)])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=200)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--table-rows", type=int, default=1 << 20)
    ap.add_argument("--width", type=int, default=9)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    tables = [np.ones((args.table_rows, args.width), np.float32) for _ in range(2)]
    pushes = [np.unique(rng.integers(0, args.table_rows, args.rows)) for _ in range(args.pushes)]
    rows_of = np.full((args.rows, args.width), 1e-6, np.float32)
    n_rows = sum(len(p) for p in pushes)
    results = {}
    cases = (("fancy", fancy), ("take/put", take_put), ("fancy scatter only", fancy_scatter), ("put scatter only", put_scatter))
    for name, fn in cases:
        one, two = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run(fn, tables, pushes, rows_of)  # one thread, both tables
            one.append(time.perf_counter() - start)
            threads = [threading.Thread(target=run, args=(fn, [t], pushes, rows_of)) for t in tables]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            two.append(time.perf_counter() - start)
        results[name] = (min(one) / (2 * n_rows), min(one) / min(two))
    print(f"{'':20} {'ns per row':>12} {'2 threads / 1 thread':>22}")
    for name, (per_row, speedup) in results.items():
        print(f"{name:20} {per_row * 1e9:12.1f} {speedup:22.2f}")
    print(f"fancy / take-put per row: {results['fancy'][0] / results['take/put'][0]:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
