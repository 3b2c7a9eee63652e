"""The executors run the Keras backend of the driver's model.

A Python worker's Keras backend is fixed when it imports Keras, from ``KERAS_BACKEND`` (unset:
TensorFlow). Spark gives a stage's Python workers the application's ``spark.executorEnv.*`` and
whatever the driver's ``SparkContext.environment`` holds when the stage's function is made
(worker daemons are kept apart by that environment), so a fit of a JAX model adds
``KERAS_BACKEND=jax`` there, as a user would with ``spark.executorEnv.KERAS_BACKEND``. An
application that set ``spark.executorEnv.KERAS_BACKEND`` itself keeps it; if it names another
backend, the preflight check fails the fit naming both (:mod:`.preflight`).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import backend

log = logging.getLogger(__name__)


def executor_backend(sc: Any) -> str:
    """The driver's Keras backend (a ConfigError if sparkdl_train cannot train on it), given to
    ``sc``'s later stages as ``KERAS_BACKEND`` unless the application set that itself; on JAX, with the
    persistent compilation cache (spark.sparkdl_train.jax.compilationCache) for the stages and this driver."""
    name = backend.check_supported(backend.keras_backend())
    env = getattr(sc, "environment", None)
    if env is None:
        return name
    current = env.get("KERAS_BACKEND")
    if current is None and name != backend.DEFAULT:
        env["KERAS_BACKEND"] = name
        log.info("executors' Python workers for sparkdl_train's stages get KERAS_BACKEND=%s (the model's backend)", name)
    if backend.capabilities(name).compilation_cache:
        _compilation_cache(sc, env, backend.current())
    return name


def _compilation_cache(sc: Any, env: dict[str, str], jax_backend: Any) -> None:
    from ..config import EngineConfig
    from .spark_conf import settings_conf

    core = EngineConfig.resolve(settings_conf(sc)).core
    env.setdefault(jax_backend.CACHE_SETTING_ENV, core.jax_compilation_cache)
    env.setdefault(jax_backend.CACHE_BYTES_ENV, str(core.jax_compilation_cache_bytes))
    folder = jax_backend.configure_cache(core.jax_compilation_cache, core.jax_compilation_cache_bytes)
    if folder:
        log.debug("JAX compilation cache of the driver: %s", folder)
