"""One Elephas script, run on Elephas and on sparkdl_train.elephas: only the imports differ.

    python -m bench.e2e.elephas_side_by_side elephas          # in a venv with Elephas 7.3 (its own)
    python -m bench.e2e.elephas_side_by_side sparkdl_train    # in the project's venv

Trains Elephas' MNIST MLP example (scikit-learn's digits in place of MNIST: no download) with
SparkModel (synchronous), AsynchronousSparkModel (asynchronous, epoch and batch) and hogwild on
local[2], 10 epochs, and prints one JSON line per mode: fit seconds and held-out accuracy.
"""

import json
import os
import sys
import time

import numpy as np

LIB = sys.argv[1] if len(sys.argv) > 1 else "sparkdl_train"
if LIB == "elephas":
    from elephas.spark_model import AsynchronousSparkModel, SparkModel
    from elephas.utils.rdd_utils import to_simple_rdd
else:
    from sparkdl_train.elephas.spark_model import AsynchronousSparkModel, SparkModel
    from sparkdl_train.elephas.utils.rdd_utils import to_simple_rdd

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> None:
    import keras
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    builder = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.default.parallelism", "2"))
    if LIB != "elephas":
        builder = builder.config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
    sc = builder.getOrCreate().sparkContext
    sc.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = np.eye(10, dtype="float32")[y]
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
    rdd = to_simple_rdd(sc, x_train, y_train).cache()
    rdd.count()

    rows = {}
    for name, make in [
        ("synchronous/epoch", lambda m: SparkModel(m, num_workers=2)),
        ("asynchronous/epoch", lambda m: AsynchronousSparkModel(m, mode="asynchronous", frequency="epoch", num_workers=2)),
        ("asynchronous/batch", lambda m: AsynchronousSparkModel(m, mode="asynchronous", frequency="batch", num_workers=2)),
        ("hogwild/epoch", lambda m: AsynchronousSparkModel(m, mode="hogwild", frequency="epoch", num_workers=2)),
    ]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dropout(0.2),
                                  keras.layers.Dense(128, activation="relu"), keras.layers.Dropout(0.2),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(keras.optimizers.SGD(learning_rate=0.1), "categorical_crossentropy", metrics=["acc"])
        spark_model = make(model)
        start = time.perf_counter()
        spark_model.fit(rdd, epochs=10, batch_size=64, verbose=0, validation_split=0.1)
        seconds = time.perf_counter() - start
        accuracy = float(np.mean(np.argmax(spark_model.master_network.predict(x_test, verbose=0), 1) == np.argmax(y_test, 1)))
        print(json.dumps({"library": LIB, "mode": name, "fit_seconds": round(seconds, 1), "test_accuracy": round(accuracy, 4)}),
              flush=True)
        rows[name] = (seconds, accuracy)
    _record(rows)


def _record(rows: dict) -> None:
    """This library's columns of bench/results/elephas_side_by_side.json (the other library's kept as they were)."""
    from bench.harness import results

    try:
        old = {m["mode"]: m for m in results.load("elephas_side_by_side")["modes"]}
    except FileNotFoundError:
        old = {}
    key = "sdt" if LIB != "elephas" else "elephas"
    modes = []
    for mode, (seconds, accuracy) in rows.items():
        m = dict(old.get(mode, {"mode": mode}))
        m.update({f"{key}_s": round(seconds, 1), f"{key}_accuracy": round(accuracy, 4)})
        modes.append(m)
    print("wrote", results.write("elephas_side_by_side", {"rows": 1400, "epochs": 10, "batch_size": 64, "workers": 2, "modes": modes}))


if __name__ == "__main__":
    main()
