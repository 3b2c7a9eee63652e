"""CTR models (Keras 3) over two inputs and the feature scheme that feeds them.

Inputs:

* ``numeric``: ``log1p`` of the dense counts, shape ``(n_dense,)``, float32;
* ``categorical``: one id per field, shape ``(n_fields,)``, int32, already offset
  into one shared embedding table.

The ids come from a frequency-threshold vocabulary
(:mod:`sparkdl_train.models.vocabulary`): values seen at least ``min_count``
times get their own id, the rest share one out-of-vocabulary id per field.
"""

from __future__ import annotations

from typing import Sequence

import keras
from keras import ops

from .vocabulary import Vocabulary, build_vocabulary, ctr_features  # the feature scheme


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

__all__ = ["FMInteraction", "FieldSum", "MODELS", "Vocabulary", "build_vocabulary", "ctr_features", "deepfm", "wide_and_deep"]

