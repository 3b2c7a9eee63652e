"""sparkdl_train's Spark plugin: executors that start their Python daemon's imports as they start.

An executor's first Python task starts its worker daemon, which imports TensorFlow and Keras
(:mod:`sparkdl_train.worker.daemon`): 3 to 10 s at the start of a session's first fit, on every executor,
and again on every executor that joins later (dynamic allocation, a lost executor's replacement). The
plugin ``org.sparkdl_train.ExecutorStart`` (``ExecutorStart.java`` beside this file; Spark's public
plugin API only) starts ``python -m sparkdl_train.worker.zygote`` as each executor starts, so those imports
run while the session starts, the driver reads its data and builds its model, or the executor waits for
its first task; the daemon Spark starts later takes them over (:mod:`sparkdl_train.worker.zygote`: how,
and when it declines).

Enable it with two settings on the driver (a missing jar fails the session's start, so both or neither),
beside the worker daemon (the only daemon that takes the imports over; with any other the plugin starts
nothing)::

    spark.plugins               org.sparkdl_train.ExecutorStart
    spark.jars                  <the path python -m sparkdl_train.jvm prints>
    spark.python.daemon.module  sparkdl_train.worker.daemon

:func:`settings` gives the first two; ``./run submit`` and ``./run job`` add all three
(``SDT_EXECUTOR_START=off`` leaves the plugin out). ``spark.sparkdl_train.executorStart=false`` keeps the plugin loaded but idle. Spark ships
the jar to the executors (YARN localizes it into each container). The jar is compiled from the source
with the ``javac`` of a JDK 17+ on first use, against the installed pyspark's jars, and kept in
``SPARKDL_TRAIN_JVM_CACHE`` (default ``~/.cache/sparkdl_train/jvm``) under a name of the source's hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile

from ..errors import ConfigError

CLASS = "org.sparkdl_train.ExecutorStart"
SETTING = "spark.sparkdl_train.executorStart"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ExecutorStart.java")
CACHE_ENV = "SPARKDL_TRAIN_JVM_CACHE"


def cache_folder() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "sparkdl_train", "jvm")


def spark_jars() -> str:
    """The folder of the Spark jars to compile against: ``$SPARK_HOME/jars``, else the installed pyspark's."""
    home = os.environ.get("SPARK_HOME")
    if home and os.path.isdir(os.path.join(home, "jars")):
        return os.path.join(home, "jars")
    import pyspark

    return os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")


def jar(folder: str | None = None) -> str:
    """The plugin's jar, compiled now if this source has none yet in ``folder`` (:func:`cache_folder`)."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    folder = folder or cache_folder()
    path = os.path.join(folder, f"sparkdl_train-plugin-{hashlib.sha256(source).hexdigest()[:16]}.jar")
    if os.path.exists(path):
        return path
    javac = shutil.which("javac", path=os.path.join(os.environ["JAVA_HOME"], "bin") if os.environ.get("JAVA_HOME") else None) \
        or shutil.which("javac")
    if javac is None:
        raise ConfigError("sparkdl_train.jvm: building the executor plugin needs javac (a JDK 17+; JAVA_HOME or PATH); "
                          "without it, leave spark.plugins and the jar out (./run: SDT_EXECUTOR_START=off)")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        classes = os.path.join(work, "classes")
        proc = subprocess.run([javac, "--release", "17", "-nowarn", "-d", classes, "-cp", os.path.join(spark_jars(), "*"), SOURCE],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise ConfigError(f"sparkdl_train.jvm: javac failed on {SOURCE}:\n{proc.stderr[-2000:]}")
        tmp = os.path.join(work, "plugin.jar")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: sparkdl_train.jvm\n")
            for base, _dirs, files in os.walk(classes):
                for name in sorted(files):
                    full = os.path.join(base, name)
                    z.write(full, os.path.relpath(full, classes))
        os.replace(tmp, path)  # whole or absent, whoever else builds it at the same time
    return path


def settings(jars: str | None = None) -> dict[str, str]:
    """The driver settings that enable the plugin (``jars``: other jars the application ships, kept)."""
    return {"spark.plugins": CLASS, "spark.jars": ",".join(j for j in (jars, jar()) if j)}


def main() -> None:
    """``python -m sparkdl_train.jvm``: build the jar if needed and print its path (exit status 1 and the
    reason on stderr where it cannot be built)."""
    import sys

    try:
        print(jar())
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
