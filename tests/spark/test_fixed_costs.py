"""Where a fit's fixed cost goes (FitStats.phases, EpochStats.phases, the tasks' startup), and
the cut that lets RDD and DataFrame (Arrow) tasks share one Python worker daemon."""

import gc
import os
import threading
import time

import numpy as np
import pytest
from helpers import spark_conf

from sparkdl_train import SparkModel
from sparkdl_train.driver.phases import TASK_STARTUP, Phases, task_startup
from sparkdl_train.driver.python_workers import SQL_SETTING, VARIABLE, share_python_workers, sql_environment


def test_phases_add_up_repeated_phases():
    p = Phases()
    with p("a"):
        time.sleep(0.01)
    with p("a"):
        time.sleep(0.01)
    p.add("b", 0.5)
    assert p.seconds["a"] >= 0.02 and p.seconds["b"] == 0.5
    with pytest.raises(ValueError), p("c"):
        raise ValueError
    assert "c" in p.seconds  # a failed phase still counts its time


def test_task_startup_is_the_slowest_task_per_cost():
    parts = {0: {"startup": {"rebuild": 0.5, "first_step": 0.1, "model_cached": False}},
             1: {"startup": {"rebuild": 0.2, "first_step": 0.9, "first_pull": 0.01}},
             2: {}}
    assert task_startup(parts) == {"rebuild": 0.5, "first_step": 0.9, "first_pull": 0.01}
    assert set(task_startup(parts)) <= set(TASK_STARTUP)


class _FakeConf:
    def __init__(self, conf):
        self.conf = conf

    def getAll(self):
        return list(self.conf.items())


class _FakeContext:
    def __init__(self, conf):
        self.environment = {"PYTHONHASHSEED": "0"}
        self._conf = _FakeConf(conf)

    def getConf(self):
        return self._conf


def test_rdd_tasks_get_the_environment_sql_tasks_get():
    assert sql_environment({}) == {VARIABLE: "1"}  # Spark's default: simplified tracebacks on
    assert sql_environment({SQL_SETTING: "false"}) == {}
    sc = _FakeContext({})
    assert share_python_workers(sc) and sc.environment == {"PYTHONHASHSEED": "0", VARIABLE: "1"}
    assert not share_python_workers(sc)  # idempotent
    off = _FakeContext({SQL_SETTING: "false"})
    assert not share_python_workers(off) and VARIABLE not in off.environment


def test_a_fit_reports_its_fixed_costs_and_can_share_one_daemon_between_rdd_and_arrow_tasks(spark, sc):
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32")
    import pandas as pd

    df = spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    try:
        with spark_conf(sc, "spark.sparkdl_train.worker.shareDaemon", "true"):  # off by default
            sm = SparkModel(model, num_workers=2)
            t0 = time.perf_counter()
            sm.fit(df, epochs=2, batch_size=64, verbose=0, feature_cols="x", label_col="y", validation_data=df)
            wall = time.perf_counter() - t0
            rdd_daemons = set(sc.parallelize(range(2), 2).map(lambda _: os.getppid()).collect())
            assert sc.environment.get(VARIABLE) == "1"
    finally:
        sc.environment.pop(VARIABLE, None)  # the rest of the session keeps Spark's two daemons

    assert sm.stats.sample_source == "query"  # the DataFrame's limit query (not cached, not Parquet files)
    costs = sm.stats.fixed_costs()
    assert {"payload", "adapter", "preflight", "plan", "sample", "sample_check", "start", "stop"} <= set(costs["driver"])
    assert {"broadcast", "job", "merge", "validation", "callbacks"} <= set(costs["first_epoch"])
    assert {"tf_import", "rebuild", "state", "first_batch", "first_step"} <= set(costs["tasks"])
    assert all(v >= 0 for k, part in costs.items() if k != "executor_start" for v in part.values()), costs
    # the suite's session runs without the executor plugin: every checked worker's daemon imported at its own start
    assert costs["executor_start"]["workers"] >= 1 and costs["executor_start"]["started_with_executor"] == 0, costs
    spent = sum(costs["driver"].values()) + sum(sum(e.phases.values()) for e in sm.stats.epochs)
    assert spent <= wall + 0.01, (spent, wall)  # phases do not overlap
    assert sm.stats.epochs[0].phases["job"] <= sm.stats.epochs[0].seconds
    d = sm.stats.as_dict()
    assert d["sample_source"] == "query" and d["phases"] == sm.stats.phases and d["epochs"][1]["task_startup"] == sm.stats.epochs[1].task_startup
    # a worker that trained in epoch 1 has the model rebuilt and its step traced when epoch 2 comes
    first = {p["pid"] for p in sm.stats.epochs[0].partitions.values()}
    assert all(p["startup"]["model_cached"] for p in sm.stats.epochs[1].partitions.values() if p["pid"] in first)

    # the DataFrame's (Arrow) training tasks and RDD tasks forked from the same daemon
    arrow_daemons = {p["daemon_pid"] for e in sm.stats.epochs for p in e.partitions.values()}
    assert arrow_daemons == rdd_daemons and os.getpid() not in arrow_daemons, (arrow_daemons, rdd_daemons)


