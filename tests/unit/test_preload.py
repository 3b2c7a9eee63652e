"""The worker daemon's preload (sparkdl_train.worker.preload) on JAX, without Spark: a process that imported what
the daemon imports (JAX, Keras on it, pyarrow, the executor modules) has started no XLA client, and workers forked
from it train exactly as a fresh process does."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

TRAIN = r'''
import json, os, sys

def train():
    import numpy as np
    import keras
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.1).astype("float32")
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history["loss"]
    return {"loss": [float(v) for v in history], "weights": [float(v) for w in model.get_weights() for v in w.ravel()],
            "backend": keras.backend.backend()}

if sys.argv[1] == "fresh":
    print(json.dumps(train()))
    raise SystemExit(0)

from sparkdl_train.worker.preload import freeze_imports, preload
from jax._src import xla_bridge

failed = preload()
freeze_imports()
out = {"failed": failed, "started_before": xla_bridge.backends_are_initialized(), "forked": [],
       "threads": sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))}
for _ in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(train()).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out["forked"].append(json.loads(f.read()))
    assert os.waitpid(pid, 0)[1] == 0
out["started_after"] = xla_bridge.backends_are_initialized()
print(json.dumps(out))
'''


def _run(mode: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERAS_", "XLA_", "JAX_"))}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-c", TRAIN, mode], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_workers_forked_after_the_jax_preload_train_as_a_fresh_process():
    daemon, stderr = _run("daemon")
    fresh, _ = _run("fresh")
    # the daemon imported everything and started no XLA client (nor did its forks start one in it): JAX's own
    # fork warning, installed with the first client, never fired
    assert daemon["failed"] == [] and not daemon["started_before"] and not daemon["started_after"], daemon
    assert "os.fork() was called" not in stderr
    for forked in daemon["forked"]:
        assert forked["backend"] == fresh["backend"] == "jax"
        assert forked["loss"][-1] < forked["loss"][0]  # it trained
        # each forked worker computes what a process that never forked does, to the last bits of float32
        assert forked["loss"] == pytest.approx(fresh["loss"], rel=1e-6, abs=1e-7)
        assert forked["weights"] == pytest.approx(fresh["weights"], rel=1e-5, abs=1e-6)
