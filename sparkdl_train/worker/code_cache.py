"""Compiled code kept across processes for the modules an executor's Python imports from zip archives.

Spark puts ``pyspark.zip`` (and py4j's zip) first on every executor Python's path. Python keeps no
compiled copy of a module it imports from a zip archive (``zipimport`` runs ``.pyc`` entries of the
archive itself, and Spark's has none), so each Python worker daemon compiles from source every pyspark
module its workers use, in every application, on every executor: about a quarter of the worker daemon's
start (``python -m bench.e2e.daemon_start``; the daemon's start is most of a cold fit's wait for its
executors).

:func:`install` puts a path hook ahead of ``zipimport``'s: modules of a zip archive load from it as
before, but their code is compiled once per host and user and kept in a folder, one file per module
source, named by a hash of the source's bytes and of Python's bytecode version, so a file is found again
whatever the archive's path (YARN localizes ``pyspark.zip`` afresh for each application) and a new
Spark's modules are new files. Code loaded from there names the archive it was imported from, as
compiled code always does.

The folder is ``SPARKDL_TRAIN_CODE_CACHE`` (``spark.executorEnv.SPARKDL_TRAIN_CODE_CACHE``): ``auto``
(default: ``sparkdl_train-code-<uid>`` in the host's temporary directory), ``off``, or a folder. One owned
by another user or writable by others is not used (what is loaded from it is run). It holds at most
:data:`MAX_ENTRIES` files: past that, a process that adds one removes the oldest quarter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import marshal
import os
import sys
import tempfile
import types
import zipimport
from typing import Any

from .._folders import private_folder

log = logging.getLogger(__name__)

ENV = "SPARKDL_TRAIN_CODE_CACHE"
MAX_ENTRIES = 4000  # a Spark release's pyspark and py4j modules are about 400 files, 8 MB

hits = 0  # modules this process loaded from the folder
misses = 0  # modules it compiled (and stored)


def default_folder() -> str:
    return os.path.join(tempfile.gettempdir(), f"sparkdl_train-code-{os.getuid()}")


def folder_from(setting: str | None) -> str | None:
    """The folder ``setting`` names (``auto``/unset, ``off``, a path): None for off."""
    setting = (setting or "auto").strip()
    if setting == "off":
        return None
    return default_folder() if setting == "auto" else setting


class _Store:
    def __init__(self, folder: str):
        self.folder = folder
        self.trimmed = False

    def path_of(self, source: bytes) -> str:
        h = hashlib.sha256(importlib.util.MAGIC_NUMBER)
        h.update(bytes([sys.flags.optimize]))
        h.update(source)
        return os.path.join(self.folder, h.hexdigest() + ".code")

    def code(self, source: bytes, filename: str) -> Any:
        """The code object of ``source`` as compiled from ``filename``: loaded when stored, else compiled and stored."""
        global hits, misses
        path = self.path_of(source)
        try:
            with open(path, "rb") as f:
                code = marshal.loads(f.read())
        except (OSError, EOFError, ValueError, TypeError):  # none stored, or a damaged file: compiled again
            code = None
        if isinstance(code, types.CodeType):
            _fix_filename(code, filename)
            hits += 1
            return code
        code = compile(source, filename, "exec", dont_inherit=True)
        misses += 1
        self._store(path, marshal.dumps(code))
        return code

    def _store(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # a reader sees the whole file or none
        except OSError as exc:
            log.debug("code cache: could not store %s: %s", path, exc)
            try:
                os.remove(tmp)
            except OSError:
                pass
            return
        if not self.trimmed:
            self.trimmed = True
            self.trim()

    def trim(self, limit: int = MAX_ENTRIES) -> int:
        """Past ``limit`` files, remove the oldest (by modification time) down to three quarters of it; returns how many."""
        try:
            entries = [e for e in os.scandir(self.folder) if e.name.endswith(".code")]
        except OSError:
            return 0
        if len(entries) <= limit:
            return 0
        entries.sort(key=lambda e: e.stat().st_mtime)
        removed = 0
        for e in entries[: len(entries) - limit * 3 // 4]:
            try:
                os.remove(e.path)
                removed += 1
            except OSError:
                pass
        return removed


def _fix_filename(code: Any, filename: str) -> None:
    """Name ``filename`` in ``code`` and the code nested in it, as Python does for a ``.pyc`` of a moved source."""
    import _imp

    _imp._fix_co_filename(code, filename)


class CachingZipImporter(zipimport.zipimporter):
    """``zipimport.zipimporter`` whose modules' code comes from the folder's store (:func:`install`)."""

    store: _Store | None = None

    def get_code(self, fullname: str) -> Any:
        store = type(self).store
        entry = self._source_entry(fullname) if store is not None else None
        if entry is None:
            return super().get_code(fullname)  # bytecode entries, or no store
        inner, source = entry
        return store.code(source, os.path.join(self.archive, inner))

    def get_filename(self, fullname: str) -> str:
        # zipimport's compiles the module to find its file name (every spec asks for it): a second compile
        inner = self._source_name(fullname) if type(self).store is not None else None
        return os.path.join(self.archive, inner) if inner is not None else super().get_filename(fullname)

    def _source_name(self, fullname: str) -> str | None:
        """The archive's entry for ``fullname``'s source, if it has one."""
        try:
            package = self.is_package(fullname)
        except zipimport.ZipImportError:
            return None
        name = self.prefix + fullname.rpartition(".")[2]
        inner = os.path.join(name, "__init__.py") if package else name + ".py"
        files = self._get_files() if hasattr(self, "_get_files") else self._files  # Python 3.13 reads the listing lazily
        return inner if inner in files else None

    def _source_entry(self, fullname: str) -> tuple[str, bytes] | None:
        inner = self._source_name(fullname)
        if inner is None:
            return None
        try:
            return inner, self.get_data(inner)
        except OSError:
            return None


def _hook(path: str) -> CachingZipImporter:
    return CachingZipImporter(path)  # ZipImportError (an ImportError) for anything but a zip: the next hook's


def install(setting: str | None = None) -> str | None:
    """Import this process's modules from zip archives through the store in ``setting``'s folder (default:
    ``SPARKDL_TRAIN_CODE_CACHE``). Returns the folder (None: off, or a folder that cannot be used, logged).
    Modules imported before are left as they are; calling it again changes nothing but the folder."""
    folder = folder_from(setting if setting is not None else os.environ.get(ENV))
    if folder is None:
        return None
    why = private_folder(folder)
    if why is not None:
        log.warning("sparkdl_train: modules from zip archives are compiled afresh in this process: %s cannot hold "
                    "their code (%s); %s names another folder", folder, why, ENV)
        return None
    CachingZipImporter.store = _Store(folder)
    if _hook not in sys.path_hooks:
        sys.path_hooks.insert(0, _hook)
        # archives already asked for a module keep zipimport's importer in this cache: ask the hooks again
        for entry, finder in list(sys.path_importer_cache.items()):
            if type(finder) is zipimport.zipimporter:
                del sys.path_importer_cache[entry]
    return folder
