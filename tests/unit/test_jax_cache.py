"""JAX's persistent compilation cache (spark.sparkdl_train.jax.compilationCache; sparkdl_train.backend.jax):
a second process loads what the first compiled; folders others could write to are refused. Each case runs in
a fresh interpreter: the cache is configured once per process, before or after JAX is imported."""

import json
import os
import subprocess
import sys

from sparkdl_train._folders import private_folder
from sparkdl_train.backend import jax as jax_backend

# a worker as the driver starts it: the setting in SPARKDL_TRAIN_JAX_CACHE, JAX not imported yet; it counts
# the compiled executables it loaded from the cache (JAX's own event)
WORKER = r"""
import json, os, sys
from sparkdl_train.backend import jax as jb
seconds = jb.import_framework()
import jax, numpy as np
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
x = np.arange(96, dtype=np.float32).reshape(12, 8)
y = jax.jit(lambda a: (a @ a.T).sum() * 3.0)(x)
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "hits": len(hits), "y": float(y),
                  "env": {k: v for k, v in os.environ.items() if k.startswith("JAX_")}}))
"""


def _worker(env: dict) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SPARKDL_TRAIN_JAX"))}
    proc = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=300,
                          env={**full, "KERAS_BACKEND": "jax", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    folder = str(tmp_path / "cache")
    env = {jax_backend.CACHE_SETTING_ENV: folder, jax_backend.CACHE_BYTES_ENV: str(1 << 20)}
    first, second = _worker(env), _worker(env)
    assert first["dir"] == second["dir"] == folder
    assert first["hits"] == 0 and second["hits"] >= 1, (first, second)
    assert first["y"] == second["y"]
    assert first["env"]["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(1 << 20)
    assert os.stat(folder).st_mode & 0o077 == 0  # created private
    assert any(name.endswith("-cache") for name in os.listdir(folder))


def test_off_and_an_applications_own_folder(tmp_path):
    assert _worker({jax_backend.CACHE_SETTING_ENV: "off"})["dir"] in (None, "")
    own = str(tmp_path / "own")
    r = _worker({jax_backend.CACHE_SETTING_ENV: str(tmp_path / "ours"), "JAX_COMPILATION_CACHE_DIR": own})
    assert r["dir"] == own  # spark.executorEnv.JAX_COMPILATION_CACHE_DIR (the application's) wins


def test_a_folder_others_may_write_to_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert "others may write" in private_folder(str(shared))
    r = _worker({jax_backend.CACHE_SETTING_ENV: str(shared)})
    assert r["dir"] in (None, "") and not os.listdir(shared), r
    assert private_folder(str(tmp_path / "new" / "cache")) is None
    assert os.stat(tmp_path / "new" / "cache").st_mode & 0o777 == 0o700
