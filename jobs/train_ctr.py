"""Flagship job: train a CTR model (DeepFM or Wide&Deep) on Criteo-shaped data.

    ./run job                                           # embedded default: local[*], generated data
    ./run submit --master yarn jobs/train_ctr.py --data hdfs:///ctr/parquet --epochs 10
    ./run submit --master yarn jobs/train_ctr.py --data hdfs:///criteo/day_0.gz   # Criteo's own TSV format

(``./run submit`` is the venv's spark-submit with SPARK_HOME set: README, Clusters.)

With no --data the job generates a Parquet dataset with a planted ground-truth
model (sparkdl_train.datasets.ctr) so that the Bayes-optimal AUC is known.
Defaults come from conf/train_ctr.json (or --config); flags override them.
It prints AUC, logloss, the Bayes-optimal AUC/logloss and throughput, writes
<output>/summary.json and saves the model to <output>/ctr_model.keras.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, os.pardir, "conf", "train_ctr.json")


def parse_args(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="JSON file with defaults (conf/train_ctr.json)")
    p.add_argument("--data", help="Parquet (I1..I13, C1..C26, label) or Criteo TSV (plain or .gz) path; generated when absent")
    p.add_argument("--format", choices=["auto", "parquet", "criteo-tsv"], default="auto",
                   help="format of --data (auto: Parquet by its magic bytes, else Criteo TSV by its 40 fields)")
    p.add_argument("--malformed", choices=["count", "fail"], default="count",
                   help="Criteo TSV lines that do not fit the format: count, report and leave out (default), or fail")
    p.add_argument("--generate-format", choices=["parquet", "criteo-tsv"], dest="generate_format",
                   help="format of the generated data when --data is absent (default parquet)")
    p.add_argument("--rows", type=int, help="rows to generate when --data is absent")
    p.add_argument("--model", choices=["deepfm", "wide_deep"])
    p.add_argument("--mode", help="synchronous | asynchronous | hogwild | allreduce")
    p.add_argument("--frequency", help="epoch | batch | N")
    p.add_argument("--epochs", type=int)
    p.add_argument("--validation-freq", type=int, dest="validation_freq",
                   help="validate on the test rows every N epochs (default: after the last); an allreduce stage "
                        "runs up to N epochs")
    p.add_argument("--epochs-per-stage", type=int, dest="epochs_per_stage",
                   help="allreduce: epochs one barrier stage runs at most (conf/train_ctr.json: 8); a stage also ends "
                        "after each validation")
    p.add_argument("--table-average", choices=["samples", "touches"], dest="table_average",
                   help="allreduce --frequency epoch: weight each embedding row by the ranks' samples or by how often "
                        "each looked the row up")
    p.add_argument("--sparse-gradients", choices=["auto", "on", "off"], dest="sparse_gradients",
                   help="allreduce --frequency batch: the embedding tables' gradients travel as the rows each step "
                        "looked up ('on'), whole ('off'), or by rows where that moves fewer bytes ('auto', the default)")
    p.add_argument("--ps-compression", choices=["none", "fp16", "bf16"], dest="ps_compression",
                   help="parameter-server modes: deltas and replies as float16 / bfloat16 (half the bytes; the server "
                        "adds float32)")
    p.add_argument("--batch-size", type=int, dest="batch_size")
    p.add_argument("--workers", type=int, help="training partitions (default: default parallelism)")
    p.add_argument("--embed-dim", type=int, dest="embed_dim")
    p.add_argument("--learning-rate", type=float, dest="learning_rate")
    p.add_argument("--vocab-min-count", type=int, dest="vocab_min_count", help="values seen fewer times share an out-of-vocabulary id")
    p.add_argument("--output", help="folder for the model, generated data and summary.json")
    p.add_argument("--seed", type=int)
    p.add_argument("--features-dir", dest="features_dir",
                   help="write the feature tables here as Parquet and train from the files instead of caching them in "
                        "executor memory (on a local path every host sees, the tasks read them directly with pyarrow)")
    p.add_argument("--checkpoint-dir", dest="checkpoint_dir",
                   help="write the full training state here after every epoch (any Hadoop path)")
    p.add_argument("--mlflow", action="store_true", default=None,
                   help="log the run to MLflow from the driver (MLFLOW_TRACKING_URI; sparkdl_train.mlflow): settings, "
                        "epoch metrics, throughput, executors, the model, test AUC and summary.json")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir (after a lost driver: submit the same command with --resume)")
    args = vars(p.parse_args(argv))
    config_path = args.pop("config")
    with open(config_path) as f:
        cfg = json.load(f)
    cfg.update({k: v for k, v in args.items() if v is not None})
    freq = cfg.get("frequency")
    if isinstance(freq, dict):  # the config file's frequency for each mode
        freq = freq.get(cfg["mode"])
    elif cfg["mode"] == "allreduce" and args.get("frequency") is None:
        freq = None  # a single number in the config file is a parameter server's push frequency
    # None: the mode's default ("batch" for allreduce, else "epoch")
    cfg["frequency"] = int(freq) if isinstance(freq, str) and freq.isdigit() else freq
    # the ring's settings apply where the ring averages the state; given on the command line they always go to
    # SparkModel, which refuses them in a mode they do not apply to
    cfg["ring"] = {k: cfg.get(k) for k in ("epochs_per_stage", "table_average")
                   if cfg.get(k) is not None and (args.get(k) is not None or (
                       cfg["mode"] == "allreduce" and (k == "epochs_per_stage" or cfg["frequency"] == "epoch")))}
    sparse = cfg.pop("sparse_gradients", None)
    if sparse not in (None, "auto"):
        cfg["ring"]["sparse_gradients"] = sparse == "on"
    wire = cfg.pop("ps_compression", None)
    if wire not in (None, "none"):
        cfg["ring"]["ps_compression"] = wire  # refused by SparkModel where no server runs
    return cfg


def communication(stats) -> dict:
    """Bytes on the wire per update, and for the parameter server the saving of sparse rows
    against pushing and pulling every weight whole."""
    server = stats.server or {}
    if server.get("engine") == "allreduce":
        moved = server["bytes_sent"] + server["bytes_received"]
        return {"engine": "allreduce", "average": server["average"], "bytes_per_step": moved / max(1, server["steps"]),
                "bytes_per_epoch": moved / max(1, len(stats.epochs)), "stages": server.get("stages"),
                "table_average": server.get("table_average"), "row_weighted_tables": server.get("row_weighted_tables"),
                "compression": server["compression"], "epochs_per_stage": server["epochs_per_stage"],
                "sparse_gradients": server.get("sparse_gradients", [])}
    if "updates" in server:
        return {
            "engine": "parameter_server",
            "sparse_tables": server["sparse_tables"],
            "pushes": server["updates"],
            "bytes_per_push": server["bytes_per_push"],
            "dense_bytes_per_push": server["dense_bytes_per_push"],
            "dense_to_actual_bytes": server["dense_to_actual_bytes"],
            "delta_scale": server["delta_scale"],
            "wire": server["wire"],
            "mean_concurrency": server["mean_concurrency"],  # workers active per push, on average
            "solo_pushes": server["solo_updates"],
        }
    return {"engine": "spark_averaging"}  # synchronous/epoch: state merged by Spark's treeReduce


def resume_point(cfg: dict, spark) -> int | None:
    """Epochs done in --checkpoint-dir's checkpoint. A checkpoint is continued only with --resume,
    so that a new run never silently starts from an old one."""
    from sparkdl_train.driver.checkpoint import Checkpointer
    from sparkdl_train.errors import ConfigError

    if not cfg.get("checkpoint_dir"):
        if cfg.get("resume"):
            raise ConfigError("--resume needs --checkpoint-dir: the folder the interrupted run wrote its checkpoints to")
        return None
    done = Checkpointer(cfg["checkpoint_dir"], sc=spark.sparkContext).epochs_done()
    if done is not None and not cfg.get("resume"):
        raise ConfigError(
            f"--checkpoint-dir {cfg['checkpoint_dir']} already holds a checkpoint after epoch {done}: pass --resume to "
            "continue from it, or choose an empty folder to start over")
    if done is None and cfg.get("resume"):
        print(f"--resume: {cfg['checkpoint_dir']} holds no checkpoint yet, starting from epoch 1")
    return done


def main(argv: list[str], spark=None) -> dict:
    """Run the job; with ``spark`` given (tests, notebooks) that session is used and left running."""
    cfg = parse_args(argv)
    from pyspark.sql import functions as F

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import criteo
    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.driver.submit import output_exists, output_path, save_model, start_job, where_it_ran, write_output
    from sparkdl_train.models.ctr import MODELS, build_vocabulary, ctr_features

    spark, own_session, out_dir = start_job("sparkdl_train: train_ctr", cfg["output"], spark)
    resumed_from = resume_point(cfg, spark)  # before any work: a checkpoint without --resume is refused

    t0 = time.perf_counter()
    data_path, data_format = cfg.get("data"), cfg.get("format", "auto")
    if not data_path:
        data_format = cfg.get("generate_format") or "parquet"
        suffix = "" if data_format == "parquet" else "_tsv"
        data_path = output_path(out_dir, f"ctr_data_{cfg['rows']}_{cfg['seed']}{suffix}")
        if not output_exists(output_path(data_path, "_SUCCESS")):
            spec = ctr_data.CTRSpec(rows=cfg["rows"], seed=cfg["seed"])
            if data_format == "parquet":
                ctr_data.write(spark, spec, data_path)
            else:
                criteo.write_tsv(spark, spec, data_path)
    if data_format == "auto":
        data_format = criteo.detect_format(spark, data_path)
    malformed = None
    if data_format == "criteo-tsv":
        df, report = criteo.read_tsv(spark, data_path, on_malformed=cfg.get("malformed", "count"))
        malformed = report.as_dict()
    else:
        df = spark.read.parquet(data_path)
    gen_seconds = time.perf_counter() - t0

    if "id" not in df.columns:
        df = df.withColumn("id", F.monotonically_increasing_id())
    # deterministic split on the row id, independent of partitioning
    is_test = F.pmod(F.xxhash64(F.col("id"), F.lit(cfg["seed"])), F.lit(1000)) < F.lit(int(1000 * cfg["test_fraction"]))
    keep = ["id", "label"] + (["p_true"] if "p_true" in df.columns else [])
    raw_train, raw_test = df.where(~is_test), df.where(is_test)
    vocab = build_vocabulary(raw_train, ctr_data.CAT_COLS, min_count=cfg["vocab_min_count"], max_size=cfg["vocab_max_size"])
    parts = cfg.get("workers") or spark.sparkContext.defaultParallelism
    train = ctr_features(raw_train, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, keep).repartition(parts)
    test = ctr_features(raw_test, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, keep)
    if cfg.get("features_dir"):  # materialized once; every epoch reads the files (docs/performance.md)
        for name, table in (("train", train), ("test", test)):
            table.write.mode("overwrite").parquet(output_path(cfg["features_dir"], name))
        train, test = (spark.read.parquet(output_path(cfg["features_dir"], name)) for name in ("train", "test"))
    else:
        train, test = train.cache(), test.cache()
    n_train, n_test = train.count(), test.count()

    import keras

    keras.utils.set_random_seed(cfg["seed"])  # the same initial weights on every run
    model = MODELS[cfg["model"]](
        vocab_size=vocab.size,
        embed_dim=cfg["embed_dim"],
        hidden=tuple(cfg["hidden"]),
        learning_rate=cfg["learning_rate"],
    )
    columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
    sm = SparkModel(model, mode=cfg["mode"], frequency=cfg["frequency"], num_workers=cfg.get("workers"), seed=cfg["seed"],
                    **cfg["ring"])
    run = None
    if cfg.get("mlflow"):  # one run for the whole job: the fit logs into it, the job adds its test metrics and summary
        from sparkdl_train import mlflow as tracking

        run = tracking.require().start_run(run_name=f"train_ctr {cfg['model']} {cfg['mode']}")
    t1 = time.perf_counter()
    try:
        history = sm.fit(train, epochs=cfg["epochs"], batch_size=cfg["batch_size"], validation_data=test, verbose=1,
                         validation_freq=cfg.get("validation_freq") or cfg["epochs"],
                         checkpoint_dir=cfg.get("checkpoint_dir"), mlflow=bool(cfg.get("mlflow")), **columns)
    except BaseException:
        if run is not None:
            tracking.require().end_run(status="FAILED")
        raise
    train_seconds = time.perf_counter() - t1

    test_logs = sm.evaluate(test, batch_size=4096, return_dict=True, **columns)
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    scored = sm.predict(test, batch_size=4096, prediction_col="ctr").withColumn("label_d", F.col("label").cast("double"))
    # numBins=0: every distinct score is a threshold (the default 1000 bins down-sample the curve per
    # partition of the sorted scores, so the area moved in its fifth decimal with the partitioning)
    exact_auc = BinaryClassificationEvaluator(rawPredictionCol="ctr", labelCol="label_d", numBins=0).evaluate(scored)
    bayes = ctr_data.bayes_metrics(test) if "p_true" in test.columns else None

    model_path = save_model(model, out_dir, "ctr_model.keras")
    write_output(out_dir, "vocabulary.json", vocab.to_json().encode())  # serving maps raw values with it
    samples = sum(e.samples for e in sm.stats.epochs)
    comm = communication(sm.stats)
    summary = {
        "model": cfg["model"],
        "mode": cfg["mode"],
        "frequency": sm.stats.frequency,
        "workers": sm.stats.num_workers,
        "epochs": len(history.history["loss"]),
        "train_rows": n_train,
        "test_rows": n_test,
        "vocab_size": vocab.size,
        "test_auc": exact_auc,
        "test_auc_keras": test_logs["auc"],
        "test_logloss": test_logs["loss"],
        "bayes_auc": bayes["auc"] if bayes else None,
        "bayes_logloss": bayes["logloss"] if bayes else None,
        "positive_rate": bayes["positive_rate"] if bayes else None,
        "train_samples_per_second": samples / train_seconds,
        "train_seconds": train_seconds,
        "data_seconds": gen_seconds,
        "communication": comm,
        "stages": (sm.stats.server or {}).get("stages"),  # allreduce: the barrier stages the epochs ran in
        "tls": sm.stats.tls,  # the fit's sockets used TLS (network.tls; auto: as Spark encrypts)
        "checkpoint_dir": cfg.get("checkpoint_dir"),
        "resumed_from_epoch": resumed_from,  # completed epochs the checkpoint held (None: a fresh start)
        "epoch_samples": [e.samples for e in sm.stats.epochs],  # the epochs this run trained
        "history": history.history,
        "data": data_path,
        "data_format": data_format,
        "features_dir": cfg.get("features_dir"),
        "data_source": sm.stats.data_source,  # how the training tasks read their rows ("parquet": the files, directly)
        "malformed": malformed,
        "model_path": model_path,
        **where_it_ran(spark, sm.stats),
    }
    summary_path = write_output(out_dir, "summary.json", json.dumps(summary, indent=2).encode())
    if run is not None:
        tracking.finish_job_run(summary_path, {"test_auc": exact_auc, "test_logloss": test_logs["loss"]})

    print("\n=== sparkdl_train CTR job ===")
    print(f"model {cfg['model']}  mode {cfg['mode']}/{sm.stats.frequency}  workers {sm.stats.num_workers}  epochs {summary['epochs']}")
    print(f"ran on {summary['master']}  executors {', '.join(summary['executor_ids'])}  hosts {', '.join(summary['worker_hosts'])}")
    print(f"rows  train {n_train}  test {n_test}  vocabulary {vocab.size} ids (values seen >= {vocab.min_count} times)")
    if malformed is not None:
        print(f"data  Criteo TSV, {malformed['lines']} lines, {malformed['malformed_lines']} malformed and left out {malformed['malformed']}")
    print(f"test AUC      {exact_auc:.4f}   (Bayes-optimal {summary['bayes_auc'] if bayes is None else format(bayes['auc'], '.4f')})")
    print(f"test logloss  {test_logs['loss']:.4f}   (Bayes-optimal {'n/a' if bayes is None else format(bayes['logloss'], '.4f')})")
    print(f"throughput    {summary['train_samples_per_second']:.0f} samples/s over {train_seconds:.1f} s of training")
    if comm["engine"] == "parameter_server":
        print(
            f"communication {comm['bytes_per_push'] / 1e3:.1f} kB per push with {len(comm['sparse_tables'])} sparse tables, "
            f"{comm['dense_bytes_per_push'] / 1e3:.1f} kB dense: {comm['dense_to_actual_bytes']:.1f}x fewer bytes"
        )
    elif comm["engine"] == "allreduce" and comm["average"] == "state":
        print(f"communication {comm['bytes_per_epoch'] / 1e6:.1f} MB per epoch (all ranks: the state averaged through the ring; "
              f"{len(summary['history']['loss'])} epochs in {comm['stages']} barrier stage(s))")
    elif comm["engine"] == "allreduce":
        tables = comm["sparse_gradients"]
        print(f"communication {comm['bytes_per_step'] / 1e3:.1f} kB per step (all ranks; "
              + (f"{', '.join(tables)} by the rows each step touched, the rest dense)" if tables else "dense gradients)"))
    print(f"model saved   {model_path}")
    if own_session:
        spark.stop()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
