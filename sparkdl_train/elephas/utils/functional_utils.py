"""Weight-list arithmetic with Elephas' names (``elephas.utils.functional_utils``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def add_params(left: Sequence[np.ndarray], right: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [a + b for a, b in zip(left, right)]


def subtract_params(left: Sequence[np.ndarray], right: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [a - b for a, b in zip(left, right)]


def get_neutral(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.zeros_like(a) for a in arrays]


def divide_by(arrays: Sequence[np.ndarray], num_workers: int) -> list[np.ndarray]:
    return [a / num_workers for a in arrays]


def average_and_subtract(base: Sequence[np.ndarray], deltas: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """``base`` minus the mean of ``deltas``, array by array (``base`` copied when there are none)."""
    if not deltas:
        return [np.array(b, copy=True) for b in base]
    return [b - np.mean([d[i] for d in deltas], axis=0) for i, b in enumerate(base)]
