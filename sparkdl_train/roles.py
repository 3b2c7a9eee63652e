"""Every variable's role in a distributed fit, decided here once (pure: no Keras, no Spark).

A Keras model holds more than trainable float weights: BatchNorm's moving statistics,
``Normalization``'s adapted mean and variance and its sample count, ``StringLookup`` /
``IntegerLookup`` / ``Discretization`` state, the optimizer's step counter, random-number
generators' seeds. Each engine honours the role a variable has:

=============  ===============================================  ================================================
role           what it is                                       how the engines treat it
=============  ===============================================  ================================================
``weight``     floating, trainable                              merged by the engine's rule: gradients summed
                                                                (allreduce), deltas pushed (parameter server),
                                                                sample-weighted mean (averaging)
``statistic``  floating, not trainable (moving mean/variance,   its sample-weighted mean across workers
               an adapted ``Normalization``)                    (averaging, allreduce), or its deltas through
                                                                the parameter server like a weight's, scaled the
                                                                same way (the server's copy is the mean's path)
``discrete``   integer or boolean (vocabulary sizes, counters,  never merged as a delta and never averaged:
               the optimizer's ``iteration``)                   every worker starts from the driver's value; what
                                                                comes back is merged by maximum (a counter that
                                                                advanced on any worker advances)
``random``     a random generator's state (``SeedGenerator``)   never sent, never merged: each task sets it from
                                                                ``(seed, epoch, partition)``
=============  ===============================================  ================================================

:func:`role` decides from a variable's dtype, trainability and path; :func:`exchanged` lists the
positions whose values travel as numbers to be added or averaged (``weight`` and ``statistic``).
"""

from __future__ import annotations

import enum
from typing import Sequence

import numpy as np


class Role(str, enum.Enum):
    WEIGHT = "weight"
    STATISTIC = "statistic"
    DISCRETE = "discrete"
    RANDOM = "random"


# Keras names a SeedGenerator's variable "seed_generator_state" (keras.random.SeedGenerator)
_RANDOM_MARKERS = ("seed_generator",)


def role(dtype: object, trainable: bool, path: str = "") -> Role:
    """The role of one variable of ``dtype`` (anything ``np.dtype`` takes; Keras' dtype names do)."""
    name = str(path).lower()
    if any(m in name for m in _RANDOM_MARKERS):
        return Role.RANDOM
    kind = _kind(dtype)
    if kind in "fc":
        return Role.WEIGHT if trainable else Role.STATISTIC
    return Role.DISCRETE


def merged(r: Role) -> bool:
    """Whether the engines merge values of this role arithmetically (sums, means, deltas)."""
    return r in (Role.WEIGHT, Role.STATISTIC)


def exchanged(roles: Sequence[Role]) -> list[int]:
    """Positions whose values the engines add and average (weights and statistics)."""
    return [i for i, r in enumerate(roles) if merged(r)]


def is_numeric_mergeable(dtype: object) -> bool:
    """Arrays of this dtype are averaged (floating); the others are merged by maximum."""
    return _kind(dtype) in "fc"


def _kind(dtype: object) -> str:
    name = getattr(dtype, "name", dtype)
    if name == "bfloat16":  # numpy has no bfloat16 of its own
        return "f"
    if name in ("string", "str"):
        return "U"
    try:
        return np.dtype(name).kind
    except TypeError:
        return "O"
