"""sparkdl_train: distributed Keras 3 training on Spark data pipelines.

The names below load on first use, so importing the package (as every executor's Python worker
and the worker daemon do) costs nothing until a name is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "sparkdl_train.errors",
    "ConsistencyError": "sparkdl_train.errors",
    "DataError": "sparkdl_train.errors",
    "DynamicTable": "sparkdl_train.driver.stream_ids",
    "EngineConfig": "sparkdl_train.config",
    "FitCancelled": "sparkdl_train.errors",
    "FitConfig": "sparkdl_train.config",
    "ModelError": "sparkdl_train.errors",
    "ServerStopped": "sparkdl_train.errors",
    "SparkDLError": "sparkdl_train.errors",
    "SparkModel": "sparkdl_train.driver.spark_model",
    "WorkerError": "sparkdl_train.errors",
    "check_executors": "sparkdl_train.driver.preflight",
    "latest_version": "sparkdl_train.driver.stream",
    "load_latest": "sparkdl_train.driver.spark_model",
    "load_spark_model": "sparkdl_train.driver.spark_model",
    "map_ids": "sparkdl_train.driver.stream_ids",
    "to_simple_rdd": "sparkdl_train.data.rdd",
    "warm_up": "sparkdl_train.driver.warm_up",
}
__all__ = [
    "ConfigError", "ConsistencyError", "DataError", "DynamicTable", "EngineConfig", "FitCancelled", "FitConfig", "ModelError",
    "ServerStopped", "SparkDLError", "SparkModel", "WorkerError", "check_executors", "latest_version", "load_latest", "load_spark_model", "map_ids",
    "to_simple_rdd", "warm_up",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from .config import EngineConfig, FitConfig
    from .data.rdd import to_simple_rdd
    from .driver.preflight import check_executors
    from .driver.spark_model import SparkModel, load_latest, load_spark_model
    from .driver.stream import latest_version
    from .driver.stream_ids import DynamicTable, map_ids
    from .driver.warm_up import warm_up
    from .errors import ConfigError, ConsistencyError, DataError, FitCancelled, ModelError, ServerStopped, SparkDLError, WorkerError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkdl_train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
