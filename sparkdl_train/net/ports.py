"""Ports a firewall can allow: every listening socket sparkdl_train opens (the driver's parameter
server, report server and rendezvous server; the executors' ring listeners, XLA coordinators and
the Spark Connect reachability probe) binds a port in ``spark.sparkdl_train.network.ports``
(``LOW-HIGH``, both included) when it is set, else a port the system picks.

Pure: :func:`parse` reads the setting, :func:`bind` binds a socket to the first free port of the
range from a random start (two fits, or two ranks on one host, do not race for the same port).
"""

from __future__ import annotations

import errno
import random
import socket
from typing import Callable

from ..errors import ConfigError

SETTING = "spark.sparkdl_train.network.ports"

PortRange = tuple[int, int]  # (low, high), both included


def parse(text: str | None) -> PortRange | None:
    """``"40100-40199"`` -> ``(40100, 40199)``; ``None`` or empty: no range (any port)."""
    if text is None or not str(text).strip():
        return None
    low, sep, high = str(text).strip().partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ConfigError(f"{SETTING} must be LOW-HIGH (two port numbers, e.g. 40100-40199), got {text!r}") from None
    if not 1 <= lo <= hi <= 65535:
        raise ConfigError(f"{SETTING}: {text!r} is not a range of ports in [1, 65535] with LOW <= HIGH")
    return lo, hi


def check_port(port: int, ports: PortRange | None, setting: str) -> None:
    """A port set explicitly (``setting``, 0: any) must lie in the range when both are set."""
    if ports is not None and port and not ports[0] <= port <= ports[1]:
        raise ConfigError(f"{setting}={port} is outside {SETTING}={ports[0]}-{ports[1]}: a firewall that allows the range "
                          "would block it")


def candidates(ports: PortRange, rng: random.Random | None = None) -> list[int]:
    """Every port of the range once, from a random start, in order round the range."""
    lo, hi = ports
    n = hi - lo + 1
    start = (rng or random).randrange(n)
    return [lo + (start + k) % n for k in range(n)]


def bind(host: str, ports: PortRange | None, make: Callable[[tuple[str, int]], socket.socket], what: str) -> socket.socket:
    """``make((host, port))`` (which binds) for a port of ``ports``, the first free one from a random
    start; ``ports`` None: port 0. Raises ConfigError naming ``what`` and the range when none is free."""
    if ports is None:
        return make((host, 0))
    for port in candidates(ports):
        try:
            return make((host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    raise ConfigError(f"the {what} found no free port on {host} in {SETTING}={ports[0]}-{ports[1]} "
                      f"(all {ports[1] - ports[0] + 1} in use): widen the range")


def bound(host: str, ports: PortRange | None, what: str, backlog: int | None = None) -> socket.socket:
    """A TCP socket bound on ``host`` at a port of ``ports``, listening when ``backlog`` is given (else
    only holding the port, for a program that binds it itself: XLA's coordinator)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    def make(address: tuple[str, int]) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if backlog is not None:  # as socket.create_server: a port in TIME_WAIT is free
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            if backlog is not None:
                sock.listen(backlog)
        except OSError:
            sock.close()
            raise
        return sock

    return bind(host, ports, make, what)


def listener(host: str, ports: PortRange | None, what: str, backlog: int = 8) -> socket.socket:
    """A listening TCP socket on ``host`` at a port of ``ports``."""
    return bound(host, ports, what, backlog)
