"""Spark Connect: can the executors reach this client?

On a Spark Connect session the driver's servers (the parameter server, the live-report server) run
in the client's process, which the executors may not be able to reach (a laptop behind NAT, a
notebook service). :func:`check_reachable` finds out in seconds, before any training stage, and
:func:`unreachable_error` says what to do. The SparkContext stand-in the rest of the driver uses on
such a session is :class:`sparkdl_train.data.sessions.ConnectContext` (docs/connect.md).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import threading
from typing import Any, Callable

from ..data.sessions import ConnectContext, active_connect_session, context_of, is_connect, is_connect_session
from ..errors import ConfigError
from ..net import ports as port_range

__all__ = ["ConnectContext", "active_connect_session", "check_reachable", "client_address", "context_of", "is_connect",
           "is_connect_session", "unreachable_error"]

log = logging.getLogger(__name__)

NEEDS_NO_CONNECTION = ("model averaging (mode='synchronous', frequency='epoch')", "mode='allreduce'")


# -- can the executors reach this process? -------------------------------------------

def client_address(session: Any) -> str:
    """This process's address on the route to the Connect server: where its executors (near the
    server) are most likely to reach it. ``spark.sparkdl_train.ps.host`` overrides it."""
    host = getattr(getattr(session, "client", None), "host", None) or "127.0.0.1"
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # no packet is sent: this only picks the route's source address
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


_PROBE_TOKEN_BYTES = 16


def check_reachable(ctx: ConnectContext, host: str, timeout: float = 5.0,
                    listen: Callable[[tuple[str, int]], socket.socket] = socket.create_server,
                    ports: tuple[int, int] | None = None) -> str | None:
    """Whether an executor can open a connection to ``host`` (this process): ``None`` if one did,
    else why not. A listener on ``host`` (any free port; ``listen`` makes it) takes one connection
    that must present a random token; one task tries to connect within ``timeout`` seconds. Asked
    once per address."""
    if host in ctx.reachable:
        return ctx.reachable[host]
    import pyarrow as pa

    token = secrets.token_bytes(_PROBE_TOKEN_BYTES)
    got = threading.Event()
    try:
        listener = port_range.bind(host, ports, listen, "reachability probe")
    except OSError as exc:
        why = f"cannot listen on {host}: {exc}"
        ctx.reachable[host] = why
        return why
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set() and not got.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:  # closed, or not listening
                return
            with conn:
                conn.settimeout(timeout)
                data = b""
                try:
                    while len(data) < _PROBE_TOKEN_BYTES:
                        chunk = conn.recv(_PROBE_TOKEN_BYTES - len(data))
                        if not chunk:
                            break
                        data += chunk
                except OSError:
                    continue
                if hmac.compare_digest(data, token):
                    got.set()

    waiter = threading.Thread(target=accept, name="sparkdl_train-connect-probe", daemon=True)
    waiter.start()

    def probe(batches: Any) -> Any:
        import socket as _socket

        for _ in batches:
            pass
        try:
            with _socket.create_connection((host, port), timeout=timeout) as s:
                s.sendall(token)
            why = ""
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc}"
        yield pa.RecordBatch.from_pydict({"why": [why]})

    try:
        rows = ctx.session.range(0, 1, 1, 1).mapInArrow(probe, "why string").collect()
        why = rows[0]["why"] if rows else "the probe task returned nothing"
        if not why and not got.wait(timeout):
            why = "the connection carried no token"
    finally:
        stop.set()
        waiter.join(2)
        listener.close()
    result = None if not why else f"an executor could not connect to {host}:{port} within {timeout:g} s ({why})"
    ctx.reachable[host] = result
    log.info("connect: executors %s this client at %s", "reach" if result is None else "cannot reach", host)
    return result


def unreachable_error(mode: str, host: str, why: str) -> ConfigError:
    return ConfigError(
        f"mode={mode!r} runs its parameter server in this Spark Connect client, and {why}. Executors must reach "
        f"the client's address {host}: set spark.sparkdl_train.ps.host (ps_host=...) to an address of this machine they can reach "
        f"(and open its ports), or train with a mode that needs no connection back to the client: "
        f"{', '.join(NEEDS_NO_CONNECTION)}"
    )

