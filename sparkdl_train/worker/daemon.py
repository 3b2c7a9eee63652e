"""A PySpark daemon that imports the Keras backend's framework (TensorFlow or JAX), Keras and sparkdl_train's executor code once, before
it forks Python workers.

Spark forks each Python worker from one daemon process per executor (per interpreter). With the
stock daemon every new worker imports TensorFlow itself, 5 to 10 seconds of CPU, and Spark starts
new workers more often than one expects: a task that stops reading its input early (``take``,
``first``) ends its worker, and a fit wider than the idle pool forks more. With this daemon a new
worker starts with everything already imported (shared copy-on-write with the daemon), so the
first epoch of a fit costs what the later ones cost.

Enable it where the executors' Python has sparkdl_train (the archive of ``./run pack``)::

    spark.python.daemon.module  sparkdl_train.worker.daemon

What TensorFlow and Keras import at their own import only in case a user calls on it (scikit-learn
for Keras' wrappers, matplotlib for its image plots, JAX for TensorFlow Lite's converter: the
backend's ``Capabilities.speculative_imports``) is hidden while the daemon imports: about a third of
the import where all three are installed. A task that imports one gets it as usual; Keras' scikit-learn
wrappers, used inside a task, would find scikit-learn missing.

Importing TensorFlow starts no TensorFlow runtime (no thread pools, no devices): that happens in
each worker at its first op, after :func:`sparkdl_train.worker.runtime.prepare_process` has sized
its thread pools. A preload that fails is logged and the daemon serves as the stock one does.
"""

from __future__ import annotations

from .preload import PRELOAD, environment_defaults, freeze_imports, preload

__all__ = ["PRELOAD", "environment_defaults", "freeze_imports", "main", "preload"]


def main() -> None:
    from . import code_cache, zygote

    if zygote.handoff():  # the executor's zygote imported all this already and runs the daemon (its plugin: sparkdl_train.jvm)
        return

    code_cache.install()  # pyspark's modules from Spark's pyspark.zip: compiled once per host, not per daemon
    preload()
    freeze_imports()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
