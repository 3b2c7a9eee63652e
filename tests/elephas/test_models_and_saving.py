"""Elephas' test_custom_models.py, test_model_serialization.py and test_mllib_model.py, imports changed to
sparkdl_train.elephas, on offline data, with the checks after "added" (not in Elephas' tests); plus
files written by Elephas 7.3 itself (data/make_elephas_files.py) loading here."""

import os
import warnings

import keras
import numpy as np
import pytest
from keras import models
from keras.activations import sigmoid
from keras.layers import Dense, Input
from keras.models import Model, Sequential
from keras.optimizers import SGD, RMSprop

from sparkdl_train.elephas import ElephasCompatibilityWarning
from sparkdl_train.elephas.enums.modes import Mode
from sparkdl_train.elephas.ml_model import load_ml_estimator, load_ml_transformer
from sparkdl_train.elephas.spark_model import AsynchronousSparkModel, SparkMLlibModel, SparkModel, load_spark_model
from sparkdl_train.elephas.utils import to_simple_rdd
from sparkdl_train.elephas.utils.rdd_utils import to_labeled_point

DATA = os.path.join(os.path.dirname(__file__), "data")
pytestmark = pytest.mark.filterwarnings("ignore::sparkdl_train.elephas.ElephasCompatibilityWarning")


@pytest.mark.parametrize("mode", [Mode.SYNCHRONOUS, pytest.param(Mode.ASYNCHRONOUS, marks=pytest.mark.slow),
                                  pytest.param(Mode.HOGWILD, marks=pytest.mark.slow)])
def test_training_custom_activation(mode, spark_context):
    def custom_activation(x):
        return sigmoid(x) + 1

    keras.utils.set_random_seed(0)  # added: the same start for every mode
    model = Sequential()
    model.add(Dense(1, input_dim=1, activation=custom_activation))
    model.add(Dense(1, activation="sigmoid"))
    sgd = SGD(learning_rate=0.5)
    model.compile(sgd, "binary_crossentropy", ["acc"])

    rng = np.random.default_rng(1)
    x_train = rng.random(2000)
    y_train = (x_train > 0.5).astype("float32")  # Elephas' labels ignore x; here there is something to learn
    x_test = rng.random(200)
    y_test = (x_test > 0.5).astype("float32")
    rdd = to_simple_rdd(spark_context, x_train, y_train)

    spark_model = SparkModel(model, frequency="epoch", mode=mode,
                             custom_objects={"custom_activation": custom_activation}, port=4000)
    spark_model.fit(rdd, epochs=10, batch_size=16, verbose=0, validation_split=0.1)  # Elephas: 1 epoch
    assert spark_model.predict(x_test)
    assert spark_model.evaluate(x_test, y_test)
    # added: a list of rows, as Elephas returns; the loss alone (the positional ['acc'] dropped, as Elephas does);
    # learned (single-process Keras: 0.96 after 5 epochs)
    predictions = spark_model.predict(x_test)
    assert isinstance(predictions, list) and len(predictions) == 200 and predictions[0].shape == (1,)
    assert isinstance(spark_model.evaluate(x_test, y_test), float)
    acc = float(np.mean((np.concatenate(predictions) > 0.5) == y_test))
    assert acc > 0.8, f"{mode.value}: accuracy {acc:.3f}"
    assert spark_model.stats.mode == mode.value


def test_sequential_serialization(classification_model, tmp_path):
    classification_model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=["acc"])
    spark_model = SparkModel(classification_model, frequency="epoch", mode=Mode.SYNCHRONOUS)
    spark_model.save(str(tmp_path / "elephas_sequential.h5"))
    # added: Keras opens the file as it is, and load_spark_model gives back the same model and settings
    probe = np.random.default_rng(0).random((4, 64)).astype("float32")
    assert np.allclose(models.load_model(str(tmp_path / "elephas_sequential.h5")).predict(probe, verbose=0),
                       classification_model.predict(probe, verbose=0), atol=1e-6)
    loaded = load_spark_model(str(tmp_path / "elephas_sequential.h5"))
    assert type(loaded) is SparkModel and (loaded.mode, loaded.frequency) == ("synchronous", "epoch")
    with pytest.raises(FileExistsError):
        spark_model.save(str(tmp_path / "elephas_sequential.h5"))  # overwrite=False, as Elephas documents


