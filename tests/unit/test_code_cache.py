"""sparkdl_train.worker.code_cache: modules imported from zip archives compiled once per host, in fresh
interpreters (a module imported once stays imported in a process)."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

from sparkdl_train._folders import private_folder
from sparkdl_train.worker import code_cache

_IMPORT = r"""
import json, sys, traceback
from sparkdl_train.worker import code_cache
folder = code_cache.install(sys.argv[1])
import pkg.mod
try:
    pkg.mod.fails()
except ZeroDivisionError:
    frame = traceback.extract_tb(sys.exc_info()[2])[-1]
print(json.dumps({"folder": folder, "hits": code_cache.hits, "misses": code_cache.misses, "value": pkg.mod.VALUE,
                  "file": pkg.mod.__file__, "co_filename": pkg.mod.fails.__code__.co_filename,
                  "frame": [frame.filename, frame.lineno, frame.line], "loader": type(pkg.mod.__loader__).__name__,
                  "package_path": list(pkg.__path__)}))
"""


def _archive(path, value=1):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "PACKAGE = True\n")
        z.writestr("pkg/mod.py", f"VALUE = {value}\n\n\ndef fails():\n    return 1 / 0  # the line a traceback shows\n")
    return str(path)


def _run(archive, setting):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([archive, os.getcwd()])}
    out = subprocess.run([sys.executable, "-c", _IMPORT, setting], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_zip_archives_modules_are_compiled_once_then_loaded(tmp_path):
    folder = str(tmp_path / "code")
    archive = _archive(tmp_path / "lib.zip")
    first = _run(archive, folder)
    assert first["folder"] == folder and (first["misses"], first["hits"]) == (2, 0)  # pkg and pkg.mod
    assert len([n for n in os.listdir(folder) if n.endswith(".code")]) == 2
    assert os.stat(folder).st_mode & 0o777 == 0o700
    second = _run(archive, folder)
    assert (second["misses"], second["hits"]) == (0, 2)
    for r in (first, second):
        assert r["value"] == 1 and r["loader"] == "CachingZipImporter"
        assert r["file"] == os.path.join(archive, "pkg", "mod.py") == r["co_filename"]
        assert r["frame"] == [r["file"], 5, "return 1 / 0  # the line a traceback shows"]  # source lines from the archive
        assert r["package_path"] == [os.path.join(archive, "pkg")]


def test_the_same_source_elsewhere_is_found_and_names_its_new_archive(tmp_path):
    folder = str(tmp_path / "code")
    _run(_archive(tmp_path / "lib.zip"), folder)
    moved = str(tmp_path / "elsewhere" / "lib.zip")  # YARN localizes pyspark.zip at a new path per application
    os.makedirs(os.path.dirname(moved))
    shutil.copy(tmp_path / "lib.zip", moved)
    r = _run(moved, folder)
    assert (r["misses"], r["hits"]) == (0, 2)
    assert r["co_filename"] == r["frame"][0] == os.path.join(moved, "pkg", "mod.py")


def test_changed_source_is_compiled_afresh_and_a_damaged_entry_replaced(tmp_path):
    folder = str(tmp_path / "code")
    _run(_archive(tmp_path / "lib.zip"), folder)
    r = _run(_archive(tmp_path / "lib2.zip", value=2), folder)
    assert r["value"] == 2 and (r["misses"], r["hits"]) == (1, 1)  # pkg/__init__.py is unchanged
    entries = sorted(os.listdir(folder))
    assert len(entries) == 3
    for name in entries:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"\xe3 not marshal data")
    r = _run(_archive(tmp_path / "lib2.zip", value=2), folder)
    assert r["value"] == 2 and (r["misses"], r["hits"]) == (2, 0)
    assert _run(str(tmp_path / "lib2.zip"), folder)["hits"] == 2  # rewritten whole


def test_off_and_a_folder_others_may_write_to_leave_zipimport_as_it_is(tmp_path):
    archive = _archive(tmp_path / "lib.zip")
    r = _run(archive, "off")
    assert r["folder"] is None and r["loader"] == "zipimporter" and r["value"] == 1
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert "others may write" in private_folder(str(shared))
    r = _run(archive, str(shared))
    assert r["folder"] is None and r["loader"] == "zipimporter" and os.listdir(shared) == []


def test_settings_and_trimming(tmp_path):
    assert code_cache.folder_from("off") is None
    assert code_cache.folder_from(None) == code_cache.folder_from("auto") == code_cache.default_folder()
    assert code_cache.folder_from(" /x/y ") == "/x/y"
    store = code_cache._Store(str(tmp_path))
    for i in range(10):
        path = tmp_path / f"{i:02d}.code"
        path.write_bytes(b"x")
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "other.txt").write_text("not an entry")
    assert store.trim(limit=12) == 0
    assert store.trim(limit=8) == 4  # down to three quarters of the limit, the oldest first
    assert sorted(os.listdir(tmp_path)) == [f"{i:02d}.code" for i in range(4, 10)] + ["other.txt"]
