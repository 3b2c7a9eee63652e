"""Files through Spark's Hadoop ``FileSystem`` API (``hdfs://``, ``s3a://``, ``abfs://``, ``gs://``,
``file:``, ...), in the driver, without a ``hadoop fs`` subprocess.

Paths resolve as Spark resolves them for ``df.write.parquet(path)``: a path
without a scheme is relative to ``fs.defaultFS`` (HDFS on a YARN cluster, the
local disk in ``local[*]``). Without an active SparkContext only local paths
are accepted.
"""

from __future__ import annotations

import os
from typing import Any

from .data.sessions import is_connect
from .errors import ConfigError

_CHUNK = 8 << 20  # bytes per py4j call when writing


def active_context() -> Any:
    from pyspark import SparkContext

    return SparkContext._active_spark_context


class FileSystem:
    """Read and write whole files under one base path."""

    def __init__(self, sc: Any = None):
        sc = sc if sc is not None else active_context()
        # a Spark Connect client has no JVM (so no Hadoop API) in its process: local paths only
        self.sc = None if is_connect(sc) else sc

    # -- local fallback -----------------------------------------------------------------
    @staticmethod
    def _local(path: str) -> str:
        if path.startswith("file://"):
            return path[len("file://") :]
        if path.startswith("file:"):
            return path[len("file:") :]
        if "://" in path:
            raise ConfigError(f"{path!r}: a path with a scheme needs an active SparkContext (Spark's Hadoop filesystem API; a "
                              "Spark Connect client has none: give a path on this machine)")
        return path

    # -- Hadoop ---------------------------------------------------------------------------
    def _fs(self, path: str) -> tuple[Any, Any]:
        jvm = self.sc._jvm
        p = jvm.org.apache.hadoop.fs.Path(path)
        return p.getFileSystem(self.sc._jsc.hadoopConfiguration()), p

    def qualified(self, path: str) -> str:
        """The fully qualified path (scheme and authority) the path resolves to."""
        if self.sc is None:
            return "file:" + os.path.abspath(self._local(path))
        fs, p = self._fs(path)
        return str(fs.makeQualified(p).toString())

    def write_bytes(self, path: str, data: bytes) -> None:
        if self.sc is None:
            local = self._local(path)
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            with open(local, "wb") as f:
                f.write(data)
            return
        fs, p = self._fs(path)
        out = fs.create(p, True)  # creates parent directories, overwrites
        try:
            view = memoryview(data)
            for pos in range(0, len(view), _CHUNK):
                out.write(bytes(view[pos : pos + _CHUNK]))
        finally:
            out.close()

    def read_bytes(self, path: str) -> bytes:
        if self.sc is None:
            with open(self._local(path), "rb") as f:
                return f.read()
        jvm = self.sc._jvm
        fs, p = self._fs(path)
        if not fs.exists(p):
            raise FileNotFoundError(f"{self.qualified(path)} does not exist")
        sink = jvm.java.io.ByteArrayOutputStream()
        jvm.org.apache.hadoop.io.IOUtils.copyBytes(fs.open(p), sink, 1 << 16, True)
        return bytes(sink.toByteArray())

    def exists(self, path: str) -> bool:
        if self.sc is None:
            return os.path.exists(self._local(path))
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def first_file(self, path: str, skip_prefixes: tuple[str, ...] = ("_", ".")) -> str | None:
        """``path`` itself when it is a file, else the first data file found under it (depth first,
        names sorted; names starting with ``skip_prefixes``, such as ``_SUCCESS``, skipped)."""
        if self.sc is None:
            local = self._local(path)
            if os.path.isfile(local):
                return local
            for root, dirs, files in os.walk(local):
                dirs[:] = sorted(d for d in dirs if not d.startswith(skip_prefixes))
                for name in sorted(files):
                    if not name.startswith(skip_prefixes):
                        return os.path.join(root, name)
            return None
        fs, p = self._fs(path)
        if not fs.exists(p):
            return None
        stack = [p]
        while stack:
            here = stack.pop()
            status = fs.getFileStatus(here)
            if status.isFile():
                return str(here.toString())
            children = sorted(fs.listStatus(here), key=lambda st: st.getPath().getName(), reverse=True)
            stack.extend(st.getPath() for st in children if not st.getPath().getName().startswith(skip_prefixes))
        return None

    def read_head(self, path: str, n: int) -> bytes:
        """The first ``n`` bytes of a file."""
        if self.sc is None:
            with open(self._local(path), "rb") as f:
                return f.read(n)
        fs, p = self._fs(path)
        stream = fs.open(p)
        try:
            out = bytearray()
            for _ in range(n):  # a few bytes: one call each (a Java byte[] filled in place is not seen from Python)
                b = stream.read()
                if b < 0:
                    break
                out.append(b)
            return bytes(out)
        finally:
            stream.close()

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, replacing ``dst`` (Hadoop's rename refuses to overwrite, so
        ``dst`` is deleted first)."""
        if self.sc is None:
            os.replace(self._local(src), self._local(dst))
            return
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        if fs.exists(d):
            fs.delete(d, False)
        if not fs.rename(s, d):
            raise OSError(f"cannot rename {self.qualified(src)} to {self.qualified(dst)}")

    def replace_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` so that a reader finds the old or the new whole file, never a part: written
        to ``path.tmp``, then renamed over ``path`` (:meth:`read_replaced` reads it back)."""
        self.write_bytes(path + ".tmp", data)
        self.rename(path + ".tmp", path)

    def read_replaced(self, path: str) -> bytes | None:
        """What :meth:`replace_bytes` last wrote to ``path`` (``path.tmp`` after a crash between the rename's delete
        and its move); ``None`` when neither exists."""
        for p in (path, path + ".tmp"):
            if self.exists(p):
                return self.read_bytes(p)
        return None

    def delete(self, path: str) -> None:
        if self.sc is None:
            import shutil

            local = self._local(path)
            if os.path.isdir(local):
                shutil.rmtree(local)
            elif os.path.exists(local):
                os.remove(local)
            return
        fs, p = self._fs(path)
        fs.delete(p, True)


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
