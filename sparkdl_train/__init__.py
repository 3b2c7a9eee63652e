"""sparkdl_train: distributed Keras 3 training on Spark data pipelines."""

from .config import EngineConfig, FitConfig
from .data.rdd import to_simple_rdd
from .driver.preflight import check_executors
from .driver.spark_model import SparkModel, load_spark_model
from .errors import ConfigError, ConsistencyError, DataError, FitCancelled, ModelError, ServerStopped, SparkDLError, WorkerError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ConsistencyError",
    "DataError",
    "EngineConfig",
    "FitCancelled",
    "FitConfig",
    "ModelError",
    "ServerStopped",
    "SparkDLError",
    "SparkModel",
    "WorkerError",
    "check_executors",
    "load_spark_model",
    "to_simple_rdd",
]
