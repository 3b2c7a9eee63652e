"""Submitted once by tests/cluster/test_standalone.py with spark-submit (no master here: the cluster's) and the
shipped archive: three jobs in one application, so that the Workers' executors unpack the archive and
import TensorFlow once for all three (each job's own assertions are the test's):

* the flagship job, ``jobs/train_ctr.py`` (``--ctr`` arguments: its default engine, features from Parquet files);
* the image job, ``jobs/train_images.py`` (``--images`` arguments: PNG bytes decoded on the executors);
* RDD fits of (x, y) rows, each as a user builds them, and where and how each ran (:func:`rdd_fits`),
  per-step allreduce fits with the embedding gradients whole and as rows (:func:`sparse_allreduce_fits`),
  and parameter-server fits with float32 and bfloat16 on the wire (:func:`ps_wire_fits`):

  * ``parallelized``: ``sc.parallelize(list(zip(x, y)))`` as Elephas' to_simple_rdd builds it: the
    JVM takes the fit's sample from its frames, no Python task;
  * ``mapped``: sparkdl_train's to_simple_rdd (a Python flatMap, not cached): Python tasks read the
    sample and stay in Spark's pool;
  * ``cached`` then ``cached_again``: the same, cached and counted (every partition cached: the JVM
    path), then fitted once more (the first fit's sample kept).

The jobs run with the application's session (their ``main(argv, spark)``), loaded from their files and
registered with cloudpickle to be pickled by value (the executors cannot import jobs/). Each writes its
summary into its own folder under ``--output``: ``ctr/summary.json``, ``images/images_summary.json``,
``rdd/summary.json``.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from helpers import digits_split, make_mlp
from jobfiles import load_job

from sparkdl_train import SparkModel, to_simple_rdd
from sparkdl_train.driver.submit import start_job, where_it_ran

EPOCHS = 6


def rdd_fits(spark, out_dir: str) -> None:
    sc = spark.sparkContext
    x, y, xt, yt = digits_split()
    ref = make_mlp()
    ref.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0)
    summary = {"reference_accuracy": ref.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"], "rows": len(x), "fits": {}}

    def fit(name, rdd):
        model = make_mlp()
        sm = SparkModel(model, num_workers=2)
        history = sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0)
        first = sm.stats.epochs[0].partitions.values()
        summary["fits"][name] = {
            **where_it_ran(spark, sm.stats),
            "sample_source": sm.stats.sample_source,
            "data_source": sm.stats.data_source,
            "prepared_workers": sm.stats.prepare["python_workers"] if sm.stats.prepare else None,
            "first_epoch_tasks": [{k: i[k] for k in ("host", "pid", "executor_id")}
                                  | {k: i["startup"].get(k) for k in ("model_cached", "traced")} for i in first],
            "samples": [e.samples for e in sm.stats.epochs],
            "epochs": len(history.history["loss"]),
            "accuracy": model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"],
        }

    fit("parallelized", sc.parallelize(list(zip(x, y)), 2))
    fit("mapped", to_simple_rdd(sc, x, y, 2))
    cached = to_simple_rdd(sc, x, y, 2).cache()
    cached.count()
    fit("cached", cached)
    fit("cached_again", cached)
    summary["sparse_allreduce"] = sparse_allreduce_fits(spark)
    summary["ps_wire"] = ps_wire_fits(spark, cached, xt, yt)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("rdd fits: " + ", ".join(f"{k} {v['accuracy']:.3f} ({v['sample_source']})" for k, v in summary["fits"].items()))


def sparse_allreduce_fits(spark) -> dict:
    """Per-step allreduce of a model with an embedding table read from its input, the table's gradients
    whole and as the rows each step touched (allreduce.sparseGradients), on partitions of 200 and 600
    rows: where they ran, the weights of both, the bytes each rank sent."""
    import keras
    import numpy as np

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 3000, (800, 3)).astype(np.int32)
    labels = ((ids % 5).sum(axis=1) % 2).astype(np.float32)
    rows = list(zip(ids, labels))
    rdd = spark.sparkContext.parallelize([rows[:200], rows[200:]], 2).flatMap(lambda part: part)
    out = {}
    for how in (False, True):
        keras.utils.set_random_seed(0)
        inp = keras.Input((3,), dtype="int32", name="ids")
        h = keras.layers.Flatten()(keras.layers.Embedding(3000, 4, name="table")(inp))
        model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, activation="relu")(h)))
        model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
        sm = SparkModel(model, mode="allreduce", num_workers=2, sparse_gradients=how)
        sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
        out[str(how)] = {**where_it_ran(spark, sm.stats), "tables": sm.stats.server["sparse_gradients"],
                         "weights_sha256": [sorted({i["weights_sha256"] for i in e.partitions.values()}) for e in sm.stats.epochs],
                         "bytes_sent": sum(i["bytes_sent"] for e in sm.stats.epochs for i in e.partitions.values()),
                         "rows_sent": [i.get("sparse_rows_sent") for e in sm.stats.epochs for i in e.partitions.values()]}
    return out


def ps_wire_fits(spark, rdd, xt, yt) -> dict:
    """Synchronous parameter-server fits pushing every 4 steps with float32 and bfloat16 deltas and
    replies (ps.compression): where they ran, the server's bytes and pushes, the test accuracy."""
    out = {}
    for wire in (None, "bf16"):
        model = make_mlp()
        sm = SparkModel(model, mode="synchronous", frequency=4, num_workers=2, ps_compression=wire)
        sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0)
        server = sm.stats.server
        out[str(wire)] = {**where_it_ran(spark, sm.stats), "wire": server["wire"], "updates": server["updates"],
                          "bytes": server["bytes_in"] + server["bytes_out"],
                          "accuracy": model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    p.add_argument("--ctr", required=True, help="train_ctr.py's arguments, as a JSON list")
    p.add_argument("--images", required=True, help="train_images.py's arguments, as a JSON list")
    args = p.parse_args()
    spark, _, out_dir = start_job("sparkdl_train-standalone-jobs", args.output)
    load_job("train_ctr").main([*json.loads(args.ctr), "--output", os.path.join(out_dir, "ctr")], spark=spark)
    load_job("train_images").main([*json.loads(args.images), "--output", os.path.join(out_dir, "images")], spark=spark)
    rdd_fits(spark, os.path.join(out_dir, "rdd"))
    spark.stop()


if __name__ == "__main__":
    main()
