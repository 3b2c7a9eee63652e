"""Elephas' ``elephas.parameter``: its parameter-server client classes, by name.

sparkdl_train's parameter server lives inside each ``fit`` and speaks its own authenticated binary
protocol (sparkdl_train.ps), so there is no standalone server for these clients to reach, and the
HTTP and socket protocols of Elephas' servers move pickles, which sparkdl_train never loads from the
network. The classes construct and choose by name as Elephas' do (``BaseParameterClient.get_client``);
their ``get_parameters`` / ``update_parameters`` raise :class:`ConfigError` saying so."""

from .client import BaseParameterClient, HttpClient, SocketClient

__all__ = ["BaseParameterClient", "HttpClient", "SocketClient"]
