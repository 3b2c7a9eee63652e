"""Image job: a small CNN trained on PNG files read as raw bytes, decoded on the executors.

    spark-submit jobs/train_images.py                          # embedded default: local[*], generated PNGs
    spark-submit --master yarn jobs/train_images.py --data hdfs:///images/digits --epochs 10

With no --data the job renders scikit-learn's bundled digits into PNG files (random shift,
scale and noise per copy; nothing is downloaded) under <output>/digits_png_<copies>_<seed>,
in <label>/ folders. It reads them with spark.read.format("binaryFile"), holds out a
seeded 20% by path, and trains with the PNG bytes decoded (and, with --augment, shifted)
on the executors by a batch transform that overlaps training. It reports test accuracy
beside single-process Keras trained on the same decoded arrays, and throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="folder of <label>/<name>.png files (any Hadoop path); generated when absent")
    p.add_argument("--copies", type=int, default=4, help="renderings of each of the 1797 bundled digits to generate")
    p.add_argument("--mode", default="asynchronous", help="synchronous | asynchronous | hogwild | allreduce")
    p.add_argument("--frequency", default="batch", help="epoch | batch | N (parameter-server modes)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, dest="batch_size")
    p.add_argument("--learning-rate", type=float, default=5e-3, dest="learning_rate", help="Adam's learning rate (the reference uses it too)")
    p.add_argument("--workers", type=int, help="training partitions (default: default parallelism)")
    p.add_argument("--transform-threads", type=int, default=1, dest="transform_threads", help="decoding threads per task")
    p.add_argument("--augment", action="store_true", help="random shifts of up to 2 pixels while training")
    p.add_argument("--no-reference", action="store_true", dest="no_reference", help="skip the single-process Keras reference")
    p.add_argument("--output", default="output")
    p.add_argument("--seed", type=int, default=0)
    cfg = vars(p.parse_args(argv))
    if cfg["mode"] == "allreduce":
        cfg["frequency"] = None
    elif cfg["frequency"].isdigit():
        cfg["frequency"] = int(cfg["frequency"])
    return cfg


def main(argv: list[str], spark=None) -> dict:
    """Run the job; with ``spark`` given (tests, notebooks) that session is used and left running."""
    cfg = parse_args(argv)
    from pyspark.sql import functions as F

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import images
    from sparkdl_train.driver.submit import start_job, where_it_ran

    spark, own_session, out_dir = start_job("sparkdl_train: train_images", cfg["output"], spark)

    data_path = cfg.get("data")
    if not data_path:
        data_path = os.path.join(out_dir, f"digits_png_{cfg['copies']}_{cfg['seed']}")
        if not os.path.exists(os.path.join(data_path, "_SUCCESS")):
            images.write_pngs(data_path, copies=cfg["copies"], seed=cfg["seed"])
            open(os.path.join(data_path, "_SUCCESS"), "w").close()
    is_test = F.pmod(F.xxhash64("path", F.lit(cfg["seed"])), F.lit(10)) < F.lit(2)
    parts = cfg.get("workers") or spark.sparkContext.defaultParallelism
    # many small files make many read tasks: read them once into `parts` cached partitions of bytes
    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").option("pathGlobFilter", "*.png")
             .load(data_path).select("path", "content", is_test.alias("is_test")).repartition(parts).cache())
    train, test = files.where(~F.col("is_test")), files.where(F.col("is_test"))
    n_train, n_test = train.count(), test.count()

    plain = images.DigitsTransform(augment=False)
    model = images.cnn(seed=cfg["seed"], learning_rate=cfg["learning_rate"])
    sm = SparkModel(model, mode=cfg["mode"], frequency=cfg["frequency"], num_workers=cfg.get("workers"), seed=cfg["seed"],
                    transform_threads=cfg["transform_threads"])
    columns = {"feature_cols": "image", "label_col": "label"}
    t0 = time.perf_counter()
    history = sm.fit(train, epochs=cfg["epochs"], batch_size=cfg["batch_size"], verbose=1,
                     transform=images.DigitsTransform(augment=cfg["augment"]), **columns)
    train_seconds = time.perf_counter() - t0
    test_logs = sm.evaluate(test, batch_size=512, return_dict=True, transform=plain, **columns)
    samples = sum(e.samples for e in sm.stats.epochs)

    reference = None
    if not cfg["no_reference"]:
        reference = single_process_reference(train, test, plain, cfg)
    summary = {
        "mode": cfg["mode"],
        "frequency": sm.stats.frequency,
        "workers": sm.stats.num_workers,
        "epochs": len(history.history["loss"]),
        "train_images": n_train,
        "test_images": n_test,
        "transform_threads": cfg["transform_threads"],
        "augment": cfg["augment"],
        "test_accuracy": test_logs["accuracy"],
        "test_loss": test_logs["loss"],
        "reference_test_accuracy": reference["test_accuracy"] if reference else None,
        "reference_seconds": reference["seconds"] if reference else None,
        "train_samples_per_second": samples / train_seconds,
        "train_seconds": train_seconds,
        "history": history.history,
        "data": data_path,
        **where_it_ran(spark, sm.stats),
    }
    with open(os.path.join(out_dir, "images_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    model_path = os.path.join(out_dir, "digits_cnn.keras")
    model.save(model_path)

    print("\n=== sparkdl_train image job ===")
    print(f"mode {cfg['mode']}/{sm.stats.frequency}  workers {sm.stats.num_workers}  epochs {summary['epochs']}  "
          f"decoding on the executors ({cfg['transform_threads']} thread(s) per task{', augmented' if cfg['augment'] else ''})")
    print(f"ran on {summary['master']}  executors {', '.join(summary['executor_ids'])}")
    print(f"images  train {n_train}  test {n_test}  ({data_path})")
    ref = f"   (single-process Keras on the same decoded arrays: {reference['test_accuracy']:.4f})" if reference else ""
    print(f"test accuracy {test_logs['accuracy']:.4f}{ref}")
    print(f"throughput    {summary['train_samples_per_second']:.0f} images/s over {train_seconds:.1f} s of training")
    print(f"model saved   {model_path}")
    if own_session:
        spark.stop()
    return summary


def single_process_reference(train, test, transform, cfg) -> dict:
    """Keras' own fit on the same images, decoded once on the driver (the dataset is small)."""
    import numpy as np

    from sparkdl_train.datasets import images

    def decoded(df):
        table = df.toArrow()
        cols = {"path": table.column("path").to_pylist(), "content": table.column("content").to_pylist()}
        out = transform(cols)
        return out["image"], out["label"]

    x, y = decoded(train)
    xt, yt = decoded(test)
    model = images.cnn(seed=cfg["seed"], learning_rate=cfg["learning_rate"])
    t0 = time.perf_counter()
    model.fit(x, y, epochs=cfg["epochs"], batch_size=cfg["batch_size"], shuffle=True, verbose=0)
    seconds = time.perf_counter() - t0
    acc = model.evaluate(xt, yt, batch_size=512, verbose=0, return_dict=True)["accuracy"]
    return {"test_accuracy": float(acc), "seconds": seconds, "rows": int(len(np.asarray(y)))}


if __name__ == "__main__":
    main(sys.argv[1:])
