"""The first rows of an RDD, for a fit's sample batch, without costing the fit a Python worker.

``rdd.take(n)`` runs a Python task that stops reading its partition early; such a worker cannot go
back to Spark's pool, so it exits, and the fit's next stage forks a new one that imports
TensorFlow again and has no cached model. :func:`first_rows` avoids that two ways:

* where computing the RDD's first partitions starts no Python worker (an RDD parallelized from the
  driver, a shuffle's output, a fully cached RDD), the JVM takes the first pickled frames and the
  driver unpickles them (Spark's own frames, from its own JVM, as ``collect`` reads them);
* otherwise a Python task reads its partition to the end (at most ``drain`` rows past the sample),
  so its worker stays.

The JVM path reads one frame where the Python one read and unpickled the whole partition: 0.04-0.1 s
against 0.17-0.46 s for 90k rows of 39 floats. A frame is at most 1024 rows of data the driver
itself parallelized, 10 rows after a shuffle (PySpark's ``repartition``), or about 64 KB-640 KB (or
one larger row) of an auto-batched RDD; serializers with unbounded frames (a whole partition in
one, as a DataFrame's ``.rdd`` has) take the Python path.
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

# a sample job reads on to the end of a partition of at most this many rows (see first_rows)
SAMPLE_DRAIN_ROWS = 200_000
# JVM classes whose compute can run Python: PySpark's RDDs and anything Spark SQL builds (a
# DataFrame's .rdd, whose plan may hold Python UDFs or mapInArrow)
_PYTHON_PACKAGES = ("org.apache.spark.api.python.", "org.apache.spark.sql.")
# a lineage longer than this within one stage is not walked (the Python path is taken)
_MAX_WALK = 200


def first_rows(rdd: Any, n: int, drain: int = SAMPLE_DRAIN_ROWS) -> list:
    """The first ``n`` rows of ``rdd``, as ``rdd.take(n)`` gives them, ending no Python worker."""
    return read_first_rows(rdd, n, drain)[0]


def read_first_rows(rdd: Any, n: int, drain: int = SAMPLE_DRAIN_ROWS) -> tuple[list, str]:
    """:func:`first_rows` and how they were read: ``"jvm"`` (the JVM's take of pickled frames, no
    Python task) or ``"python"`` (Python tasks that read their partitions to the end)."""
    rows = _jvm_first_rows(rdd, n)
    if rows is not None:
        return rows, "jvm"
    return _python_first_rows(rdd, n, drain), "python"


def _python_first_rows(rdd: Any, n: int, drain: int) -> list:
    """Each sample task reads on to the end of its partition when that is at most ``drain`` rows
    past the sample, and only a larger partition ends its worker, as ``take`` would. Partitions
    are read one at a time until ``n`` rows are found."""

    def head(rows: Iterator) -> Iterator:
        first = list(islice(rows, n))
        for _ in islice(rows, drain):  # to the end of a partition this small: the worker stays
            pass
        yield first

    out: list = []
    for index in range(rdd.getNumPartitions()):
        part = rdd.context.runJob(rdd, lambda rows: head(rows), [index])
        out.extend(part[0][: n - len(out)] if part else [])
        if len(out) >= n:
            break
    return out


def frame_loader(rdd: Any) -> Callable[[bytes], Any] | None:
    """How to read one of ``rdd``'s JVM elements, where each is a pickled list of rows (PySpark's
    batched pickle serializers); None for any other serializer (text, pairs, a whole partition as
    one frame)."""
    from pyspark.serializers import AutoBatchedSerializer, BatchedSerializer, CloudPickleSerializer, CPickleSerializer

    ser = getattr(rdd, "_jrdd_deserializer", None)
    if type(ser) is BatchedSerializer:
        if ser.batchSize == BatchedSerializer.UNLIMITED_BATCH_SIZE:
            return None
    elif type(ser) is not AutoBatchedSerializer:
        return None
    if type(ser.serializer) not in (CPickleSerializer, CloudPickleSerializer):
        return None
    return ser.serializer.loads


def runs_python(sc: Any, jrdd: Any) -> bool:
    """Whether computing ``jrdd``'s partitions can start a Python worker in its own stage: a
    PySpark or Spark SQL RDD among the RDDs it reads through narrow dependencies, stopping at
    shuffles (their map stages run whole partitions) and at RDDs with every partition cached.
    True where the lineage is too long to walk."""
    cached: dict[int, tuple[int, int]] | None = None
    stack, seen = [jrdd.rdd()], set()
    while stack:
        node = stack.pop()
        key = node.id()
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > _MAX_WALK:
            return True
        if node.getStorageLevel().isValid():
            if cached is None:
                cached = {i.id(): (i.numCachedPartitions(), i.numPartitions()) for i in sc._jsc.sc().getRDDStorageInfo()}
            parts = cached.get(key)
            if parts is not None and parts[0] == parts[1]:
                continue
        if node.getClass().getName().startswith(_PYTHON_PACKAGES):
            return True
        deps = node.dependencies()
        for i in range(deps.size()):
            dep = deps.apply(i)
            if not dep.getClass().getName().endswith("ShuffleDependency"):
                stack.append(dep.rdd())
    return False


def _frames(sc: Any, taken: Any) -> list[bytes]:
    """The JVM's list of byte arrays ``taken``, through a local socket as ``collect`` reads
    its results (one 200 KB frame: 0.005-0.011 s, against 0.01-0.06 s through py4j, which sends
    byte arrays base64-encoded); through py4j where PySpark lacks that server."""
    try:
        from pyspark.serializers import NoOpSerializer
        from pyspark.util import _load_from_socket

        served = sc._jvm.PythonRDD.serveIterator(sc._jvm.scala.jdk.javaapi.CollectionConverters.asScala(taken.iterator()),
                                                 "sparkdl_train sample")
    except Exception as exc:  # noqa: BLE001 - a PySpark without these internals: py4j's transfer
        log.debug("serving the sample's frames through a socket is not possible: %s", exc)
        return [bytes(frame) for frame in taken]
    with _load_from_socket(served, NoOpSerializer()) as stream:
        return list(stream)


def _jvm_first_rows(rdd: Any, n: int) -> list | None:
    """The first ``n`` rows through the JVM's ``take`` of whole frames, or None where that could
    start a Python worker or the frames are not batched pickles."""
    from pyspark.rdd import PipelinedRDD

    loads = frame_loader(rdd)
    if loads is None or (isinstance(rdd, PipelinedRDD) and not rdd.is_cached):
        return None  # the second: Python computes it (and its JVM RDD is not built for nothing)
    try:
        jrdd = rdd._jrdd
        if runs_python(rdd.context, jrdd):
            return None
    except Exception as exc:  # noqa: BLE001 - a PySpark without these internals: the Python path
        log.debug("sampling %s through the JVM is not possible: %s", rdd, exc)
        return None
    frames = 1
    while True:
        got = _frames(rdd.context, jrdd.take(frames))  # frames in partition order, the first partitions only
        rows = []
        for frame in got:
            part = loads(frame)
            if not isinstance(part, list):
                return None
            rows.extend(part)
        if len(rows) >= n or len(got) < frames:
            return rows[:n]
        per_frame = max(1, len(rows) // max(1, len(got)))
        frames = max(frames * 2, -(-n // per_frame) + 1)
