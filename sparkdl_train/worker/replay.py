"""A partition read once and trained on for several epochs: the chunks a stage's first epoch
reads from Spark are written to a local file as they stream past, and the later epochs of the
same stage read them back from it (``spark.sparkdl_train.allreduce.epochsPerStage``).

The file is the executor's: an unnamed temporary file in Spark's local directory
(``SPARK_LOCAL_DIRS``, else the system's), gone when the task closes it or its process dies.
Arrays are written with ``numpy.save`` without pickle (object columns as numpy strings); a chunk
is read back one at a time, so memory holds what one epoch's stream holds, never the partition.
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Any, Iterable, Iterator

import numpy as np

from ..data.batching import Batch, tree_leaves, tree_map


def _plain(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == object:  # strings from Arrow: numpy's own string dtype saves without pickle
        a = np.array(a.tolist())
        if a.dtype == object:
            raise TypeError("a column of mixed Python objects cannot be kept for the stage's later epochs")
    return a


def local_dir() -> str | None:
    """Spark's first local directory on this executor (where it spills shuffles), if it set one."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = dirs.split(",")[0].strip()
    return first if first and os.path.isdir(first) else None


class Replay:
    """Iterate :meth:`first` over the stream once, then :meth:`again` as often as needed."""

    def __init__(self, directory: str | None = None, path: str | None = None):
        self._file: IO[bytes] | None = None
        self.path = path  # a named file (read back by another process: :meth:`saved`); None: unnamed
        self.directory = directory if directory is not None else local_dir()  # None: the system's temporary folder
        self._template: Batch | None = None
        self.chunks = 0
        self.bytes = 0

    def first(self, chunks: Iterable[Batch]) -> Iterator[Batch]:
        """``chunks`` as they come, each written to the file before it is handed on."""
        self._file = open(self.path, "w+b") if self.path is not None else \
            tempfile.TemporaryFile(prefix="sparkdl_train-partition-", dir=self.directory)
        for chunk in chunks:
            leaves = [_plain(a) for a in tree_leaves(chunk)]
            if self._template is None:
                self._template = chunk
            start = self._file.tell()
            np.save(self._file, np.array(len(leaves), np.int64), allow_pickle=False)
            for a in leaves:
                np.save(self._file, a, allow_pickle=False)
            self.bytes += self._file.tell() - start
            self.chunks += 1
            yield chunk

    @property
    def template(self) -> Batch | None:
        """The first chunk's structure with no rows (None before one was seen)."""
        return None if self._template is None else tree_map(lambda a: _plain(a)[:0], self._template)

    @classmethod
    def saved(cls, path: str, chunks: int, template: Batch) -> "Replay":
        """The ``chunks`` chunks another Replay wrote to ``path``, structured as ``template``."""
        replay = cls(path=path)
        replay._file = open(path, "rb")
        replay.chunks, replay._template = chunks, template
        return replay

    def again(self) -> Iterator[Batch]:
        """The chunks :meth:`first` saw, in the same order, read back one at a time."""
        if self._file is None:
            raise RuntimeError("Replay.again() before the first pass")
        self._file.seek(0)
        for _ in range(self.chunks):
            n = int(np.load(self._file, allow_pickle=False))
            leaves = iter([np.load(self._file, allow_pickle=False) for _ in range(n)])
            yield tree_map(lambda _: next(leaves), self._template)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
