"""CTR models (Keras 3) over two inputs and the feature scheme that feeds them.

Inputs:

* ``numeric``: ``log1p`` of the dense counts, shape ``(n_dense,)``, float32;
* ``categorical``: one id per field, shape ``(n_fields,)``, int32, already offset
  into one shared embedding table.

Vocabulary scheme (:func:`ctr_features`): field ``f`` gets ``B_f`` hash buckets,
``B_f = min(max_buckets, next_pow2(2 * approx_distinct(C_f)))``, and a value ``v``
maps to ``offset_f + pmod(xxhash64(f, v), B_f)`` where ``offset_f`` is the sum of
the buckets of the fields before it. Unseen values hash like seen ones, so
serving needs only the bucket list, never a dictionary.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="sparkdl_train")
class FieldSum(keras.layers.Layer):
    """Sum over the field axis: ``(batch, fields, d) -> (batch, d)``."""

    def call(self, x):
        return ops.sum(x, axis=1)


@keras.saving.register_keras_serializable(package="sparkdl_train")
class FMInteraction(keras.layers.Layer):
    """Factorization-machine second-order term: ``0.5 * ((sum v)^2 - sum v^2)`` summed over the embedding."""

    def call(self, emb):
        s = ops.sum(emb, axis=1)
        sq = ops.sum(emb * emb, axis=1)
        return 0.5 * ops.sum(s * s - sq, axis=1, keepdims=True)


def _inputs(n_dense: int, n_fields: int):
    numeric = keras.Input((n_dense,), name="numeric")
    categorical = keras.Input((n_fields,), dtype="int32", name="categorical")
    return numeric, categorical


def _mlp(x, hidden: Sequence[int], prefix: str):
    for i, units in enumerate(hidden):
        x = keras.layers.Dense(units, activation="relu", name=f"{prefix}_hidden_{i}")(x)
    return keras.layers.Dense(1, name=f"{prefix}_logit")(x)


def _first_order(numeric, categorical, vocab: int):
    lin_cat = FieldSum(name="linear_sum")(keras.layers.Embedding(vocab, 1, name="linear_embedding")(categorical))
    lin_num = keras.layers.Dense(1, name="linear_numeric")(numeric)
    return lin_cat, lin_num


def _compile(model: keras.Model, learning_rate: float) -> keras.Model:
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000), keras.metrics.BinaryAccuracy(name="accuracy")],
    )
    return model


def _ctr_model(
    name: str,
    with_fm: bool,
    vocab_size: int,
    n_dense: int,
    n_fields: int,
    embed_dim: int,
    hidden: Sequence[int],
    learning_rate: float,
) -> keras.Model:
    numeric, categorical = _inputs(n_dense, n_fields)
    emb = keras.layers.Embedding(vocab_size, embed_dim, name="field_embedding")(categorical)
    lin_cat, lin_num = _first_order(numeric, categorical, vocab_size)
    deep_in = keras.layers.Concatenate(name="deep_input")([keras.layers.Flatten(name="flat_embedding")(emb), numeric])
    terms = [lin_cat, lin_num, _mlp(deep_in, hidden, "deep")]
    if with_fm:
        terms.append(FMInteraction(name="fm")(emb))
    logit = keras.layers.Add(name="logit")(terms)
    out = keras.layers.Activation("sigmoid", name="ctr")(logit)
    return _compile(keras.Model({"numeric": numeric, "categorical": categorical}, out, name=name), learning_rate)


def deepfm(
    vocab_size: int,
    n_dense: int = 13,
    n_fields: int = 26,
    embed_dim: int = 8,
    hidden: Sequence[int] = (64, 32),
    learning_rate: float = 1e-3,
) -> keras.Model:
    """DeepFM: first-order + FM interactions + MLP over shared field embeddings."""
    return _ctr_model("deepfm", True, vocab_size, n_dense, n_fields, embed_dim, hidden, learning_rate)


def wide_and_deep(
    vocab_size: int,
    n_dense: int = 13,
    n_fields: int = 26,
    embed_dim: int = 8,
    hidden: Sequence[int] = (64, 32),
    learning_rate: float = 1e-3,
) -> keras.Model:
    """Wide & Deep: a linear (wide) part plus an MLP over field embeddings."""
    return _ctr_model("wide_and_deep", False, vocab_size, n_dense, n_fields, embed_dim, hidden, learning_rate)


MODELS = {"deepfm": deepfm, "wide_deep": wide_and_deep}


# -- feature scheme ------------------------------------------------------------------

def vocabulary(df: Any, cat_cols: Sequence[str], max_buckets: int = 1 << 14) -> list[int]:
    """Buckets per field from approximate distinct counts (one Spark job)."""
    from pyspark.sql import functions as F

    row = df.agg(*[F.approx_count_distinct(c).alias(c) for c in cat_cols]).first()
    out = []
    for c in cat_cols:
        want = max(2, 2 * int(row[c]))
        out.append(min(max_buckets, 1 << (want - 1).bit_length()))
    return out


def ctr_features(df: Any, dense_cols: Sequence[str], cat_cols: Sequence[str], buckets: Sequence[int]) -> Any:
    """Add ``numeric`` (array<float>, log1p) and ``categorical`` (array<int>, hashed + offset) columns."""
    from pyspark.sql import functions as F

    if len(buckets) != len(cat_cols):
        raise ValueError(f"{len(cat_cols)} categorical columns but {len(buckets)} bucket sizes")
    offsets = [0]
    for b in buckets[:-1]:
        offsets.append(offsets[-1] + b)
    numeric = F.array(*[F.log1p(F.greatest(F.col(c).cast("float"), F.lit(0.0))).cast("float") for c in dense_cols])
    cats = F.array(
        *[
            (F.lit(off) + F.pmod(F.xxhash64(F.lit(i), F.col(c)), F.lit(b))).cast("int")
            for i, (c, b, off) in enumerate(zip(cat_cols, buckets, offsets))
        ]
    )
    return df.withColumn("numeric", numeric).withColumn("categorical", cats)
