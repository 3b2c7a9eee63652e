"""A worker's parameter-server pushes without Spark or a server, on whichever Keras backend runs:
used by tests/unit/test_sparse_rows.py (TensorFlow) and tests/scripts/jax_check.py (JAX).

A DeepFM-shaped model (an embedding table and a linear table read by the same input, dense
weights beside them) goes through rounds in the order a worker runs them: the next window's rows
wanted, the "server's" reply (its arrays shifted per round) received, the window trained, the
delta pushed.
"""

from __future__ import annotations

import numpy as np

ROWS = 40


def model():
    import keras

    keras.utils.set_random_seed(4)
    ids = keras.Input((3,), dtype="int32", name="ids")
    num = keras.Input((2,), name="num")
    emb = keras.layers.Flatten()(keras.layers.Embedding(ROWS, 4, name="embed")(ids))
    lin = keras.layers.Flatten()(keras.layers.Embedding(ROWS, 1, name="linear")(ids))
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([emb, lin, num]))
    m = keras.Model({"num": num, "ids": ids}, out)
    m.compile(keras.optimizers.Adam(0.05), "binary_crossentropy")
    return m


def run(compiled: bool, window: str = "exact", rounds: int = 6, steps: int = 2) -> dict:
    """``rounds`` pushes of ``steps`` batches each. ``window``: "exact" (the batches wanted are the
    batches trained, as a worker reads its window ahead), "copies" (equal batches, other objects:
    the rows are found from the trained batches' ids), "other" (the batches trained are not the ones
    wanted). Returns the deltas (ids and rows per table, dense arrays), the final weights, how many
    pushes reused the pulled rows, and the sync object."""
    from sparkdl_train.driver.sparse_tables import find_tables
    from sparkdl_train.ps.state import SparseRows
    from sparkdl_train.worker.row_sync import TableSync

    m = model()
    tables = find_tables(m)
    assert [t.name for t in tables] == ["embed", "linear"], tables
    sync = TableSync(m, tables, compiled=compiled)
    rng = np.random.default_rng(1)

    def batch(r: int):  # a different count of distinct ids every round
        ids = rng.integers(0, 4 + 6 * r, (8, 3)).astype(np.int32)
        return ({"ids": ids, "num": rng.random((8, 2), np.float32)}, rng.integers(0, 2, (8, 1)).astype(np.float32), None)

    server = [np.asarray(w.numpy()) for w in m.weights]
    sync.receive(server, None)
    deltas, pulled = [], []
    for r in range(rounds):
        wanted = [batch(r) for _ in range(steps)]
        want = sync.want(wanted if window != "copies" else [(b[0], b[1], b[2]) for b in wanted])
        pulled.append({i: w.tolist() for i, w in want.items()})
        sync.receive([a + 0.1 * (r + 1) if i not in want else a[want[i]] + 0.2 * (r + 1) for i, a in enumerate(server)], want)
        trained = wanted if window != "other" else [batch(r) for _ in range(steps)]
        for b in sync.track(trained):
            m.train_on_batch(b[0], b[1])
        deltas.append([(d.ids.tolist(), np.asarray(d.rows)) if isinstance(d, SparseRows) else np.asarray(d)
                       for d in sync.delta(0.5)])
    return {"deltas": deltas, "weights": [np.asarray(w.numpy()) for w in m.weights], "reused": sync.reused,
            "pulled": pulled, "sync": sync, "tables": [t.index for t in tables]}


def compare(a: dict, b: dict) -> float:
    """The largest difference between two runs' deltas and weights; ids must be equal."""
    worst = 0.0
    for da, db in zip(a["deltas"], b["deltas"], strict=True):
        for x, y in zip(da, db, strict=True):
            if isinstance(x, tuple):
                assert x[0] == y[0], (x[0], y[0])
                x, y = x[1], y[1]
            worst = max(worst, float(np.max(np.abs(x - y))) if np.size(x) else 0.0)
    for x, y in zip(a["weights"], b["weights"], strict=True):
        worst = max(worst, float(np.max(np.abs(x - y))))
    return worst
