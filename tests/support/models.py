"""Models used by the tests; this module is shipped to executors by value."""

import keras
import numpy as np


class Scale(keras.layers.Layer):
    """A custom layer with a weight and a config argument."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    def call(self, x):
        return x * self.w * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


class Tower(keras.Model):
    """A subclassed model using the custom layer."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.scale = Scale(0.5)
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def build(self, input_shape):
        self.hidden.build(input_shape)
        self.scale.build((None, self.units))
        self.out.build((None, self.units))

    def call(self, x):
        return self.out(self.scale(self.hidden(x)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def weighted_bce(y_true, y_pred):
    return keras.losses.binary_crossentropy(y_true, y_pred) * 1.0


CUSTOM = {"Scale": Scale, "Tower": Tower, "weighted_bce": weighted_bce}


def subclassed(seed=0, features=8):
    keras.utils.set_random_seed(seed)
    model = Tower(16)
    model.compile(keras.optimizers.Adam(0.01), loss=weighted_bce, metrics=["accuracy", keras.metrics.AUC(name="auc")])
    model.build((None, features))
    return model


class Unconfigured(keras.Model):
    """A subclassed model as guides write them: no get_config, so Keras cannot rebuild it from its config."""

    def __init__(self, units):
        super().__init__()
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, x):
        return self.out(self.hidden(x))


def unshippable(seed=0, features=8):
    keras.utils.set_random_seed(seed)
    model = Unconfigured(16)
    model.compile(keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    model.build((None, features))
    return model


def two_input(seed=0, dense=3, vocab=20, cat_width=2):
    keras.utils.set_random_seed(seed)
    d = keras.Input((dense,), name="numeric")
    c = keras.Input((cat_width,), dtype="int32", name="cat")
    e = keras.layers.Flatten()(keras.layers.Embedding(vocab, 4)(c))
    h = keras.layers.Concatenate()([d, e])
    h = keras.layers.Dense(16, activation="relu")(h)
    out = keras.layers.Dense(1, activation="sigmoid")(h)
    model = keras.Model({"numeric": d, "cat": c}, out)
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy", keras.metrics.AUC(name="auc")])
    return model


def planted_two_input(n, seed=0, dense=3, vocab=20, cat_width=2):
    """Labels from a planted logistic model over dense features and categorical ids."""
    rng = np.random.default_rng(seed)
    xd = rng.normal(size=(n, dense)).astype("float32")
    xc = rng.integers(0, vocab, size=(n, cat_width)).astype("int32")
    wd = np.array([1.5, -2.0, 1.0][:dense])
    wc = rng.normal(scale=1.5, size=vocab)
    logit = xd @ wd + wc[xc].sum(axis=1)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype("float32")
    return xd, xc, y
