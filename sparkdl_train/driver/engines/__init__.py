"""Training engines: the contract (:mod:`.base`) and the three built in. Which mode runs which
engine is registered in :mod:`sparkdl_train.modes`; adding an engine is a module here with an
:class:`~.base.Engine` subclass and one ``register`` line there.
"""

from __future__ import annotations

from ...modes import engine_class, modes, register
from .allreduce import AllreduceEngine
from .averaging import AveragingEngine
from .base import Engine, EpochContext, Launch, driver_host, evaluate_logs, run_epoch, server_host, use_tls
from .parameter_server import ParameterServerEngine

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
    "server_host",
    "use_tls",
]
