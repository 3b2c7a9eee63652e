"""``elephas.parameter.client`` (see the package's docstring): the client classes with Elephas' names,
constructor and factory; no network traffic."""

from __future__ import annotations

import abc
import os
import socket
from typing import Any

from ...errors import ConfigError

__all__ = ["BaseParameterClient", "HttpClient", "SocketClient"]

_NOT_HERE = ("sparkdl_train has no Elephas {kind} parameter server to {what}: its parameter server runs inside each "
             "fit (SparkModel / AsynchronousSparkModel .fit) with an authenticated binary protocol, and Elephas' "
             "{kind} protocol sends pickles, which sparkdl_train never loads from the network. Read the trained "
             "weights from spark_model.master_network.get_weights() after fit.")


def determine_master(port: int = 4000) -> str:
    """Elephas' ``host:port`` of the driver: ``SPARK_LOCAL_IP``, else this host's address."""
    host = os.environ.get("SPARK_LOCAL_IP") or socket.gethostbyname(socket.gethostname())
    return f"{host}:{port}"


class BaseParameterClient(abc.ABC):
    """Elephas' client base: ``get_client(client_type, port)`` picks the subclass by ``client_type``."""

    client_type = "base"

    @classmethod
    def get_client(cls, client_type: str, port: int = 4000) -> "BaseParameterClient":
        for sub in cls.__subclasses__():
            if sub.client_type == client_type:
                return sub(port)
        raise ValueError(f"Parameter server mode has to be either `http` or `socket`, got {client_type}")

    def __init__(self, port: int = 4000):
        self.port = port
        self.master_url = determine_master(port)

    def update_parameters(self, delta: list[Any]) -> Any:
        raise ConfigError(_NOT_HERE.format(kind=self.client_type, what="send updates to"))

    def get_parameters(self) -> Any:
        raise ConfigError(_NOT_HERE.format(kind=self.client_type, what="read parameters from"))


class HttpClient(BaseParameterClient):
    client_type = "http"

    def __init__(self, port: int = 4000):
        super().__init__(port)
        self.headers = {"Content-Type": "application/elephas"}


class SocketClient(BaseParameterClient):
    client_type = "socket"
