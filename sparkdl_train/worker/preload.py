"""What the worker daemon imports before it forks (and the executor's zygote before it hands itself over:
:mod:`sparkdl_train.worker.zygote`): the Keras backend's framework, Keras, pyarrow and sparkdl_train's executor
modules; rationale in :mod:`sparkdl_train.worker.daemon`."""

from __future__ import annotations

import os
import sys

PRELOAD = (
    "keras",
    "pyarrow",
    "sparkdl_train.worker.tasks",
    "sparkdl_train.worker.ps_task",
    "sparkdl_train.worker.allreduce_task",
    "sparkdl_train.data.arrow",
    # what a DataFrame task's worker imports to read Arrow batches (mapInArrow)
    "pandas",
    "pyspark.sql.pandas.serializers",
    "pyspark.worker",
)


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``modules``; returns the ones that failed. Nothing reaches stdout, which carries
    the daemon's port to the JVM."""
    import importlib

    from ..backend import without_speculative_imports

    environment_defaults()
    # the Keras backend this daemon's workers run (spark.executorEnv.KERAS_BACKEND, or the
    # KERAS_BACKEND sparkdl_train gives its own stages)
    if modules is PRELOAD:
        from ..backend import CAPABILITIES  # declared without importing any framework

        can = CAPABILITIES.get(os.environ["KERAS_BACKEND"])
        if can is None:
            # a backend sparkdl_train does not train on: its tasks fail their own check, naming it; the daemon imports
            # only the Arrow and Spark side for them
            modules = tuple(m for m in modules if m.split(".")[0] in ("pyarrow", "pandas", "pyspark"))
        else:
            # importing the framework and Keras starts no device runtime and no thread of theirs: TensorFlow's runtime
            # starts at a worker's first op, JAX's XLA client at its first computation, both after the fork, in each
            # worker (tests/unit/test_preload.py forks JAX workers from a daemon that preloaded it)
            modules = (can.framework, *modules)
    failed = []
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # anything printed while importing goes to stderr (the executor's log)
    try:
        # what the framework and Keras import only in case a user calls on it (scikit-learn, matplotlib; JAX
        # under TensorFlow) stays out: about a third of the import where they are installed
        with without_speculative_imports():
            for name in modules:
                try:
                    importlib.import_module(name)
                except Exception as exc:  # noqa: BLE001 - the workers will import (and report) it themselves
                    failed.append(name)
                    print(f"sparkdl_train daemon: could not preload {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return failed


# what the daemon's workers inherit where the executor's environment says nothing: the Keras backend (TensorFlow)
# and TensorFlow's C++ log level
ENV_DEFAULTS = {"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}


def environment_defaults() -> None:
    """Set :data:`ENV_DEFAULTS` where the environment has none."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def freeze_imports() -> None:
    """Move every object alive now (the preloaded modules: about 340k with TensorFlow) out of the
    garbage collector's reach (``gc.freeze``). A worker forked afterwards never scans them again: its
    full collections, otherwise 0.1-0.2 s each and liable to land in a task's model rebuild or first
    steps, look only at its own objects, and they no longer write to (and so copy) the pages it
    shares with the daemon. No collection first: the imports leave no garbage to speak of (a full
    collection after TensorFlow's found none, in 0.3-0.4 s of the daemon's start)."""
    import gc

    gc.freeze()
