"""sklearn's digits and a small MLP: the classification workload of the fixed-cost and rendezvous
benches and of most tests (tests/support/helpers.py imports them from here)."""

from __future__ import annotations


def digits_split():
    """sklearn's bundled digits (no download) scaled to [0, 1], shuffled with seed 0 and split
    80/20: ``(x, y, x_test, y_test)``, labels int64."""
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm], y[perm].astype("int64")
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_mlp(seed=0, inputs=64, classes=10, lr=0.003):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((inputs,), name="pixels"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile(keras.optimizers.Adam(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
