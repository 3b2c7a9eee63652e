"""Submitted by tests/test_standalone.py with spark-submit (no master here: the cluster's): SparkModel
fits on RDDs of (x, y) rows, each as a user builds them, and where and how each ran. Writes
summary.json to --output; the test asserts on it.

* ``parallelized``: ``sc.parallelize(list(zip(x, y)))`` as Elephas' to_simple_rdd builds it: the
  JVM takes the fit's sample from its frames, no Python task;
* ``mapped``: sparkdl_train's to_simple_rdd (a Python flatMap, not cached): Python tasks read the
  sample and stay in Spark's pool;
* ``cached`` then ``cached_again``: the same, cached and counted (every partition cached: the JVM
  path), then fitted once more (the first fit's sample kept).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from helpers import digits_split, make_mlp

from sparkdl_train import SparkModel, to_simple_rdd
from sparkdl_train.driver.submit import start_job, where_it_ran

EPOCHS = 6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    args = p.parse_args()
    spark, _, out_dir = start_job("sparkdl_train-rdd-check", args.output)
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
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("rdd fits: " + ", ".join(f"{k} {v['accuracy']:.3f} ({v['sample_source']})" for k, v in summary["fits"].items()))
    spark.stop()


if __name__ == "__main__":
    main()
