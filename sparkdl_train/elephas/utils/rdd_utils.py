"""RDD helpers with Elephas' names and signatures (``elephas.utils.rdd_utils``).

``to_simple_rdd`` is sparkdl_train's: it ships one block of rows per partition instead of one pickled
pair per row, and yields the same ``(x_row, y_row)`` elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data.rdd import to_simple_rdd
from ...errors import DataError
from ..mllib.adapter import from_vector, to_vector

__all__ = ["encode_label", "from_labeled_point", "lp_to_simple_rdd", "to_labeled_point", "to_simple_rdd"]


def encode_label(label: Any, nb_classes: int) -> np.ndarray:
    """The one-hot vector (float64, ``nb_classes`` long) of a class index given as int or integral float."""
    index = _class_index(label, nb_classes)
    encoded = np.zeros(nb_classes)
    encoded[index] = 1.0
    return encoded


def _class_index(label: Any, nb_classes: int | None) -> int:
    value = float(label)
    if not value.is_integer() or value < 0 or (nb_classes is not None and value >= nb_classes):
        limit = f" below nb_classes={nb_classes}" if nb_classes is not None else ""
        raise DataError(f"label {label!r} is not a class index (a whole number from 0{limit})")
    return int(value)


def to_labeled_point(sc: Any, features: Any, labels: Any, categorical: bool = False) -> Any:
    """An RDD of MLlib ``LabeledPoint``; ``categorical``: ``labels`` are one-hot rows, stored as their argmax."""
    from pyspark.mllib.regression import LabeledPoint

    features, labels = np.asarray(features), np.asarray(labels)
    if len(features) != len(labels):
        raise DataError(f"features has {len(features)} rows but labels has {len(labels)}")

    def points(block: tuple[np.ndarray, np.ndarray]) -> Any:
        xs, ys = block
        for x, y in zip(xs, ys):
            label = float(np.argmax(y)) if categorical else float(np.asarray(y).reshape(-1)[0])
            yield LabeledPoint(label, to_vector(np.asarray(x, dtype=np.float64).reshape(-1)))

    edges = np.linspace(0, len(features), sc.defaultParallelism + 1).astype(int)
    blocks = [(features[lo:hi], labels[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
    return sc.parallelize(blocks, max(1, len(blocks))).flatMap(points)


def from_labeled_point(rdd: Any, categorical: bool = False, nb_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Collect an RDD of ``LabeledPoint`` into ``(features, labels)`` arrays (labels one-hot when ``categorical``)."""
    pairs = rdd.map(lambda lp: (from_vector(lp.features), lp.label)).collect()
    if not pairs:
        raise DataError("the LabeledPoint RDD is empty")
    features = np.stack([x for x, _ in pairs])
    labels = np.array([y for _, y in pairs])
    if not categorical:
        return features, labels
    nb_classes = nb_classes or int(labels.max()) + 1
    return features, np.stack([encode_label(y, nb_classes) for y in labels])


def lp_to_simple_rdd(lp_rdd: Any, categorical: bool = False, nb_classes: int | None = None) -> Any:
    """An RDD of ``(features array, label)`` from ``LabeledPoint`` s; ``categorical``: labels one-hot
    (``nb_classes`` counted with one Spark job when not given)."""
    if not categorical:
        return lp_rdd.map(lambda lp: (from_vector(lp.features), lp.label))
    if not nb_classes:
        nb_classes = int(lp_rdd.map(lambda lp: lp.label).max()) + 1
    n = nb_classes
    return lp_rdd.map(lambda lp: (from_vector(lp.features), encode_label(lp.label, n)))
