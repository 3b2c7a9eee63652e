"""Training engines, registered by mode.

``SparkModel(mode=...)`` looks its engine up here: :func:`register` maps a mode to an
:class:`~.base.Engine` subclass (or to a function of the resolved
:class:`~sparkdl_train.config.EngineConfig` that picks one, as ``'synchronous'`` does by
frequency). Adding an engine is one module with an ``Engine`` subclass (see :mod:`.base` for
the contract) and one ``register`` call below; the mode is then accepted everywhere a mode is
(``SparkModel``, ``spark.sparkdl_train.*``, ``KerasEstimator``).
"""

from __future__ import annotations

from typing import Callable, Union

from ...errors import ConfigError
from .allreduce import AllreduceEngine
from .averaging import AveragingEngine
from .base import Engine, EpochContext, Launch, driver_host, evaluate_logs, run_epoch
from .parameter_server import ParameterServerEngine

Selector = Callable[[object], type]
_ENGINES: dict[str, Selector] = {}


def register(mode: str, engine: Union[type, Selector]) -> None:
    """Make ``mode`` run ``engine`` (an Engine subclass, or ``config -> Engine subclass``)."""
    _ENGINES[mode] = (lambda config, cls=engine: cls) if isinstance(engine, type) else engine


def modes() -> tuple[str, ...]:
    return tuple(_ENGINES)


def engine_class(config) -> type:
    """The Engine subclass that runs ``config`` (a validated EngineConfig)."""
    try:
        select = _ENGINES[config.mode]
    except KeyError:
        raise ConfigError(f"unknown mode {config.mode!r}; expected one of {', '.join(_ENGINES)}") from None
    return select(config)


register("synchronous", lambda c: AveragingEngine if c.frequency == "epoch" else ParameterServerEngine)
register("asynchronous", ParameterServerEngine)
register("hogwild", ParameterServerEngine)
register("allreduce", AllreduceEngine)

__all__ = [
    "AllreduceEngine",
    "AveragingEngine",
    "Engine",
    "EpochContext",
    "Launch",
    "ParameterServerEngine",
    "driver_host",
    "engine_class",
    "evaluate_logs",
    "modes",
    "register",
    "run_epoch",
]
