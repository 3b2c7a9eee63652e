"""Batch transforms, binary and string columns in real fits (local[2])."""

import io
import threading

import keras
import numpy as np
import pandas as pd
import pytest
from helpers import settle

from sparkdl_train import SparkModel
from sparkdl_train.datasets.images import encode_png
from sparkdl_train.errors import ConfigError, WorkerError

N = 400


@pytest.fixture(scope="module", autouse=True)
def by_value():
    """The transforms below ship by value, as a notebook's functions do (executors cannot import this file)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def pictures(spark):
    """The same 8x8 images as PNG bytes and as decoded float32 arrays, in the same rows."""
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, (N, 8, 8), dtype=np.uint8)
    label = (pix[:, :4].mean((1, 2)) > pix[:, 4:].mean((1, 2))).astype("int64")  # top half brighter
    decoded = (pix.astype("float32") / 255).reshape(N, 64)
    as_bytes = spark.createDataFrame(pd.DataFrame({"content": [encode_png(p) for p in pix], "label": label}), "content binary, label long")
    as_arrays = spark.createDataFrame(pd.DataFrame({"image": list(decoded), "label": label}), "image array<float>, label long")
    return as_bytes.cache(), as_arrays.cache(), decoded.reshape(N, 8, 8, 1), label


def decode_png(cols):
    """Module-level, as a user's would be (shipped to executors with cloudpickle)."""
    from PIL import Image

    imgs = np.stack([np.asarray(Image.open(io.BytesIO(b)), np.float32) for b in cols["content"]]) / 255
    return {"image": imgs[..., None]}


def small_cnn():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(2, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_decoding_on_executors_trains_exactly_as_pre_decoded_arrays(spark, pictures):
    as_bytes, as_arrays, decoded, label = pictures
    runs = {}
    for name, df, kw in [("bytes", as_bytes, {"transform": decode_png}), ("arrays", as_arrays, {})]:
        model = small_cnn()
        # several threads on slices of 16 rows: the order, hence the result, must not change
        sm = SparkModel(model, num_workers=2, seed=1, transform_threads=3, transform_rows=16)
        hist = sm.fit(df, epochs=2, batch_size=32, verbose=0, feature_cols="image", **kw)
        runs[name] = (model.get_weights(), hist.history, sm)
    for a, b in zip(runs["bytes"][0], runs["arrays"][0]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for key, values in runs["arrays"][1].items():
        assert runs["bytes"][1][key] == pytest.approx(values, rel=1e-6), key
    sm = runs["bytes"][2]
    assert sm.transform is decode_png  # remembered for evaluate and predict
    # evaluate and predict run the transform too; they equal the driver's Keras on the decoded arrays
    logs = sm.evaluate(as_bytes, batch_size=64, return_dict=True)
    ref = sm.model.evaluate(decoded, label, batch_size=64, verbose=0, return_dict=True)
    assert logs["accuracy"] == pytest.approx(ref["accuracy"], abs=1e-6) and logs["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    out = sm.predict(as_bytes, batch_size=64)
    assert out.columns == ["content", "label", "prediction"]  # appended to the original rows
    got = np.array([r[0] for r in out.select("prediction").collect()])
    np.testing.assert_allclose(got, sm.model.predict(decoded, verbose=0), rtol=1e-5, atol=1e-6)


def _fails_on_row_317(cols):
    ids = cols["id"]
    if (ids == 317).any():
        raise ZeroDivisionError(f"bad row {int(ids[ids == 317][0])}")
    return {"x": np.stack([ids, ids * 0.5], axis=1).astype("float32") / N}


def test_an_error_in_the_transform_fails_the_fit_naming_partition_rows_and_exception(spark):
    df = spark.range(0, N, 1, 2).selectExpr("id", "cast(id % 2 as long) as label")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,), name="x"), keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    sm = SparkModel(model, num_workers=2, transform_rows=50)
    with pytest.raises(WorkerError) as info:
        sm.fit(df, epochs=1, batch_size=16, verbose=0, feature_cols="x", transform=_fails_on_row_317)
    text = str(info.value)
    # partition 1 holds ids 200-399: id 317 is its row 117, in the slice of rows 100-149
    assert "TransformError" in text and "partition 1, rows 100-149" in text, text[-3000:]
    assert "ZeroDivisionError: bad row 317" in text and "_fails_on_row_317" in text
    assert info.value.cause == "user_error"
    settle(lambda: not spark.sparkContext.statusTracker().getActiveJobsIds())
    assert not [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-") and t.is_alive()]


def test_a_transform_with_an_rdd_is_refused(spark):
    rdd = spark.sparkContext.parallelize([(np.zeros(2), 0)] * 8)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ConfigError, match="rdd.map"):
        SparkModel(model).fit(rdd, transform=lambda c: c, verbose=0)


CITIES = ["paris", "lyon", "nice", "lille", "brest", "metz"]


def test_string_columns_feed_a_string_lookup_model_directly(spark):
    """No transform: the string column goes to a Keras string input (StringLookup inside the model)."""
    rng = np.random.default_rng(5)
    n = 3000
    city = rng.choice(CITIES, n)
    hours = rng.uniform(0, 1, n).astype("float32")
    label = ((np.isin(city, ["paris", "nice", "metz"])) ^ (hours > 0.8)).astype("int64")
    pdf = pd.DataFrame({"city": city, "hours": hours, "label": label})
    df = spark.createDataFrame(pdf, "city string, hours float, label long").repartition(2, "city").cache()

    def build():
        keras.utils.set_random_seed(0)
        c = keras.Input((1,), dtype="string", name="city")
        h = keras.Input((1,), name="hours")
        e = keras.layers.Flatten()(keras.layers.Embedding(len(CITIES) + 1, 4)(keras.layers.StringLookup(vocabulary=CITIES)(c)))
        z = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([e, h]))
        model = keras.Model([c, h], keras.layers.Dense(1, activation="sigmoid")(z))
        model.compile(keras.optimizers.Adam(0.02), "binary_crossentropy", metrics=["accuracy"])
        return model

    import tensorflow as tf

    ref = build()
    x = {"city": tf.constant(city[:, None].astype(str)), "hours": hours[:, None]}  # Keras' own fit needs tf strings
    ref.fit(x, label, epochs=4, batch_size=32, verbose=0)
    ref_acc = ref.evaluate(x, label, verbose=0, return_dict=True)["accuracy"]
    sm = SparkModel(build(), mode="asynchronous", frequency="batch", num_workers=2)
    cols = {"feature_cols": {"city": "city", "hours": "hours"}}
    sm.fit(df, epochs=4, batch_size=32, verbose=0, **cols)
    acc = sm.evaluate(df, batch_size=256, return_dict=True)["accuracy"]
    assert acc > 0.95 and acc >= ref_acc - 0.02, (acc, ref_acc)
    pred = sm.predict(df.where("city = 'lyon'").limit(5)).select("prediction").collect()
    assert len(pred) == 5 and all(0 <= r[0] <= 1 for r in pred)