def test_a_dataframe_adapter_knows_its_partitions_without_planning_the_query(spark, monkeypatch):
    """A DataFrame's partition count costs a query plan (df.rdd); a repartitioned or split adapter
    knows it, and the count it knows is Spark's."""
    import keras
    from pyspark.sql import DataFrame

    from sparkdl_train.driver.inputs import make_adapter

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    df = spark.range(0, 200, 1, 3).selectExpr("array(cast(id as float), 1.0f) as x", "cast(id % 2 as float) as y")
    a = make_adapter(df, model, labelled=True, feature_cols="x", label_col="y")
    assert a.num_partitions() == 3
    wider = a.with_partitions(5, shuffle=True)
    train, val = a.random_split(0.25, seed=1)
    narrower = a.with_partitions(2)  # coalesce: Spark decides how many groups it fills
    assert narrower._partitions is None
    monkeypatch.setattr(DataFrame, "rdd", property(lambda self: pytest.fail("planned the query for its partitions")))
    assert (wider.num_partitions(), train.num_partitions(), val.num_partitions()) == (5, 3, 3)
    monkeypatch.undo()
    assert [b.df.rdd.getNumPartitions() for b in (wider, train, val)] == [5, 3, 3]
    assert narrower.num_partitions() == 2


def test_the_drivers_data_check_makes_no_test_function_and_the_fit_still_merges_keras_metrics(sc, digits):
    """The driver runs a sample batch through the model before any job, without tracing a test
    function (the executors trace theirs); its compiled metrics are built for the merge."""
    from helpers import make_mlp

    from sparkdl_train import to_simple_rdd

    x, y, _, _ = digits
    model = make_mlp()
    assert model.test_function is None and model.train_function is None
    sm = SparkModel(model, mode="synchronous", num_workers=2)
    hist = sm.fit(to_simple_rdd(sc, x[:600], y[:600]), epochs=1, batch_size=32, verbose=0)
    assert "sample_check" in sm.stats.phases
    assert model.test_function is None and model.train_function is None  # the driver traced nothing
    # the epoch's accuracy is the workers' merged metric state, counted over every row
    loss = model.metrics[0]  # the loss tracker: a sample-weighted mean
    assert loss.count.numpy() == 600 and hist.history["loss"][0] == pytest.approx(float(loss.result()))
    assert hist.history["accuracy"][0] == pytest.approx(model.get_metrics_result()["accuracy"])
    # and a shape the model cannot take is still caught on the driver, before any job
    from sparkdl_train.errors import DataError

    with pytest.raises(DataError, match=r"does not fit model.*sample batch shapes"):
        sm.fit(to_simple_rdd(sc, x[:100, :60], y[:100]), epochs=1, verbose=0)


def test_narrow_and_wide_dataframe_stages_merge_to_the_same_metrics(spark):
    """Up to DRIVER_MERGE_PARTITIONS partitions the partials go to the driver through the JVM;
    wider stages merge with treeReduce. Both give the metrics of the whole data."""
    import keras
    import pandas as pd

    from sparkdl_train.data.adapters import DRIVER_MERGE_PARTITIONS

    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    expected = model.evaluate(x, y, batch_size=600, verbose=0, return_dict=True)
    df = spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y}))
    sm = SparkModel(model)
    for n in (2, DRIVER_MERGE_PARTITIONS + 4):
        got = sm.evaluate(df.repartition(n), batch_size=64, feature_cols="x", label_col="y", return_dict=True)
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5), (n, got, expected)
        assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-7), (n, got, expected)


