"""TLS with a per-fit certificate pinned by fingerprint: the parameter server, the ring and the
report server; plaintext and wrong-certificate peers refused; fits give the same results."""

import socket
import ssl
import threading
import time

import numpy as np
import pytest
from helpers import make_mlp, poke_listener, run_ranks, wait_until

from sparkdl_train import SparkModel, net, to_simple_rdd
from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce.local import ThreadGroup
from sparkdl_train.allreduce.transport import RingError, rendezvous
from sparkdl_train.config import EngineConfig
from sparkdl_train.net import tls
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState

SECRET = b"0123456789abcdef0123456789abcdef"
W = [np.zeros((50, 4), np.float32), np.zeros(4, np.float32)]


@pytest.fixture(scope="module")
def identity():
    return tls.new_identity()


def test_identity_is_a_fresh_self_signed_certificate_whose_key_stays_on_the_server(identity):
    other = tls.new_identity()
    assert identity.fingerprint != other.fingerprint and len(identity.fingerprint) == 64
    assert b"BEGIN CERTIFICATE" in identity.cert_pem and b"PRIVATE KEY" in identity.key_pem
    shipped = identity.for_clients()
    assert shipped.key_pem is None and shipped.fingerprint == identity.fingerprint
    assert "PRIVATE" not in repr(identity) and identity.fingerprint not in repr(identity)
    with pytest.raises(ValueError, match="needs the identity's key"):
        tls.wrap_server(socket.socket(), shipped, 1.0)


def test_auto_follows_sparks_own_encryption_and_authentication_settings():
    assert not tls.wanted("auto", {})
    assert not tls.wanted("auto", {"spark.network.crypto.enabled": "false"})
    for key in ("spark.network.crypto.enabled", "spark.ssl.enabled", "spark.ssl.rpc.enabled", "spark.authenticate"):
        assert tls.wanted("auto", {key: "true"}), key
        assert not tls.wanted("off", {key: "true"})
    assert tls.wanted("on", {})
    assert EngineConfig.resolve({"spark.sparkdl_train.network.tls": "on"}).core.tls == "on"
    assert EngineConfig().core.tls == "auto"
    with pytest.raises(Exception, match="tls"):
        EngineConfig(tls="sometimes")


# -- the parameter server -----------------------------------------------------------------

def serve(identity, **kw):
    return ParameterServer(ServerState(W, "asynchronous"), "127.0.0.1", SECRET, tls=identity, handshake_timeout=3.0, **kw).start()


def test_parameter_server_over_tls_moves_the_same_numbers(identity):
    server = serve(identity)
    try:
        with PSClient(*server.address, SECRET, worker=0, tls=identity.for_clients()) as client:
            assert isinstance(client._sock, ssl.SSLSocket) and client._sock.version() in ("TLSv1.2", "TLSv1.3")
            version, _ = client.pull()
            delta = [np.full_like(w, 0.5) for w in W]
            version, fresh = client.push(delta, version, 1)
            assert version == 1 and all(np.all(f == 0.5) for f in fresh)
            client.done()
    finally:
        server.stop()
    assert server.state.stats.rejected_connections == 0


def test_plaintext_client_is_refused_by_a_tls_server_within_the_handshake_timeout(identity):
    server = serve(identity)
    try:
        start = time.monotonic()
        with pytest.raises(ConnectionError):
            PSClient(*server.address, SECRET, worker=0, connect_timeout=5.0)  # no TLS
        assert time.monotonic() - start < 8
        wait_until(lambda: server.state.stats.rejected_connections == 1, 5)  # logged on the server's thread
    finally:
        server.stop()
    assert server.threads_alive() == 0


def test_client_refuses_a_server_with_another_certificate(identity):
    server = serve(tls.new_identity())  # e.g. someone else listening on the address
    try:
        with pytest.raises(net.TlsError, match="fingerprint mismatch"):
            PSClient(*server.address, SECRET, worker=0, tls=identity.for_clients(), connect_timeout=5.0)
    finally:
        server.stop()


def test_tls_client_fails_fast_against_a_plaintext_server(identity):
    server = serve(None)
    try:
        start = time.monotonic()
        with pytest.raises(net.TlsError, match="TLS handshake failed"):
            PSClient(*server.address, SECRET, worker=0, tls=identity.for_clients(), connect_timeout=5.0)
        assert time.monotonic() - start < 8
    finally:
        server.stop()


