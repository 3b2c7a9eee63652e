"""A worker's own work per parameter-server push, without Spark or a server (``push_sync_seconds``
in a fit): the delta of the dense weights and of the rows its window touched, the ids of the next
window, and the reply adopted (dense weights and the wanted rows written into the tables).

The CTR job's model (DeepFM, embedding 8 + linear 1 per id, MLP 64-32) with ``--vocab`` ids per
table, batches of 512 rows x 26 uniform ids, pushes every ``--window`` steps, in the order a
worker runs them: the next window's rows wanted, the reply received, the window trained (here: its
ids only, no train step, so that the push's own cost is what is timed), the delta. The reply is
the model's own values (a server's arrays have the same shapes and bytes).

Per configuration it prints the median milliseconds of each part over ``--pushes`` pushes after a
warm-up, the bytes of a push and its reply, and the same for the eager path (one variable at a
time, numpy bases: ``TableSync(compiled=False)``) measured in the same run, as the baseline ratio.
Runs on the Keras backend of ``KERAS_BACKEND`` (TensorFlow if unset); on an older checkout without
``compiled=`` it times the compiled path only (for before/after runs of this script on two commits).

    python -m bench.ps.push [--vocab 1000000 100000] [--window 4 1] [--pushes 15]
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import numpy as np


def measure(vocab: int, window: int, pushes: int, compiled: bool) -> dict:
    from sparkdl_train.driver.sparse_tables import find_tables
    from sparkdl_train.models.ctr import deepfm
    from sparkdl_train.ps.state import SparseRows
    from sparkdl_train.worker.row_sync import TableSync

    model = deepfm(vocab)
    tables = find_tables(model)
    kwargs = {"compiled": compiled} if "compiled" in inspect.signature(TableSync).parameters else {}
    if not compiled and not kwargs:
        return {}
    sync = TableSync(model, tables, **kwargs)
    rng = np.random.default_rng(0)
    arrays = [np.asarray(v.numpy()) for v in model.weights]

    def batch():
        return ({"numeric": rng.random((512, 13), np.float32),
                 "categorical": rng.integers(0, vocab, (512, 26)).astype(np.int32)}, None, None)

    nxt = [batch() for _ in range(window)]
    want = sync.want(nxt)
    sync.receive([a if i not in want else a[want[i]] for i, a in enumerate(arrays)], want)
    parts, sizes = [], []
    for n in range(pushes + 3):
        for _ in sync.track(nxt):
            pass
        t0 = time.perf_counter()
        delta = sync.delta(1.0)
        t1 = time.perf_counter()
        nxt = [batch() for _ in range(window)]
        t2 = time.perf_counter()
        want = sync.want(nxt)
        t3 = time.perf_counter()
        reply = [a if i not in want else a[want[i]] for i, a in enumerate(arrays)]
        t4 = time.perf_counter()
        sync.receive(reply, want)
        t5 = time.perf_counter()
        if n >= 3:
            parts.append((t1 - t0, t3 - t2, t5 - t4))
            sizes.append((sum(d.ids.nbytes + d.rows.nbytes if isinstance(d, SparseRows) else d.nbytes for d in delta),
                          sum(a.nbytes for a in reply)))
    med = np.median(np.array(parts), axis=0)
    push_bytes, reply_bytes = np.median(np.array(sizes), axis=0)
    return {"delta_ms": round(med[0] * 1e3, 3), "want_ms": round(med[1] * 1e3, 3), "receive_ms": round(med[2] * 1e3, 3),
            "total_ms": round(float(np.sum(med)) * 1e3, 3), "push_bytes": int(push_bytes), "reply_bytes": int(reply_bytes),
            "ns_per_byte": round(float(np.sum(med)) / (push_bytes + reply_bytes) * 1e9, 2),
            "reused": getattr(sync, "reused", None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="+", default=[1_000_000, 100_000])
    ap.add_argument("--window", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--pushes", type=int, default=15)
    args = ap.parse_args()
    import keras

    print(f"bench/ps/push.py  backend={keras.backend.backend()}", flush=True)
    out = []
    for vocab in args.vocab:
        for window in args.window:
            row = {"vocab": vocab, "window": window, "compiled": measure(vocab, window, args.pushes, True),
                   "eager": measure(vocab, window, args.pushes, False)}
            c, e = row["compiled"], row["eager"]
            ratio = f"  eager/compiled {e['total_ms'] / c['total_ms']:.2f}x" if e else ""
            print(f"  {vocab:>9,} ids, push every {window}: {c['total_ms']:7.2f} ms (delta {c['delta_ms']:.2f}, want "
                  f"{c['want_ms']:.2f}, receive {c['receive_ms']:.2f}), {c['push_bytes'] / 1e6:.2f} + "
                  f"{c['reply_bytes'] / 1e6:.2f} MB, {c['ns_per_byte']:.2f} ns/byte; eager "
                  f"{e.get('total_ms', float('nan')):.2f} ms{ratio}", flush=True)
            out.append(row)
    print("RESULT", json.dumps(out))
    from bench.harness import results

    print("wrote", results.write("ps_push", {"backend": keras.backend.backend(), "pushes": args.pushes, "rows": out}))


if __name__ == "__main__":
    main()
