"""Host arrays handed to a model on JAX's CPU build are copied, never aliased: run by
tests/spark/test_jax_backend.py in a process of its own (``KERAS_BACKEND=jax python tests/scripts/jax_aliasing.py``).

Keras' ``Variable.assign`` of a numpy array on JAX's CPU build can keep the array's buffer as
the variable's value (when the buffer is 64-byte aligned: by chance, for an ordinary allocation).
A caller that reuses the buffer afterwards (the parameter-server client's receive buffer, which
the next reply overwrites) then changes the model under it. Every array below is 64-byte aligned
and overwritten after it was handed over; the model must keep the values it was given. Prints
one JSON object: whether Keras' own ``assign`` aliased (the platform's behaviour, for the record)
and, per path of this project, whether the model kept its values.
"""

from __future__ import annotations

import json
import os

import numpy as np


def aligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose buffer starts on a 64-byte boundary."""
    a = np.asarray(a)
    raw = np.empty(a.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def kept(variables, given) -> bool:
    return all(np.array_equal(np.asarray(v.numpy()), g) for v, g in zip(variables, given))


def _applied(model, step, summed) -> dict:
    """The weights one ``apply`` of ``summed`` gives, waited for, the model put back after."""
    from sparkdl_train import model_io

    start = model_io.get_state(model)
    step.apply(summed.copy())
    weights = [np.array(w.numpy()) for w in model.trainable_weights]
    model_io.set_state(model, start)
    return {"weights": weights, "summed": summed.copy()}


def main() -> dict:
    import keras
    from jax_check import sparse_model  # tests/ is on the path: run from there or by the test

    from sparkdl_train import backend, model_io
    from sparkdl_train.driver.sparse_tables import find_tables
    from sparkdl_train.worker.row_sync import TableSync

    assert keras.backend.backend() == "jax"
    out = {}
    v = keras.Variable(np.zeros(1024, np.float32))
    buf = aligned(np.ones(1024, np.float32))
    v.assign(buf)
    buf[...] = 7.0
    out["keras_assign_aliased"] = bool(float(v.numpy()[0]) == 7.0)

    model = sparse_model()
    model.optimizer.build(model.trainable_variables)
    initial = model_io.get_state(model)
    rng = np.random.default_rng(0)

    def fresh(variables):
        return [aligned(rng.normal(size=tuple(v.shape)).astype(np.dtype(v.dtype))) for v in variables]

    def check(name, variables, hand_over):
        arrays = fresh(variables)
        given = [a.copy() for a in arrays]
        hand_over(arrays)
        for a in arrays:  # the caller reuses its buffers
            a[...] = np.nan if a.dtype.kind == "f" else 0
        out[name] = kept(variables, given)

    check("set_weights", model.weights, lambda arrays: model_io.set_weights(model, arrays))
    check("set_state", model_io.state_variables(model), lambda arrays: model_io.set_state(model, arrays))
    tables = find_tables(model)
    assert [t.name for t in tables] == ["table"], tables
    sync = TableSync(model, tables)
    check("table_sync_receive_whole", model.weights, lambda arrays: sync.receive(arrays, None))
    # a compiled call's numpy argument, the buffer reused the moment the call returns: the
    # allreduce's update from the ring's summed vector (not waited for), and a push reply's rows
    from sparkdl_train import _compat
    from sparkdl_train.worker.fused_step import cached_fused_step

    batch = (np.arange(24, dtype=np.int32).reshape(8, 3) % 50, np.ones((8, 1), np.float32), None)
    model_io.set_state(model, initial)  # (the random states above are no optimizer's)
    _compat.symbolic_build(model, batch)  # as a worker does before its first step
    step = cached_fused_step(model, 8)
    step.trace(batch)
    summed = aligned(np.zeros(step.size, np.float32))
    step.gradients(batch, summed)
    expected = _applied(model, step, summed)
    assert all(np.all(np.isfinite(w)) for w in expected["weights"])
    for _ in range(20):
        model_io.set_state(model, start := model_io.get_state(model))
        step.apply(summed)
        summed[...] = np.nan  # the ring zeroes or sums into it next
        got = [np.array(w.numpy()) for w in model.trainable_weights]
        summed[...] = expected["summed"]
        model_io.set_state(model, start)
        if not all(np.array_equal(g, e) for g, e in zip(got, expected["weights"])):
            out["fused_apply"] = False
            break
    else:
        out["fused_apply"] = True
    table = model.get_layer("table").embeddings
    ids, rows = aligned(np.array([1, 5, 9], np.int32)), aligned(np.full((3, 4), 2.5, np.float32))
    backend.current().scatter_rows(table, ids, rows)
    rows[...] = np.nan
    ids[...] = 0
    got = np.asarray(table.numpy())
    out["scatter_rows"] = bool(np.all(got[[1, 5, 9]] == 2.5) and np.all(np.isfinite(got)))
    out["metric_state"] = None
    mvars = [m for m in model.metrics_variables if np.dtype(m.dtype).kind == "f"]
    if mvars:
        arrays = [aligned(np.full(tuple(m.shape), 3.0, np.dtype(m.dtype))) for m in model.metrics_variables]
        model_io.set_metric_state(model, arrays)
        for a in arrays:
            a[...] = 0
        out["metric_state"] = all(np.all(np.asarray(m.numpy()) == 3.0) for m in model.metrics_variables)
    return out


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "jax"
    print(json.dumps(main()))
