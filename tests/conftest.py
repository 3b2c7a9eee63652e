"""Shared fixtures and the suite's layout.

tests/unit      pure: no Spark, no JVM (numpy, Keras, sockets on loopback)
tests/spark     on this session's local[2] SparkSession, or local Spark in a process of its own
tests/cluster   local-cluster, standalone Master and Workers, spark-submit: marked slow by this folder
tests/elephas   Elephas' own tests against the drop-in
tests/support   modules the tests and scripts import (helpers, models, the model corpus, README blocks)
tests/scripts   programs the tests start in processes of their own (spark-submit jobs, clients, checks)
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# every process the tests start imports the checkout's bench package, tests/support and tests/scripts as the tests do
# (pyproject.toml's pythonpath); the standalone daemons get a minimal environment of their own
_PATHS = [os.path.dirname(_HERE), os.path.join(_HERE, "support"), os.path.join(_HERE, "scripts")]
_INHERITED = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _PATHS]  # xdist workers inherit ours
os.environ["PYTHONPATH"] = os.pathsep.join(_PATHS + _INHERITED)

# Executors must run this interpreter (it has keras); set before any JVM starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402 - after the environment above
from helpers import REFERENCE_EPOCHS, ROOT, TEST_JVM_OPTIONS, digits_split, make_mlp  # noqa: E402

if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # inherited by every JVM started from here
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Everything under tests/cluster is slow (it runs in .ci/run's second suite, `./run test -m slow`)."""
    cluster = os.path.join(_HERE, "cluster") + os.sep
    for item in items:
        if str(item.path).startswith(cluster):
            item.add_marker(pytest.mark.slow)


# Where the wall time went, per pytest-xdist worker and file (.ci/run's budget): each file's first start and last
# stop on its worker, from the reports the controller receives; printed at the end for files over FILE_WALL_SHOWN s.
FILE_WALL_SHOWN = 60.0
_file_spans: dict[tuple[str, str], list[float]] = {}


def pytest_runtest_logreport(report):
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is None or stop is None:
        return
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    span = _file_spans.setdefault((worker, report.nodeid.split("::")[0]), [start, stop])
    span[0], span[1] = min(span[0], start), max(span[1], stop)


def pytest_terminal_summary(terminalreporter):
    if not _file_spans:
        return
    began = min(s for s, _ in _file_spans.values())
    ended = max(e for _, e in _file_spans.values())
    lines = []
    for worker in sorted({w for w, _ in _file_spans}):
        files = sorted(((s, e, f) for (w, f), (s, e) in _file_spans.items() if w == worker))
        busy = sum(e - s for s, e, _ in files)
        lines.append(f"{worker}: {len(files)} files, busy {busy:.0f} s of {ended - began:.0f} s; last file ends at "
                     f"{files[-1][1] - began:.0f} s")
        lines += [f"  {s - began:6.0f} s +{e - s:5.0f} s  {f}" for s, e, f in files if e - s >= FILE_WALL_SHOWN]
    terminalreporter.write_sep("=", f"wall per worker and file (files over {FILE_WALL_SHOWN:.0f} s)")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def _spark_scratch(tmp_path_factory):
    """Spark's scratch (block manager, broadcast and shuffle files) under this run's pytest
    directory instead of /tmp, for every JVM the tests start (sessions, spark-submit, local-cluster):
    a run that is killed leaves it where pytest's rotation of old runs removes it (stale Spark
    scratch in /tmp once filled the disk, docs/testing.md)."""
    if "SPARK_LOCAL_DIRS" not in os.environ:
        os.environ["SPARK_LOCAL_DIRS"] = str(tmp_path_factory.mktemp("spark-scratch"))
    yield os.environ["SPARK_LOCAL_DIRS"]


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone Master and two Workers (1 core, 2 GiB each), for the session: each Worker on a
    host of its own (a network namespace, its link 1 Gb/s; minicluster/hosts.py) and the Master on the
    bridge's address where this machine can create namespaces, else all on 127.0.0.1 (tests that need
    hosts then skip, saying why: :func:`hosts`). The network is removed by name when the session ends,
    and checked gone."""
    from minicluster import hosts
    from minicluster.standalone import StandaloneCluster

    why = hosts.unavailable()
    network = hosts.HostNetwork(hosts=2).create() if why is None else None
    try:
        cluster = StandaloneCluster(str(tmp_path_factory.mktemp("standalone")), network=network, jvm_options=TEST_JVM_OPTIONS)
        cluster.unavailable = why
        cluster.start()
        yield cluster
        cluster.stop()
    finally:
        if network is not None:
            network.remove()
            assert not network.leftovers(), network.leftovers()


@pytest.fixture
def hosts(standalone_cluster):
    """The standalone cluster's host network (skips where the machine cannot make one)."""
    if standalone_cluster.network is None:
        pytest.skip(f"no hosts of their own on this machine: {standalone_cluster.unavailable}")
    return standalone_cluster.network


