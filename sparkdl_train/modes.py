"""The training modes and the engine that runs each.

``SparkModel(mode=...)``, the ``spark.sparkdl_train.*`` keys and ``KerasEstimator`` accept exactly
the modes registered here. An entry names its engine by import path (``"module:Class"``, imported
when a fit needs it, so this module depends on nothing) or by a function of the resolved
:class:`~sparkdl_train.config.EngineConfig` returning one, as ``'synchronous'`` does by
frequency. Adding an engine is one module with an :class:`~sparkdl_train.driver.engines.base.Engine`
subclass and one :func:`register` line.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Union

from .errors import ConfigError

Target = Union[str, type]
_ENGINES: dict[str, Callable[[Any], Target]] = {}

AVERAGING = "sparkdl_train.driver.engines.averaging:AveragingEngine"
PARAMETER_SERVER = "sparkdl_train.driver.engines.parameter_server:ParameterServerEngine"
ALLREDUCE = "sparkdl_train.driver.engines.allreduce:AllreduceEngine"
RING_AVERAGING = "sparkdl_train.driver.engines.allreduce:RingAveragingEngine"


def register(mode: str, engine: Union[Target, Callable[[Any], Target]]) -> None:
    """Make ``mode`` run ``engine``: an Engine subclass, its ``"module:Class"`` path, or a
    function ``config -> either``."""
    _ENGINES[mode] = engine if callable(engine) and not isinstance(engine, type) else (lambda config, e=engine: e)


def modes() -> tuple[str, ...]:
    return tuple(_ENGINES)


def engine_class(config: Any) -> type:
    """The Engine subclass that runs ``config`` (a validated EngineConfig)."""
    try:
        select = _ENGINES[config.mode]
    except KeyError:
        raise ConfigError(f"unknown mode {config.mode!r}; expected one of {', '.join(_ENGINES)}") from None
    target = select(config)
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target


register("synchronous", lambda c: AVERAGING if c.frequency == "epoch" else PARAMETER_SERVER)
register("asynchronous", PARAMETER_SERVER)
register("hogwild", PARAMETER_SERVER)
register("allreduce", lambda c: RING_AVERAGING if c.frequency == "epoch" else ALLREDUCE)