def test_tls_server_does_not_leak_the_key_or_data_in_clear(identity):
    """What crosses the wire is ciphertext: the delta's bytes do not appear in a capture."""
    captured = bytearray()
    server = serve(identity)
    lsock = socket.create_server(("127.0.0.1", 0))
    host, port = server.address

    def relay():  # a man in the middle that only records
        conn, _ = lsock.accept()
        up = socket.create_connection((host, port))

        def pump(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    captured.extend(data)
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        t = threading.Thread(target=pump, args=(up, conn), daemon=True)
        t.start()
        pump(conn, up)
        t.join(5)

    t = threading.Thread(target=relay, daemon=True)
    t.start()
    marker = np.frombuffer(b"SECRET-PAYLOAD-0123456789abcdef!" * 25, np.float32).reshape(50, 4).copy()
    try:
        with PSClient("127.0.0.1", lsock.getsockname()[1], SECRET, worker=0, tls=identity.for_clients()) as client:
            version, _ = client.pull()
            client.push([marker, np.zeros(4, np.float32)], version, 1)
            client.done()
        t.join(10)
    finally:
        server.stop()
        lsock.close()
    assert len(captured) > marker.nbytes
    assert b"SECRET-PAYLOAD" not in captured and SECRET not in captured


# -- the ring ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3, 5])
def test_tls_ring_allreduce_equals_the_plaintext_ring(identity, size):
    rng = np.random.default_rng(size)
    n = 200_003
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    results = {}
    for mode in (None, identity):
        groups = ThreadGroup.create(size)
        bufs = [d.copy() for d in data]

        def work(r, groups=groups, bufs=bufs, mode=mode):
            with rendezvous(groups[r], "127.0.0.1", SECRET, 10.0, 10.0, tls=mode) as link:
                assert isinstance(link.to_next, ssl.SSLSocket) == (mode is not None)
                ring.allreduce_sum(bufs[r], link, r, size, chunk_bytes=65536)
                return link.bytes_sent

        sent, errs = run_ranks(size, work)
        assert errs == [None] * size, errs
        results[mode is not None] = (bufs, sent)
    (plain, plain_sent), (secure, secure_sent) = results[False], results[True]
    for a, b in zip(plain, secure):
        np.testing.assert_array_equal(a, b)  # same schedule, same sums, bit for bit
    assert plain_sent == secure_sent  # payload bytes counted alike (TLS records add their own overhead)


def test_ring_rank_with_another_certificate_is_refused_without_hanging(identity):
    size = 3
    groups = ThreadGroup.create(size)
    ids = [identity, identity, tls.new_identity()]

    def work(r):
        with rendezvous(groups[r], "127.0.0.1", SECRET, 3.0, 3.0, tls=ids[r]):
            pass

    start = time.monotonic()
    _, errs = run_ranks(size, work, timeout=30)
    assert time.monotonic() - start < 12
    assert all(isinstance(e, (RingError, ConnectionError)) for e in errs if e is not None)
    assert any("not this fit's" in str(e) or "authentication failed" in str(e) for e in errs if e is not None), errs


def test_tls_ring_listener_drops_a_plaintext_stray(identity):
    groups = ThreadGroup.create(2)
    answers = poke_listener(groups, b"GET / HTTP/1.0\r\n\r\n")  # not a TLS ClientHello: rank 1 fails the handshake
    bufs = [np.full(10, r + 1.0, np.float32) for r in range(2)]

    def work(r):
        with rendezvous(groups[r], "127.0.0.1", SECRET, 10.0, 10.0, tls=identity) as link:
            ring.allreduce_sum(bufs[r], link, r, 2)

    _, errs = run_ranks(2, work)
    assert errs == [None, None], errs
    assert len(answers) == 1  # the stray did reach the listener (it may answer with a TLS alert)
    assert np.all(bufs[0] == 3.0) and np.all(bufs[1] == 3.0)


# -- whole fits --------------------------------------------------------------------------

def test_fits_with_tls_on_match_fits_without(sc, digits):
    """Synchronous PS rounds, the allreduce ring and live reports, with and without TLS."""
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:800], y[:800], 2)
    got = {}
    for setting in ("off", "on"):
        ps = SparkModel(make_mlp(), mode="synchronous", frequency="batch", num_workers=2, tls=setting)
        ps.fit(rdd, epochs=2, batch_size=64, shuffle=False, verbose=1)
        ar = SparkModel(make_mlp(), mode="allreduce", num_workers=2, tls=setting)
        ar.fit(rdd, epochs=2, batch_size=64, shuffle=False, verbose=0)
        got[setting] = (ps, ar)
    (ps_off, ar_off), (ps_on, ar_on) = got["off"], got["on"]
    assert (ps_off.stats.tls, ps_on.stats.tls, ar_on.stats.tls) == (False, True, True)
    assert ps_on.stats.reports > 0  # live progress reached the TLS report server
    for a, b in zip(ps_off.model.get_weights(), ps_on.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # within a fit, the ranks end bit-identical; across fits, equal to float rounding (a reused Python
    # worker's TensorFlow thread pool, sized by the first fit it served, sets oneDNN's summation order)
    assert all(len({i["weights_sha256"] for i in e.partitions.values()}) == 1 for e in ar_on.stats.epochs)
    for a, b in zip(ar_off.model.get_weights(), ar_on.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ps_on.stats.server["rejected_connections"] == 0
    assert [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-")] == []