@pytest.fixture(autouse=True)
def _prune_standalone_executors(request):
    """After a test on the standalone cluster, free the environments its executors unpacked."""
    yield
    if "standalone_cluster" in request.fixturenames:
        request.getfixturevalue("standalone_cluster").prune()


def _packed(tmp_path_factory, name: str, pack) -> str:
    """The archive ``name`` that ``pack(folder)`` writes into ``folder``, built once for all pytest-xdist
    workers, in the folder their base temps share, under a file lock (the first worker to need it
    packs; the others wait and reuse it)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    where = shared / f"pack_{name}"
    archive = where / name
    with open(shared / f"pack_{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while packing: 1-1.5 min
        if not (where / "done").exists():
            where.mkdir(exist_ok=True)
            pack(str(where))
            assert archive.exists(), f"packing wrote no {archive}"
            (where / "done").write_text("packed\n")
    return str(archive)


@pytest.fixture(scope="session")
def env_archive(tmp_path_factory):
    """sparkdl_env.tar.gz (a regular install, as shipped to a cluster), built by the README's own
    `./run pack` line (section Clusters), run as written in a clean shell from a scratch folder, once
    for the session's workers (:func:`_packed`)."""
    import readme

    def pack(where):
        (line,) = [c for c in readme.commands("Clusters") if c.startswith("./run pack")]
        readme.run(readme.substitute(line, {"./run ": os.path.join(ROOT, "run") + " "}), where, timeout=1800)

    return _packed(tmp_path_factory, "sparkdl_env.tar.gz", pack)


@pytest.fixture(scope="session")
def jax_env_packing(tmp_path_factory):
    """sparkdl_env_jax.tar.gz being built in a thread of its own (a future of its path): the executors'
    environment for Keras on JAX (no TensorFlow in it), as docs/clusters.md says to build it,
    `./run pack --backend jax`, once for the session's workers (:func:`_packed`). Asked for early by a
    module that needs it late (tests/cluster/test_standalone.py), the minute of packing overlaps the
    module's other applications, whose fits spend much of their time waiting (links cut, JVMs starting)."""
    from concurrent.futures import ThreadPoolExecutor

    import readme

    def pack(where):  # in a clean shell (readme.run), as the README's own line
        readme.run(f"{os.path.join(ROOT, 'run')} pack --backend jax -o sparkdl_env_jax.tar.gz", where, timeout=1800)

    with ThreadPoolExecutor(1, thread_name_prefix="jax-pack") as pool:
        yield pool.submit(_packed, tmp_path_factory, "sparkdl_env_jax.tar.gz", pack)


@pytest.fixture(scope="session")
def jax_env_archive(jax_env_packing):
    """The path of sparkdl_env_jax.tar.gz (:func:`jax_env_packing`), once it is built."""
    return jax_env_packing.result()


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdl_train-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        # small Arrow batches so the streaming/rebatching path is exercised
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .config("spark.driver.memory", "2g")
        # Python workers fork from a daemon that has TensorFlow imported already (README: Fast start)
        .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
        # keep every socket (Spark's and the parameter server's) on loopback
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


@pytest.fixture(scope="session")
def digits():
    """sklearn's bundled digits (no download), scaled, with a fixed train/test split."""
    return digits_split()


@pytest.fixture(scope="session")
def reference_accuracy(digits):
    """Held-out accuracy of single-process `model.fit` (REFERENCE_EPOCHS epochs, batch 32)."""
    x, y, xt, yt = digits
    ref = make_mlp()
    ref.fit(x, y, epochs=REFERENCE_EPOCHS, batch_size=32, verbose=0)
    return ref.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]


@pytest.fixture
def mlp():
    return make_mlp



@pytest.fixture(scope="module")
def corpus_data(spark, tmp_path_factory):
    """Users' model shapes' data and Keras' held-out metric for each (bench/workloads/corpus.py), per module.
    Keras' baselines are trained once per run and shared by the suite's workers (a file beside their temporary
    folders, written under a lock by the first that needs it)."""
    import fcntl
    import json

    from bench.workloads import corpus as model_corpus

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one folder per run, shared by its workers
    with open(shared / "corpus_keras.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = shared / "corpus_keras.json"
        if path.exists():
            metrics = json.loads(path.read_text())
        else:
            metrics = model_corpus.keras_metrics()
            path.write_text(json.dumps(metrics))
    return model_corpus.corpus_frames(spark, metrics)
