"""Run by test_connect.py in its own process (a Spark Connect client turns its whole process to
Connect mode): SparkModel on a Spark Connect session, against the server the test started.

    python tests/scripts/connect_check.py sc://127.0.0.1:PORT {engines|cluster}

``engines``: each engine family once on the server's ``local[2]`` (averaging, allreduce, the
asynchronous parameter server per batch), evaluate and predict against single-process Keras,
the Spark ML estimator, cancellation by tag, a validation split, the errors (an RDD, a
parameter server the executors cannot reach). ``cluster``: one fit on a ``local-cluster``
server, with where its tasks ran. Prints one ``RESULT {json}`` line.
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pandas as pd
from helpers import digits_frame as frame
from helpers import digits_split, make_mlp
from pyspark.sql import SparkSession

from sparkdl_train import SparkModel
from sparkdl_train.errors import ConfigError, DataError, FitCancelled


def where(sm):
    parts = [i for e in sm.stats.epochs for i in e.partitions.values()]
    return {"executors": sorted({str(i.get("executor_id")) for i in parts}), "pids": sorted({i["pid"] for i in parts})}


def accuracy(model, xt, yt):
    return float(model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])


def engines(spark, out):
    x, y, xt, yt = digits_split()
    df = frame(spark, x, y)
    started = time.perf_counter()

    # averaging, with a validation split and the Keras History back
    model = make_mlp()
    sm = SparkModel(model, mode="synchronous", frequency="epoch", num_workers=2)
    hist = sm.fit(df, epochs=6, batch_size=32, verbose=0, validation_split=0.2)
    out["averaging"] = {"accuracy": accuracy(model, xt, yt), "history": sorted(hist.history), **where(sm),
                        "phases": sorted(sm.stats.phases)}

    # allreduce: a barrier stage through mapInArrow(barrier=True), ranks from allGather
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2)
    sm.fit(df, epochs=6, batch_size=32, verbose=0)
    out["allreduce"] = {"accuracy": accuracy(model, xt, yt), **where(sm)}

    # the synchronous parameter server: rounds every 2 steps
    model = make_mlp()
    sm = SparkModel(model, mode="synchronous", frequency=2, num_workers=2)
    sm.fit(df, epochs=4, batch_size=32, verbose=0)
    out["synchronous"] = {"accuracy": accuracy(model, xt, yt), **where(sm), "updates": (sm.stats.server or {}).get("updates")}

    # the asynchronous parameter server, pushes per batch, live reports into a batch callback
    import keras

    seen = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    model = make_mlp()
    sm = SparkModel(model, mode="asynchronous", frequency="batch", num_workers=2)
    sm.fit(df, epochs=6, batch_size=32, verbose=0, callbacks=[Batches()])
    server = sm.stats.server or {}
    out["asynchronous"] = {"accuracy": accuracy(model, xt, yt), **where(sm), "batch_callbacks": len(seen),
                           "updates": server.get("updates"), "server": server.get("address"),
                           "reports": sm.stats.reports,
                           "connect_probe": "connect_probe" in sm.stats.phases}

    # evaluate and predict: globally correct metrics, a DataFrame column, against single-process Keras
    test = frame(spark, xt, yt)
    dist = sm.evaluate(test, return_dict=True)
    local = model.evaluate(xt, yt, verbose=0, return_dict=True)
    pred = sm.predict(test, batch_size=100)
    rows = pred.select("id", "prediction").toPandas().sort_values("id")
    got = np.stack(rows["prediction"].to_numpy())
    out["evaluate"] = {"loss_diff": abs(dist["loss"] - local["loss"]), "accuracy_diff": abs(dist["accuracy"] - local["accuracy"])}
    out["predict"] = {"type": type(pred).__module__, "columns": pred.columns, "rows": len(rows),
                      "max_diff": float(np.abs(got - model.predict(xt, verbose=0)).max())}

    # the Spark ML estimator and its model's transform
    from sparkdl_train.ml import KerasEstimator

    est = KerasEstimator(model=make_mlp(), mode="synchronous", frequency="epoch", epochs=4, batchSize=32, numWorkers=2)
    fitted = est.fit(df)
    scored = fitted.transform(test).select("id", "prediction").toPandas()
    labels = np.argmax(np.stack(scored.sort_values("id")["prediction"].to_numpy()), axis=1)
    out["estimator"] = {"accuracy": float((labels == yt).mean())}
    try:
        fitted.write().overwrite().save(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"connect-est-{os.getpid()}"))
    except ConfigError as exc:
        out["estimator"]["save"] = str(exc)

    # cancellation from another thread: operations tagged with the fit's tag are interrupted
    model = make_mlp()
    sm = SparkModel(model, mode="asynchronous", frequency="batch", num_workers=2)
    cancelled = {"raised": None, "seconds": None}

    def cancel_when_running():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (sm.stats and sm.stats.epochs):
            if sm.job_group is not None:
                time.sleep(1.0)
                sm.cancel()
                cancelled["at"] = time.perf_counter()
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_when_running, daemon=True)
    canceller.start()
    try:
        sm.fit(df, epochs=200, batch_size=8, verbose=0)
    except FitCancelled as exc:
        cancelled["raised"] = type(exc).__name__
        cancelled["seconds"] = time.perf_counter() - cancelled.get("at", time.perf_counter())
    canceller.join(5)
    out["cancel"] = cancelled
    # the session still works after the interrupt
    out["after_cancel_rows"] = int(spark.range(0, 10).count())

    # the flagship's multi-input DeepFM on generated CTR data (a dict of columns), the job's --mode asynchronous
    from pyspark.sql import functions as F

    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.models.ctr import build_vocabulary, ctr_features, deepfm

    raw = ctr_data.generate(spark, ctr_data.CTRSpec(rows=40_000, seed=7))
    is_test = F.pmod(F.xxhash64("id"), F.lit(10)) == 0
    vocab = build_vocabulary(raw.where(~is_test), ctr_data.CAT_COLS, min_count=5)
    train = ctr_features(raw.where(~is_test), ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, ["label"]).repartition(2).cache()
    test_ctr = ctr_features(raw.where(is_test), ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, ["label", "p_true"]).cache()
    keras.utils.set_random_seed(7)
    ctr_model = deepfm(vocab_size=vocab.size, embed_dim=8, hidden=(64, 32), learning_rate=0.002)
    ctr_sm = SparkModel(ctr_model, mode="asynchronous", frequency=4, seed=7)
    columns = dict(feature_cols={"numeric": "numeric", "categorical": "categorical"}, label_col="label")
    ctr_hist = ctr_sm.fit(train, epochs=2, batch_size=512, verbose=0, validation_data=test_ctr, **columns)
    out["ctr"] = {"val_auc": max(ctr_hist.history["val_auc"]), "bayes_auc": ctr_data.bayes_metrics(test_ctr)["auc"],
                  "workers": ctr_sm.stats.num_workers}

    # errors: an RDD-style input, a parameter server whose address executors cannot reach
    errors = {}
    try:
        SparkModel(make_mlp()).fit([(x[0], y[0])])
    except DataError as exc:
        errors["rows"] = str(exc)
    from sparkdl_train import to_simple_rdd

    try:
        to_simple_rdd(spark, x, y)
    except DataError as exc:
        errors["to_simple_rdd"] = str(exc)
    t0 = time.perf_counter()
    try:
        SparkModel(make_mlp(), mode="hogwild", num_workers=2, ps_host="192.0.2.1").fit(df, epochs=1, verbose=0)
    except ConfigError as exc:
        errors["unreachable"] = str(exc)
        errors["unreachable_seconds"] = time.perf_counter() - t0
    # executors that cannot connect back (a listener that never listens, as behind a firewall):
    # the probe says so, and a parameter-server fit on that address fails before any training stage
    import socket

    from sparkdl_train.data.sessions import session_context
    from sparkdl_train.driver.connect import check_reachable

    def deaf(address):
        s = socket.socket()
        s.bind(address)  # bound, not listening: a connection is refused
        return s

    ctx = session_context(spark)
    ctx.reachable.clear()  # the earlier fits found 127.0.0.1 reachable
    errors["probe"] = check_reachable(ctx, "127.0.0.1", timeout=3.0, listen=deaf)
    t0 = time.perf_counter()
    try:
        SparkModel(make_mlp(), mode="asynchronous", num_workers=2).fit(df, epochs=1, verbose=0)
    except ConfigError as exc:
        errors["refused"] = str(exc)
        errors["refused_seconds"] = time.perf_counter() - t0
    ctx.reachable.clear()
    # a model whose archive and state exceed the server's message limit (40 MiB in the test's server)
    import keras as K

    big = K.Sequential([K.Input((3000,)), K.layers.Dense(3000), K.layers.Dense(1)])
    big.compile("adam", "mse")
    try:
        SparkModel(big, mode="synchronous", frequency="epoch", num_workers=2).fit(
            spark.createDataFrame(pd.DataFrame({"features": list(np.zeros((4, 3000))), "label": np.zeros(4)})), verbose=0)
    except ConfigError as exc:
        errors["too_big"] = str(exc)
    from sparkdl_train import warm_up

    try:
        warm_up(spark, kind="rdd")
    except ConfigError as exc:
        errors["warm_up_rdd"] = str(exc)
    out["errors"] = errors
    out["seconds"] = time.perf_counter() - started


def cluster(spark, out):
    x, y, xt, yt = digits_split()
    df = frame(spark, x, y)
    model = make_mlp()
    sm = SparkModel(model, mode="hogwild", frequency="epoch", num_workers=2)
    sm.fit(df, epochs=6, batch_size=32, verbose=0)
    out["hogwild"] = {"accuracy": accuracy(model, xt, yt), **where(sm), "master": sm.stats.master}
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2)
    sm.fit(df, epochs=6, batch_size=32, verbose=0)
    out["allreduce"] = {"accuracy": accuracy(model, xt, yt), **where(sm)}
    out["environment"] = executor_environment(spark)


def executor_environment(spark):
    """The Python and the sparkdl_train each executor's tasks ran (a mapInArrow stage on the server's cluster)."""
    import pyarrow as pa

    def probe(batches):
        import sys as _sys

        import sparkdl_train
        from sparkdl_train.worker.identity import executor_id

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"executor": [str(executor_id())], "python": [_sys.executable],
                                          "module": [sparkdl_train.__file__]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(probe, "executor string, python string, module string").collect()
    return sorted({(r["executor"], r["python"], r["module"]) for r in rows})


def main(url: str, what: str) -> None:
    spark = SparkSession.builder.remote(url).getOrCreate()
    out = {"driver_pid": os.getpid(), "session": type(spark).__module__}
    try:
        spark.sparkContext  # noqa: B018 - proves this is a Connect client
        out["has_spark_context"] = True
    except Exception:  # noqa: BLE001
        out["has_spark_context"] = False
    {"engines": engines, "cluster": cluster}[what](spark, out)
    print("RESULT " + json.dumps(out, default=str), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
