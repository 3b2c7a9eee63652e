"""sparkdl_train: distributed Keras 3 training on Spark data pipelines."""

from .config import EngineConfig, FitConfig
from .data.rdd import to_simple_rdd
from .driver.spark_model import SparkModel
from .errors import ConfigError, DataError, ModelError, SparkDLError, WorkerError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "EngineConfig",
    "FitConfig",
    "ModelError",
    "SparkDLError",
    "SparkModel",
    "WorkerError",
    "to_simple_rdd",
]