def _reviews(n, seed):
    """Generated reviews: neutral filler plus planted positive/negative words; the label is the
    sign of their summed weights plus noise (about 90% learnable)."""
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(300)]
    good = [f"good{i}" for i in range(15)]
    bad = [f"bad{i}" for i in range(15)]
    texts, labels = [], []
    for _ in range(n):
        k = rng.integers(6, 20)
        words = list(rng.choice(filler, k))
        score = 0.0
        for _ in range(rng.integers(1, 4)):
            if rng.random() < 0.5:
                words.append(rng.choice(good))
                score += 1
            else:
                words.append(rng.choice(bad))
                score -= 1
        rng.shuffle(words)
        texts.append(" ".join(words).capitalize() + ".")
        labels.append(int(score + rng.normal(0, 0.6) > 0))
    return np.array(texts, dtype=object), np.array(labels, dtype="int64")


def test_a_text_classifier_trains_from_a_string_column_as_well_as_single_process_keras(spark):
    import tensorflow as tf

    texts, labels = _reviews(6000, seed=1)
    test_texts, test_labels = _reviews(2000, seed=2)
    train = spark.createDataFrame(pd.DataFrame({"text": texts, "label": labels}), "text string, label long").repartition(2).cache()
    test = spark.createDataFrame(pd.DataFrame({"text": test_texts, "label": test_labels}), "text string, label long")
    # the vocabulary is adapted on the driver from a sample of the DataFrame, never from all of it
    sample = [r.text for r in train.limit(2000).collect()]

    def build():
        keras.utils.set_random_seed(0)
        vectorize = keras.layers.TextVectorization(max_tokens=400, output_sequence_length=24)
        vectorize.adapt(tf.constant(sample))
        text = keras.Input((1,), dtype="string", name="text")
        tokens = vectorize(keras.layers.Reshape(())(text))
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(400, 16, mask_zero=True)(tokens))
        model = keras.Model(text, keras.layers.Dense(1, activation="sigmoid")(h))
        model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
        return model

    ref = build()
    ref.fit(tf.constant(texts.astype(str)[:, None]), labels, epochs=4, batch_size=32, verbose=0)
    ref_acc = ref.evaluate(tf.constant(test_texts.astype(str)[:, None]), test_labels, verbose=0, return_dict=True)["accuracy"]

    sm = SparkModel(build(), mode="asynchronous", frequency="batch", num_workers=2)
    sm.fit(train, epochs=4, batch_size=32, verbose=0, feature_cols="text")
    acc = sm.evaluate(test, batch_size=256, return_dict=True)["accuracy"]
    assert ref_acc > 0.8, ref_acc  # the planted words are learnable
    assert acc >= ref_acc - 0.02, (acc, ref_acc)
    scored = sm.predict(test, batch_size=256).select("label", "prediction").collect()
    hits = np.mean([(r.prediction > 0.5) == (r.label == 1) for r in scored])
    assert hits == pytest.approx(acc, abs=1e-6)  # predict agrees with evaluate, row by row


def test_keras_estimator_takes_a_transform_and_its_model_applies_it(spark, pictures):
    from sparkdl_train.ml import KerasEstimator

    as_bytes, _, decoded, _ = pictures
    est = KerasEstimator(model=small_cnn(), transform=decode_png, featuresCol="image", epochs=1, batchSize=32, numWorkers=2, verbose=0)
    fitted = est.fit(as_bytes)
    assert fitted.getTransform() is decode_png and len(fitted.history["loss"]) == 1
    got = np.array([r[0] for r in fitted.transform(as_bytes).select("prediction").collect()])
    np.testing.assert_allclose(got, fitted.getKerasModel().predict(decoded, verbose=0), rtol=1e-5, atol=1e-6)
