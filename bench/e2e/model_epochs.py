"""The cost in epochs of each engine on users' model shapes (bench/workloads/corpus.py), on small data.

For each shape: single-process Keras trains ``--epochs`` epochs (batch ``--batch-size``) and its held-out
metric is the target. Each engine then trains the same rows on ``local[2]`` for up to ``--max-multiple``
times those epochs; after every epoch the driver's model is scored on the held-out rows (a Keras callback
on the driver), and the result is the first epoch count at which it reaches the target (within 0.01
accuracy, or 1.05x Keras' MAE). Written to bench/results/model_epochs.json; docs/models.md's table is
rendered from it by bench/harness/docs.py (``python -m bench.e2e.model_epochs --render``; tests/unit/test_docs_figures.py checks they agree).

    python -m bench.e2e.model_epochs                      # measure (about 7 minutes on 2 cores), then render
    python -m bench.e2e.model_epochs --render             # only re-render docs/models.md from the result file
"""

from __future__ import annotations

import argparse
import time

from bench.harness import results
from bench.harness import session as _session

SHAPES = ("preprocessing_layers", "text_cnn", "batchnorm_dropout", "lstm", "transformer", "regression", "two_tower_ranking")


def measure(args) -> dict:
    import keras

    from bench.workloads import corpus as mc
    from sparkdl_train import SparkModel

    spark = _session.session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    rows = []
    for name in args.shapes:
        shape = mc.SHAPES[name]
        train, test = shape.data(args.rows, 1), shape.data(512, 2)
        model = shape.build()
        model.fit(mc.keras_dataset(shape, train, args.batch_size, shuffle=True), epochs=args.epochs, verbose=0)
        held = mc.keras_dataset(shape, test, 256)
        target = model.evaluate(held, verbose=0, return_dict=True)[shape.metric]
        df = spark.createDataFrame(train).repartition(2)
        row = {"shape": name, "metric": shape.metric, "keras": round(float(target), 4), "engines": {}}
        for engine, kwargs in mc.ENGINES.items():
            scores: list[float] = []

            class Score(keras.callbacks.Callback):
                def on_epoch_end(self, epoch, logs=None):
                    scores.append(float(self.model.evaluate(held, verbose=0, return_dict=True)[shape.metric]))

            t = time.perf_counter()
            sm = SparkModel(shape.build if shape.builder else shape.build(), **kwargs)
            try:
                sm.fit(df, epochs=args.epochs * args.max_multiple, batch_size=args.batch_size, feature_cols=shape.feature_cols,
                       label_col=shape.label_col, verbose=0, callbacks=[Score()])
            except Exception as exc:  # noqa: BLE001 - a refusal is a result
                row["engines"][engine] = {"refused": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
                continue
            ok = [s <= target * 1.05 if shape.lower_is_better else s >= target - 0.01 for s in scores]
            reached = next((i + 1 for i, good in enumerate(ok) if good), None)
            best = min(scores) if shape.lower_is_better else max(scores)
            row["engines"][engine] = {"epochs_to_keras": reached, "multiple": round(reached / args.epochs, 2) if reached else None,
                                      "at_keras_epochs": round(scores[args.epochs - 1], 4), "best": round(best, 4),
                                      "seconds": round(time.perf_counter() - t, 1)}
            print(name, engine, row["engines"][engine], flush=True)
        rows.append(row)
    spark.stop()
    return {"master": "local[2]", "workers": 2,
            "rows": args.rows, "batch_size": args.batch_size, "keras_epochs": args.epochs, "max_multiple": args.max_multiple,
            "results": rows}


def render_table(result: dict) -> str:
    """The table docs/models.md shows (bench/harness/docs.py puts it between the page's markers)."""
    engines = list(result["results"][0]["engines"])
    e = result["keras_epochs"]
    lines = [f"Epochs each engine needed to reach single-process Keras' held-out metric after {e} epochs "
             f"({result['rows']} rows, batch {result['batch_size']}, {result['workers']} workers on {result['master']}). "
             f"'>{e * result['max_multiple']}': not within {result['max_multiple']}x. One run: asynchronous and hogwild "
             "updates interleave as the tasks run, so their counts can differ by an epoch between runs.",
             "",
             "| shape | metric (Keras) | " + " | ".join(engines) + " |",
             "|---|---|" + "---|" * len(engines)]
    for row in result["results"]:
        cells = []
        for name in engines:
            r = row["engines"][name]
            cells.append("refused" if "refused" in r else f">{e * result['max_multiple']}" if r["epochs_to_keras"] is None
                         else str(r["epochs_to_keras"]))
        lines.append(f"| {row['shape']} | {row['metric']} {row['keras']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES))
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-multiple", type=int, default=4)
    p.add_argument("--render", action="store_true", help="only render docs/models.md from the result file")
    args = p.parse_args()
    if not args.render:
        results.write("model_epochs", measure(args))
    from bench.harness import docs

    docs.main([])


if __name__ == "__main__":
    main()
