"""network.ports (sparkdl_train/net/ports.py) and what a server says about where its peers are: the
range parsed and checked, every listener of a fit in it, a full range a clear error; the parameter
server's peers and its client's timeout naming the server and the setting."""

import socket
import threading

import numpy as np
import pytest

from sparkdl_train.config import EngineConfig
from sparkdl_train.errors import ConfigError
from sparkdl_train.net import ports
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState

W = [np.zeros((3, 4), np.float32), np.zeros(4, np.float32)]
SECRET = b"k" * 32


@pytest.mark.parametrize("text, want", [(None, None), ("", None), (" 40100-40199 ", (40100, 40199)), ("40100", (40100, 40100))])
def test_parse(text, want):
    assert ports.parse(text) == want


@pytest.mark.parametrize("text", ["40100:40199", "a-b", "0-10", "40199-40100", "1-70000"])
def test_parse_refuses_what_is_not_a_range(text):
    with pytest.raises(ConfigError, match="spark.sparkdl_train.network.ports"):
        ports.parse(text)


def test_the_setting_is_checked_with_the_others():
    assert EngineConfig.resolve({"spark.sparkdl_train.network.ports": "40100-40199"}).core.ports == "40100-40199"
    with pytest.raises(ConfigError, match="network.ports"):
        EngineConfig.resolve({"spark.sparkdl_train.network.ports": "401x"})
    with pytest.raises(ConfigError, match=r"ps.port=5000 is outside spark.sparkdl_train.network.ports=40100-40199"):
        EngineConfig.resolve({"spark.sparkdl_train.network.ports": "40100-40199", "spark.sparkdl_train.ps.port": "5000"})


def test_candidates_cover_the_range_once_from_a_random_start():
    import random

    got = ports.candidates((40100, 40109), random.Random(3))
    assert sorted(got) == list(range(40100, 40110))
    assert got == [40100 + (got[0] - 40100 + k) % 10 for k in range(10)]  # in order round the range
    assert len({tuple(ports.candidates((40100, 40109), random.Random(seed))) for seed in range(20)}) > 1  # random starts


def test_check_port_wants_an_explicit_port_inside_the_range():
    ports.check_port(0, (40100, 40199), "spark.sparkdl_train.ps.port")
    ports.check_port(40150, (40100, 40199), "spark.sparkdl_train.ps.port")
    ports.check_port(5000, None, "spark.sparkdl_train.ps.port")
    with pytest.raises(ConfigError, match=r"ps.port=5000 is outside spark.sparkdl_train.network.ports=40100-40199"):
        ports.check_port(5000, (40100, 40199), "spark.sparkdl_train.ps.port")


def test_listeners_take_the_free_ports_of_the_range_then_say_it_is_full():
    held = [ports.listener("127.0.0.1", (24401, 24403), "test") for _ in range(3)]
    try:
        assert sorted(s.getsockname()[1] for s in held) == [24401, 24402, 24403]
        with pytest.raises(ConfigError, match=r"the report server found no free port on 127.0.0.1 in .*24401-24403 \(all 3 in use\)"):
            ports.listener("127.0.0.1", (24401, 24403), "report server")
    finally:
        for s in held:
            s.close()


def test_the_parameter_server_binds_the_range_and_records_its_peers():
    srv = ParameterServer(ServerState(W, "asynchronous"), "127.0.0.1", SECRET, ports=(24411, 24412)).start()
    try:
        assert 24411 <= srv.port <= 24412
        with PSClient(*srv.address, SECRET, 0, timeout=10) as c:
            c.pull()
            c.done()
        assert srv.peers == {"127.0.0.1"}
    finally:
        srv.stop()


def test_a_silent_parameter_server_times_out_naming_itself_and_the_setting():
    """A server that accepts and authenticates but never answers (a host whose link died after the
    handshake, as far as the client can tell): the client's wait ends at its timeout, with a message
    that names the server's address and the setting behind the timeout."""
    from sparkdl_train import net

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        net.server_handshake(conn, SECRET, 5.0, {"version": 0})
        threading.Event().wait(5)  # then silence
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with PSClient("127.0.0.1", port, SECRET, 0, timeout=0.5) as c:
            with pytest.raises(TimeoutError, match=rf"parameter server at 127.0.0.1:{port} within 0.5 s \(spark.sparkdl_train.ps.roundTimeout"):
                c.pull()
    finally:
        listener.close()


def test_a_loopback_server_address_with_executors_on_other_hosts_fails_naming_the_setting(monkeypatch):
    """Servers the executors connect to must not listen on loopback when the executors run elsewhere: the
    fit fails before any training stage, naming the setting (not after each executor's connect timeout)."""
    from sparkdl_train.driver import executors
    from sparkdl_train.driver.engines import base

    cfg = EngineConfig.resolve(mode="asynchronous", ps_host="127.0.0.1")
    monkeypatch.setattr(executors, "executor_hosts", lambda sc: {"driver": "10.213.0.1", "0": "10.213.0.11", "1": "10.213.0.12"})
    with pytest.raises(ConfigError, match=r"listen on 127.0.0.1, a loopback address, but executors run on 10.213.0.11, "
                                          r"10.213.0.12: set spark.sparkdl_train.ps.host to an address"):
        base.server_host(cfg, object())
    monkeypatch.setattr(executors, "executor_hosts", lambda sc: {"driver": "127.0.0.1", "0": "127.0.0.1", "1": "localhost"})
    assert base.server_host(cfg, object()) == "127.0.0.1"  # every executor on this machine: loopback reaches them
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.254", 9))  # no packet: picks the source address of this machine's default route
            own = s.getsockname()[0]
        except OSError:  # no route: a machine with loopback only
            own = "127.0.0.1"
    monkeypatch.setattr(executors, "executor_hosts", lambda sc: {"0": own})
    assert base.server_host(cfg, object()) == "127.0.0.1"  # an executor at one of this machine's own addresses reaches it too
    cfg = EngineConfig.resolve(mode="asynchronous", ps_host="10.213.0.1")
    assert base.server_host(cfg, object()) == "10.213.0.1"