def test_the_preflight_runs_in_the_python_workers_the_data_will_use(spark, sc):
    """Without shareDaemon, Spark keeps DataFrame (Arrow) and RDD tasks' Python workers in separate
    pools, each importing TensorFlow once: a DataFrame fit's check runs as a DataFrame stage, so the
    import it pays is the one its training reuses; started in the background, shared, not repeated."""
    import keras
    import pandas as pd

    from sparkdl_train import warm_up
    from sparkdl_train.driver import preflight
    from sparkdl_train.errors import ConfigError

    with pytest.raises(ConfigError, match="kind is one of dataframe, rdd"):
        warm_up(spark, kind="table")
    assert VARIABLE not in sc.environment  # sharing is off in this session
    preflight.forget(sc)
    check = warm_up(spark)
    again = warm_up(spark)  # while it runs: the same check; after: its cached result
    arrow = check.result()
    assert again.result() is arrow and all(r["modules"]["sparkdl_train"]["version"] == "0.1.0" for r in arrow)
    rdd = warm_up(spark, kind="rdd").result()
    # and on the driver: Keras imported and the objects alive then frozen out of the collector's scans
    from helpers import wait_until

    wait_until(lambda: not any(t.name == "sparkdl_train-warm-driver" for t in threading.enumerate()), 60, "the driver's warm-up")
    assert gc.get_freeze_count() > 100_000  # TensorFlow's import alone leaves about 400k
    arrow_daemons, rdd_daemons = {r["ppid"] for r in arrow}, {r["ppid"] for r in rdd}
    assert arrow_daemons.isdisjoint(rdd_daemons), (arrow_daemons, rdd_daemons)

    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    df = spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy")
    sm = SparkModel(model, num_workers=2)
    sm.fit(df, epochs=1, batch_size=64, verbose=0, feature_cols="x", label_col="y")
    trained = {p["daemon_pid"] for p in sm.stats.epochs[0].partitions.values()}
    assert trained <= arrow_daemons, (trained, arrow_daemons)
    assert sm.stats.environment is arrow  # the fit took the warm-up's check, it did not run another


