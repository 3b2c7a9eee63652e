"""Sparse embedding push/pull through the parameter server on local[2]: same training, fewer bytes."""

import keras
import numpy as np
import pytest

from sparkdl_train import SparkModel, to_simple_rdd

VOCAB, FIELDS = 3000, 4


TRAIN = 4000


def _data(n=TRAIN + 2000):
    """Ids with Zipf-like frequencies; the label depends on a planted weight per id.
    The first TRAIN rows train, the rest are held out."""
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    ids = rng.choice(VOCAB, size=(n, FIELDS), p=p / p.sum()).astype("int32")
    w = rng.normal(0, 1.5, VOCAB)
    y = (rng.random(n) < 1 / (1 + np.exp(-w[ids].sum(axis=1)))).astype("float32")
    return ids, y


def _model(optimizer):
    keras.utils.set_random_seed(3)
    ids = keras.Input((FIELDS,), dtype="int32", name="ids")
    e = keras.layers.Embedding(VOCAB, 4, name="emb")(ids)
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(e))
    m = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(h))
    m.compile(optimizer, "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return m


def _fit(sc, mode, frequency, sparse, optimizer, epochs=2, **kw):
    ids, y = _data()
    model = _model(optimizer)
    sm = SparkModel(model, mode=mode, frequency=frequency, num_workers=2, sparse_embeddings=sparse, seed=1, **kw)
    sm.fit(to_simple_rdd(sc, ids[:TRAIN], y[:TRAIN], num_slices=2), epochs=epochs, batch_size=64, verbose=0)
    return model, sm.stats.server


def test_sgd_rows_train_exactly_like_whole_tables(sc):
    """With plain SGD a row no batch looked up does not move, so pushing only touched rows
    (and pulling only the rows the next batches read) must give the dense result."""
    dense_model, dense = _fit(sc, "synchronous", 2, False, keras.optimizers.SGD(0.5))
    sparse_model, sparse = _fit(sc, "synchronous", 2, True, keras.optimizers.SGD(0.5))
    assert dense["sparse_tables"] == [] and sparse["sparse_tables"] == ["emb"]
    assert sparse["updates"] == dense["updates"] and sparse["rounds"] == dense["rounds"]
    for a, b in zip(dense_model.get_weights(), sparse_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
    # the table is 3000x4 floats; a push of 2 batches touches at most 2*64*4 ids
    assert sparse["bytes_in"] + sparse["bytes_out"] < (dense["bytes_in"] + dense["bytes_out"]) / 3
    assert dense["dense_to_actual_bytes"] == pytest.approx(1.0, abs=0.1)  # the estimate matches dense traffic
    assert sparse["dense_to_actual_bytes"] > 3
    # the server's table in 3 row ranges, each under its own lock (ps.tableShards): the same training
    sharded_model, sharded = _fit(sc, "synchronous", 2, True, keras.optimizers.SGD(0.5), table_shards=3)
    assert sharded["table_shards"] == 3 and sparse["table_shards"] == 1 and sharded["updates"] == sparse["updates"]
    for a, b in zip(dense_model.get_weights(), sharded_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("mode", ["asynchronous", "hogwild"])
def test_adam_rows_learn_as_well_as_whole_tables(sc, mode):
    ids, y = _data()
    scores = {}
    for sparse in (False, True):
        model, server = _fit(sc, mode, "batch", sparse, keras.optimizers.Adam(0.01), epochs=3)
        scores[sparse] = model.evaluate(ids[TRAIN:], y[TRAIN:], verbose=0, return_dict=True)["auc"]
        if sparse:
            assert server["dense_to_actual_bytes"] > 3
            assert server["updates"] == 3 * 2 * 32  # 2000 rows per worker / 64 = 32 pushes per epoch
    assert scores[True] > 0.75 and scores[True] >= scores[False] - 0.02, scores
