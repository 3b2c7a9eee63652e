"""The worker daemon (spark.python.daemon.module=sparkdl_train.worker.daemon): Python workers fork
with TensorFlow already imported."""

import os
import sys

from sparkdl_train.worker import daemon


def test_preload_reports_failures_and_keeps_stdout_clean(capfd):
    assert daemon.preload(("json", "sparkdl_train_no_such_module")) == ["sparkdl_train_no_such_module"]
    out, err = capfd.readouterr()
    assert out == ""  # stdout carries the daemon's port to the JVM
    assert "could not preload sparkdl_train_no_such_module: ModuleNotFoundError" in err


def test_session_workers_fork_from_the_preloading_daemon(sc):
    """The test session uses the daemon (as the shipped conf files do): every Python worker is a
    child of it and has TensorFlow and the executor modules before it runs any task code, pyspark's
    modules from Spark's zip loaded through the host's code store, and the daemon's objects frozen
    out of the garbage collector's scans (gc.freeze)."""
    assert sc.getConf().get("spark.python.daemon.module") == "sparkdl_train.worker.daemon"

    def _worker_facts(index, rows):
        import os
        import sys

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        import gc

        from sparkdl_train.worker import code_cache

        worker = sys.modules["pyspark.worker"]
        yield {"pid": os.getpid(), "parent": parent, "tensorflow_loaded": "tensorflow" in sys.modules,
               # pyspark from Spark's pyspark.zip, its code from the host's store, not compiled by each daemon
               "pyspark_from": worker.__file__, "loader": type(worker.__loader__).__name__,
               "code_store": code_cache.hits + code_cache.misses,
               "tasks_loaded": "sparkdl_train.worker.tasks" in sys.modules,
               # what TensorFlow and Keras import only in case (scikit-learn, JAX, matplotlib) stayed out of the daemon
               "speculative": sorted(m for m in ("sklearn", "jax", "matplotlib") if m in sys.modules),
               "frozen": gc.get_freeze_count(), "scanned": len(gc.get_objects())}

    facts = sc.parallelize(range(4), 4).mapPartitionsWithIndex(_worker_facts).collect()
    assert len(facts) == 4
    for f in facts:
        assert "-m sparkdl_train.worker.daemon" in f["parent"], f
        assert f["tensorflow_loaded"] and f["tasks_loaded"], f
        assert f["speculative"] == [], f
        assert "pyspark.zip" in f["pyspark_from"] and f["loader"] == "CachingZipImporter" and f["code_store"] > 50, f
        # the daemon froze what it imported: the worker's full collections scan only its own objects
        assert f["frozen"] > 100_000 and f["scanned"] < f["frozen"] // 4, f
        assert f["pid"] != os.getpid()
    assert sys.platform.startswith("linux")

    def _imports_sklearn(rows):  # hidden while the daemon imported, importable afterwards
        import sklearn

        yield sklearn.__version__

    import sklearn

    assert sc.parallelize([0], 1).mapPartitions(_imports_sklearn).collect() == [sklearn.__version__]


def test_speculative_imports_are_hidden_inside_the_block_only(monkeypatch):
    import dataclasses

    from sparkdl_train import backend

    name = "mailbox"  # a standard-library module nothing here imports
    assert name not in sys.modules
    tf = backend.CAPABILITIES["tensorflow"]
    monkeypatch.setitem(backend.CAPABILITIES, "tensorflow", dataclasses.replace(tf, speculative_imports=(name, "os")))
    with backend.without_speculative_imports("tensorflow") as hidden:
        assert hidden == [name]  # one already imported (os) is left alone
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise AssertionError(f"{name} imported inside the block")
    assert name not in sys.modules
    assert __import__(name).__name__ == name
    assert backend.CAPABILITIES["jax"].framework not in backend.CAPABILITIES["jax"].speculative_imports
    with backend.without_speculative_imports("torch") as hidden:  # not a backend of ours: the daemon still serves
        assert hidden == []