def test_a_failing_preparation_beside_a_failing_preflight_raises_the_preflight_error():
    from sparkdl_train.driver.preflight import PendingCheck
    from sparkdl_train.driver.spark_model import _preflight_first
    from sparkdl_train.errors import ConfigError

    def broken():
        raise ConfigError("executor 3 cannot import sparkdl_train")

    failed = PendingCheck(broken, 5.0)
    failed._thread.start()
    with pytest.raises(ConfigError, match="executor 3") as info, _preflight_first(failed):
        raise RuntimeError("the sample job's Python worker crashed")
    assert isinstance(info.value.__context__, RuntimeError)
    fine = PendingCheck.finished([{"pid": 1}])
    with pytest.raises(RuntimeError, match="crashed"), _preflight_first(fine):
        raise RuntimeError("the sample job's Python worker crashed")
    assert fine.result() == [{"pid": 1}]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a worker that exited but is not reaped yet is a zombie: dead for this purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _still_alive_after(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return False
        time.sleep(0.1)
    return True


def test_an_rdd_sample_keeps_its_python_worker_where_take_ends_it(sc):
    """A fit's sample of an RDD (first_rows) reads its small partition to the end, so the Python
    worker that ran it goes back to Spark's pool (with TensorFlow and any cached model) instead of
    exiting as it does after ``take``; the rows are take's."""
    from sparkdl_train.data.sampling import first_rows

    payload = [(v, b"x" * 200) for v in range(100_000)]  # about 20 MB in: more than a task's input buffers

    def tagged(n_partitions: int):
        return sc.parallelize(payload, n_partitions).map(lambda r: (r[0], os.getpid()))

    rows = first_rows(tagged(2), 5)
    assert [r[0] for r in rows] == [r[0] for r in tagged(2).take(5)] == [0, 1, 2, 3, 4]
    kept = first_rows(tagged(1), 3)[0][1]  # the sample task's worker
    assert kept != os.getpid() and _still_alive_after(kept, 3.0)
    ended = tagged(1).take(3)[0][1]
    assert not _still_alive_after(ended, 20.0)
    # across partitions when the first has fewer rows than asked, and an empty RDD
    assert [v for v, _ in first_rows(sc.parallelize(range(6), 3).map(lambda v: (v, 0)), 5)] == [0, 1, 2, 3, 4]
    assert first_rows(sc.parallelize([], 2), 5) == []
    # a partition larger than the drain limit still gives its first rows (its worker ends, as take's)
    assert [r[0] for r in first_rows(tagged(1), 2, drain=10)] == [0, 1]


def test_an_rdd_sample_is_the_jvms_take_where_no_python_task_would_compute_it(spark, sc, monkeypatch, tmp_path):
    """Where an RDD's first partitions are computed without Python (parallelized from the driver,
    a shuffle's output, every partition cached), its sample is the JVM's take of pickled frames:
    no Python task runs (none to keep or lose); the rows are take's, across frames and partitions.
    Elsewhere (a Python map not cached, a DataFrame's rdd) a Python task reads them."""
    from sparkdl_train.data.sampling import first_rows, frame_loader, read_first_rows, runs_python

    rows = [(np.full(3, i, np.float32), np.float32(i % 2)) for i in range(3000)]
    plain = sc.parallelize(rows, 2)  # frames of 1024 rows; partition 0 holds 1500
    frame = spark.range(10).rdd
    taken = plain.take(5), frame.take(2)
    jobs = []  # Python tasks run by first_rows (take runs them too)
    real = sc.runJob
    monkeypatch.setattr(sc, "runJob", lambda *a, **k: jobs.append(a[0].id()) or real(*a, **k))

    def ids(sample):
        return [int(r[0][0]) for r in sample]

    assert not runs_python(sc, plain._jrdd)
    assert ids(first_rows(plain, 5)) == ids(taken[0]) == [0, 1, 2, 3, 4]
    assert read_first_rows(plain, 1)[1] == "jvm"
    assert ids(first_rows(plain, 2000)) == list(range(2000))  # three frames, two partitions
    assert ids(first_rows(plain, 5000)) == list(range(3000))  # all there is
    assert first_rows(sc.parallelize([], 2), 5) == []
    shuffled = plain.repartition(3)  # a Python map feeds the shuffle; the stage after it has none
    assert not runs_python(sc, shuffled._jrdd)
    got = ids(first_rows(shuffled, 7))
    assert len(got) == 7 and set(got) <= set(range(3000))
    mapped = plain.map(lambda r: (r[0] + 1, r[1])).cache()
    assert runs_python(sc, mapped._jrdd)  # not computed yet
    assert jobs == []
    assert ids(first_rows(mapped, 3)) == [1, 2, 3]  # a Python task computes (and caches) partition 0
    assert len(jobs) == 1
    mapped.count()
    assert not runs_python(sc, mapped._jrdd)  # every partition cached
    assert ids(first_rows(mapped, 3)) == [1, 2, 3] and len(jobs) == 1
    mapped.unpersist()
    assert runs_python(sc, frame._jrdd) and frame_loader(frame) is None  # Spark SQL; one frame a partition
    assert frame_loader(plain.zip(plain)) is None  # pairs of frames
    lines = tmp_path / "lines.txt"
    lines.write_text("a\nb\n")
    assert frame_loader(sc.textFile(str(lines))) is None  # UTF-8 lines
    assert read_first_rows(frame, 2) == (taken[1], "python") and len(jobs) == 2


def test_a_model_built_again_trains_on_the_workers_cached_model_and_gets_the_same_result(sc, digits):
    """The same architecture built again (new layer names) ships the same digest: the workers
    that trained the first fit train the second on their cached model without tracing, the
    driver does not rebuild it, and the result equals the first fit's, weights and history."""
    from helpers import make_mlp

    from sparkdl_train.data.rdd import to_simple_rdd

    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x.astype("float32"), y.astype("float32"), 2).cache()
    runs = []
    for _ in range(2):
        sm = SparkModel(make_mlp(seed=31), num_workers=2, worker_threads=1)
        history = sm.fit(rdd, epochs=2, batch_size=32, verbose=0).history
        runs.append((sm, history))
    (a, first), (b, second) = runs
    assert a.model.layers[0].name != b.model.layers[0].name and a._payload().digest == b._payload().digest
    trained = {(p["host"], p["pid"]) for e in a.stats.epochs for p in e.partitions.values()}
    again = [p for p in b.stats.epochs[0].partitions.values() if (p["host"], p["pid"]) in trained]
    assert again, "no task of the second fit ran in a worker of the first"
    for info in again:
        assert info["startup"]["model_cached"] is True and info["startup"]["traced"] is False, info["startup"]
    for got, want in zip(b.model.get_weights(), a.model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert second.keys() == first.keys()
    for key, values in second.items():
        assert values == pytest.approx(first[key], rel=1e-6), key


def test_a_persisted_rdd_is_sampled_once_and_others_at_every_fit(sc, monkeypatch):
    """A persisted RDD holds the same rows at every read: the fits on it take its sample once;
    an RDD that is not persisted (or no longer) is read again."""
    from sparkdl_train.data import adapters

    reads = []
    real = adapters.read_first_rows
    monkeypatch.setattr(adapters, "read_first_rows", lambda rdd, n: reads.append(rdd.id()) or real(rdd, n))
    rows = [(np.full(3, i, np.float32), np.float32(i % 2)) for i in range(40)]
    plain = sc.parallelize(rows, 2)
    kept = sc.parallelize(rows, 2).cache()
    adapter = adapters.RDDAdapter(kept)
    first = adapter.sample(8)
    assert adapter.sampled_by == "jvm"  # parallelized from the driver: frames taken by the JVM
    later = adapters.RDDAdapter(kept)  # another fit's adapter over the same RDD
    again = later.sample(8)
    assert reads == [kept.id()] and again is first and later.sampled_by == "kept"
    np.testing.assert_array_equal(first[0], np.stack([r[0] for r in rows[:8]]))
    assert adapters.RDDAdapter(kept, labelled=False).sample(8)[1] is None and len(reads) == 2  # predict's sample: x only
    adapters.RDDAdapter(plain).sample(8)
    adapters.RDDAdapter(plain).sample(8)
    assert reads[2:] == [plain.id(), plain.id()]
    kept.unpersist()
    adapters.RDDAdapter(kept).sample(8)
    assert reads[4:] == [kept.id()]


def test_a_cached_dataframe_is_sampled_once_per_column_selection(spark, monkeypatch):
    """A cached DataFrame's sample (a limit query) is taken by its first fit and reused by later
    fits selecting the same columns; other columns, a DataFrame not cached, or one no longer
    cached are queried again, and every sample holds the DataFrame's first rows."""
    from sparkdl_train.data import adapters
    from sparkdl_train.data.spec import resolve_columns

    queries = []
    real = adapters.DataFrameAdapter._first_batch
    monkeypatch.setattr(adapters.DataFrameAdapter, "_first_batch",
                        lambda self, n: queries.append((id(self.df), self.mapping.columns())) or real(self, n))
    rows = [([float(i), float(-i)], float(i % 2), float(i)) for i in range(40)]
    schema = "f array<float>, label float, g float"
    kept = spark.createDataFrame(rows, schema).coalesce(1).cache()
    plain = spark.createDataFrame(rows, schema).coalesce(1)
    on_f, on_g = resolve_columns(None, "f", "label"), resolve_columns(None, "g", "label")
    first = adapters.DataFrameAdapter(kept, on_f).sample(8)
    again = adapters.DataFrameAdapter(kept, on_f).sample(8)  # a later fit's adapter
    assert len(queries) == 1
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(first[0], np.array([[i, -i] for i in range(8)], np.float32))
    np.testing.assert_array_equal(first[1].ravel(), np.array([i % 2 for i in range(8)], np.float32))
    other = adapters.DataFrameAdapter(kept, on_g).sample(8)  # other columns: queried
    np.testing.assert_array_equal(np.ravel(other[0]), np.arange(8, dtype=np.float32))
    adapters.DataFrameAdapter(plain, on_f).sample(8)
    adapters.DataFrameAdapter(plain, on_f).sample(8)
    assert len(queries) == 4
    kept.unpersist()
    adapters.DataFrameAdapter(kept, on_g).sample(8)
    assert len(queries) == 5



def test_conf_values_are_the_contexts_conf_as_getconf_gives_it(sc):
    """A fit reads the live conf's spark.sparkdl_train.* entries and the keys it names (few py4j
    calls): the same values as sc.getConf(), including keys set on the running context."""
    from sparkdl_train.driver.spark_conf import conf_values, settings_conf

    with spark_conf(sc, "spark.sparkdl_train.network.tls", "off"), spark_conf(sc, "spark.task.cpus", "1"):
        full = dict(sc.getConf().getAll())
        settings = settings_conf(sc)
        got = conf_values(sc, ["spark.driver.host", "spark.task.cpus", "spark.not.set"])
    ours = {k: v for k, v in full.items() if k.startswith("spark.sparkdl_train.")}
    assert settings == ours and settings["spark.sparkdl_train.network.tls"] == "off", settings
    assert got == {"spark.driver.host": full["spark.driver.host"], "spark.task.cpus": "1"}, got
    assert "spark.sparkdl_train.network.tls" not in settings_conf(sc)  # removed again: read live, not cached


def test_the_jvms_sample_frames_come_through_a_local_socket_or_py4j_alike(sc):
    """The JVM's taken frames are read through a local socket, as collect reads its results;
    where that server cannot be reached, through py4j: the same bytes either way."""
    from sparkdl_train.data import sampling

    rows = [(np.full(3, i, np.float32), np.float32(i % 2)) for i in range(3000)]
    jrdd = sc.parallelize(rows, 2)._jrdd
    served = sampling._frames(sc, jrdd.take(3))
    through_py4j = [bytes(f) for f in jrdd.take(3)]
    assert served == through_py4j and len(served) == 3 and all(isinstance(f, bytes) for f in served)

    class NoServer:  # a context whose JVM has no PythonRDD.serveIterator
        _jvm = None

    assert sampling._frames(NoServer(), jrdd.take(3)) == through_py4j
