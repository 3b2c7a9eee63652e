"""Fixtures of Elephas' own test suite, on offline data.

Elephas' tests download MNIST and Boston housing; here ``mnist_data`` is scikit-learn's bundled
digits (8x8 images, 64 features, one-hot labels) and ``boston_housing_dataset`` a generated
13-feature regression with a planted nonlinear target. The model fixtures are Elephas', sized for
those inputs. ``keras_reference`` trains the same model single-process, for the accuracy checks
the ported tests add to Elephas' assertions.
"""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def spark_context(sc):
    return sc


@pytest.fixture(scope="session")
def spark_session(spark):
    return spark


@pytest.fixture
def classification_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential()
    model.add(keras.Input((64,)))
    model.add(keras.layers.Dense(128))
    model.add(keras.layers.Activation("relu"))
    model.add(keras.layers.Dropout(0.2))
    model.add(keras.layers.Dense(128))
    model.add(keras.layers.Activation("relu"))
    model.add(keras.layers.Dropout(0.2))
    model.add(keras.layers.Dense(10))
    model.add(keras.layers.Activation("softmax"))
    return model


@pytest.fixture
def classification_model_functional():
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(64,))
    hidden = keras.layers.Dropout(0.2)(keras.layers.Dense(128, activation="relu")(inputs))
    hidden = keras.layers.Dropout(0.2)(keras.layers.Dense(128, activation="relu")(hidden))
    return keras.Model(inputs=inputs, outputs=keras.layers.Dense(10, activation="softmax")(hidden))


@pytest.fixture
def regression_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential()
    model.add(keras.Input((13,)))
    model.add(keras.layers.Dense(64, activation="relu"))
    model.add(keras.layers.Dense(64, activation="relu"))
    model.add(keras.layers.Dense(1, activation="linear"))
    return model


@pytest.fixture(scope="session")
def mnist_data(digits):
    """(x_train, y_train, x_test, y_test) with one-hot labels, like Elephas' MNIST fixture."""
    x, y, xt, yt = digits
    eye = np.eye(10, dtype="float32")
    return x, eye[y], xt, eye[yt]


@pytest.fixture(scope="session")
def boston_housing_dataset():
    """404 training and 102 test rows of 13 features, target = a planted nonlinear function + noise."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(506, 13)).astype("float32")
    w = rng.normal(size=13)
    y = (3.0 * np.tanh(x @ w / 3) + 0.5 * x[:, 0] * x[:, 1] + rng.normal(scale=0.3, size=506)).astype("float32")
    return x[:404], y[:404], x[404:], y[404:]


@pytest.fixture
def keras_reference():
    """``reference(model, x, y, x_test, y_test, epochs, batch_size)``: the test metrics of a single-process
    ``model.fit`` of a copy of ``model`` (same weights, same compile settings)."""
    import keras

    def reference(model, x, y, x_test, y_test, epochs, batch_size, custom_objects=None):
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        copy.compile(optimizer=model.optimizer.__class__.from_config(model.optimizer.get_config()),
                     loss=model.loss, metrics=_metric_names(model))
        copy.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True)
        return copy.evaluate(x_test, y_test, verbose=0, return_dict=True)

    return reference


def _metric_names(model):
    config = model.get_compile_config() or {}
    metrics = config.get("metrics")
    return list(metrics) if metrics else None