def test_model_serialization(tmp_path):
    inputs = Input(shape=(784,))
    x = Dense(64, activation="relu")(inputs)
    x = Dense(64, activation="relu")(x)
    predictions = Dense(10, activation="softmax")(x)
    model = Model(inputs=inputs, outputs=predictions)
    model.compile(optimizer="rmsprop", loss="categorical_crossentropy", metrics=["accuracy"])

    spark_model = SparkModel(model, frequency="epoch", mode="synchronous", foo="bar")
    spark_model.save(str(tmp_path / "elephas_model.h5"))
    # added: the unknown keyword is kept, as Elephas keeps it, through save and load (with a warning when given)
    assert spark_model.get_config()["foo"] == "bar"
    assert load_spark_model(str(tmp_path / "elephas_model.h5")).get_config() == spark_model.get_config()
    spark_model = AsynchronousSparkModel(model, frequency="batch", staleness_bound=3)
    spark_model.save(str(tmp_path / "elephas_model.keras"))
    loaded = load_spark_model(str(tmp_path / "elephas_model.keras"))
    assert type(loaded) is AsynchronousSparkModel
    assert loaded.get_config() == spark_model.get_config()
    assert loaded.config.staleness_bound == 3
    assert models.load_model(str(tmp_path / "elephas_model.keras")).optimizer.__class__.__name__ == "RMSprop"


@pytest.mark.parametrize("name,cls,mode,frequency", [("elephas_sync.h5", SparkModel, "synchronous", "epoch"),
                                                     ("elephas_async.h5", AsynchronousSparkModel, "hogwild", "batch")])
def test_files_saved_by_elephas_load(name, cls, mode, frequency):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElephasCompatibilityWarning)  # loading says nothing about port/http
        loaded = load_spark_model(os.path.join(DATA, name))
    assert type(loaded) is cls and (loaded.mode, loaded.frequency, loaded.num_workers) == (mode, frequency, 2)
    probe = np.load(os.path.join(DATA, "elephas_probe.npy"))
    assert np.allclose(loaded.master_network.predict(probe, verbose=0), np.load(os.path.join(DATA, "elephas_probe_out.npy")),
                       atol=1e-5)


def test_ml_stages_saved_by_elephas_load():
    transformer = load_ml_transformer(os.path.join(DATA, "elephas_transformer.h5"))
    probe = np.load(os.path.join(DATA, "elephas_probe.npy"))
    assert np.allclose(transformer.get_model().predict(probe, verbose=0), np.load(os.path.join(DATA, "elephas_probe_out.npy")),
                       atol=1e-5)
    assert transformer.getOutputCol() == "probabilities"
    estimator = load_ml_estimator(os.path.join(DATA, "elephas_estimator.h5"))
    assert (estimator.get_mode(), estimator.get_epochs(), estimator.get_nb_classes()) == ("hogwild", 3, 3)
    assert estimator.get_loss() == "categorical_crossentropy"


def test_serialization(classification_model, tmp_path):
    rms = RMSprop()
    classification_model.compile(rms, "categorical_crossentropy", ["acc"])
    spark_model = SparkMLlibModel(classification_model, frequency="epoch", mode=Mode.SYNCHRONOUS, num_workers=2)
    spark_model.save(str(tmp_path / "test.h5"))
    loaded_model = load_spark_model(str(tmp_path / "test.h5"))
    assert loaded_model.master_network.to_json()
    assert type(loaded_model) is SparkMLlibModel and loaded_model.num_workers == 2  # added


@pytest.mark.slow
def test_mllib_model(spark_context, classification_model, mnist_data):
    from pyspark.mllib.linalg import Matrices, Vectors

    rms = RMSprop()
    classification_model.compile(rms, "categorical_crossentropy", ["acc"])
    x_train, y_train, x_test, y_test = mnist_data
    lp_rdd = to_labeled_point(spark_context, x_train, y_train, categorical=True)
    spark_model = SparkMLlibModel(model=classification_model, frequency="epoch", mode=Mode.SYNCHRONOUS)
    spark_model.fit(lp_rdd, epochs=5, batch_size=32, verbose=0, validation_split=0.1, categorical=True, nb_classes=10)
    score = spark_model.master_network.evaluate(x_test, y_test, verbose=2)
    assert score
    # added (the positional ['acc'] dropped, as Elephas drops it: the score is the loss)
    accuracy = float(np.mean(spark_model.master_network.predict(x_test, verbose=0).argmax(1) == y_test.argmax(1)))
    assert accuracy > 0.85, f"accuracy {accuracy:.3f}"
    # added: MLlib matrices and vectors in, the same kind out, equal to the driver model's predictions
    driver = spark_model.master_network.predict(x_test[:5], verbose=0)
    matrix = spark_model.predict(Matrices.dense(5, 64, x_test[:5].ravel(order="F")))
    assert (matrix.numRows, matrix.numCols) == (5, 10) and np.allclose(matrix.toArray(), driver, atol=1e-5)
    vector = spark_model.predict(Vectors.dense(x_test[0]))
    assert np.allclose(vector.toArray(), driver[0], atol=1e-5)
