"""Elephas' API on sparkdl_train: change ``elephas`` to ``sparkdl_train.elephas`` in the imports.

The modules mirror Elephas 7's (``spark_model``, ``ml_model``, ``ml.adapter``, ``ml.params``,
``mllib.adapter``, ``utils.rdd_utils``, ``utils.model_utils``, ``utils.functional_utils``,
``utils.serialization``, ``enums``, and ``parameter``'s client classes by name); each is a thin layer
over sparkdl_train's own API, with no engine of its own. Elephas' parameter servers, worker and socket
modules have no counterpart: sparkdl_train's engines replace them.
The README's "Migrating from Elephas" maps every argument and lists the differences.
"""

from ._shim import ElephasCompatibilityWarning

__all__ = ["ElephasCompatibilityWarning"]
