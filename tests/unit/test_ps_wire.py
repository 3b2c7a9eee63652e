"""The parameter server's half-width wire (``ps.compression``) without Spark: the rounding, a
client and server over a socket (state in float32, replies rounded, bytes halved), malformed frames."""

import numpy as np
import pytest

from sparkdl_train.halfwidth import from_bf16, to_bf16
from sparkdl_train.net.framing import ProtocolError
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.narrow import narrow, widen
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState, SparseRows

SECRET = b"w" * 32


def rounded(a, wire):
    """``a`` as a worker holds it after the wire: float16's or bfloat16's nearest value."""
    a = np.asarray(a, np.float32)
    if wire == "fp16":
        return a.astype(np.float16).astype(np.float32)
    flat = a.reshape(-1)
    return from_bf16(to_bf16(flat, np.empty(flat.size, np.uint16)), np.empty(flat.size, np.float32)).reshape(a.shape)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_narrow_then_widen_is_the_nearest_half_width_value_and_ids_pass_untouched(wire):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((7, 5)) * 10.0 ** rng.integers(-4, 3, (7, 5))).astype(np.float32)
    got = widen(narrow(a, wire), wire, "a")
    assert got.dtype == np.float32 and got.shape == a.shape
    np.testing.assert_array_equal(got, rounded(a, wire))
    assert narrow(a, wire).nbytes == a.nbytes // 2
    ids = np.arange(5, dtype=np.int32)
    assert narrow(ids, wire) is ids
    with pytest.raises(ProtocolError, match=f"the rows arrived as float32 on a '{wire}' wire"):
        widen(a, wire, "the rows")


def _server(weights, sparse=(), mode="asynchronous"):
    return ParameterServer(ServerState(weights, mode, sparse=list(sparse)), "127.0.0.1", SECRET).start()


@pytest.mark.parametrize("mode", ["asynchronous", "hogwild"])
def test_every_reply_narrows_the_weights_of_its_own_version(mode):
    """A version's dense arrays are narrowed once and reused by its replies; hogwild's one snapshot
    changes in place, and no reply gets an earlier version's narrowed copy."""
    dense = np.zeros(64, np.float32)
    srv = _server([dense], mode=mode)
    try:
        with PSClient(*srv.address, SECRET, 0, timeout=10, wire="bf16") as c:
            v, got = c.pull()
            v, again = c.pull()
            np.testing.assert_array_equal(got[0], again[0])
            expect = np.zeros(64, np.float32)
            for k in range(1, 4):
                step = np.full(64, 0.25 * k, np.float32)
                v, got = c.push([step], v, 8)
                expect += rounded(step, "bf16")
                np.testing.assert_array_equal(got[0], rounded(expect, "bf16"))
                v, pulled = c.pull()
                np.testing.assert_array_equal(pulled[0], rounded(expect, "bf16"))
            c.done()
        np.testing.assert_array_equal(srv.state.snapshot()[0], expect)
    finally:
        srv.stop()


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_a_push_on_a_half_width_wire_adds_its_rounded_delta_in_float32_and_the_reply_is_rounded(wire):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((1000, 8)).astype(np.float32)
    dense = rng.standard_normal(300).astype(np.float32) + 1000.0  # large values: fp16 rounds them to 1/2
    srv = _server([table, dense], sparse=[0])
    try:
        with PSClient(*srv.address, SECRET, 0, timeout=10, wire=wire) as c:
            v, got = c.pull({0: np.array([3, 1, 999], np.int32)})
            np.testing.assert_array_equal(got[0], rounded(table[[3, 1, 999]], wire))
            np.testing.assert_array_equal(got[1], rounded(dense, wire))
            ids = np.array([1, 5, 700], np.int32)
            rows = (rng.standard_normal((3, 8)) * 1e-3).astype(np.float32)
            step = (rng.standard_normal(300) * 1e-3).astype(np.float32)
            v, got = c.push([SparseRows(ids, rows), step], v, 64, {0: ids})
            c.done()
        state = srv.state.snapshot()
        expect_table = table.copy()
        expect_table[ids] += rounded(rows, wire)  # the server adds the rounded delta in float32
        np.testing.assert_array_equal(state[0], expect_table)
        np.testing.assert_array_equal(state[1], dense + rounded(step, wire))
        np.testing.assert_array_equal(got[0], rounded(expect_table[ids], wire))
        np.testing.assert_array_equal(got[1], rounded(dense + rounded(step, wire), wire))
        assert state[0].dtype == state[1].dtype == np.float32
    finally:
        srv.stop()


def _bytes(wire):
    weights = [np.zeros((20_000, 8), np.float32), np.zeros(50_000, np.float32)]
    srv = _server(weights, sparse=[0])
    try:
        with PSClient(*srv.address, SECRET, 0, timeout=10, wire=wire) as c:
            ids = np.arange(0, 20_000, 4, dtype=np.int32)
            v, _ = c.pull({0: ids})
            for _ in range(3):
                v, _ = c.push([SparseRows(ids, np.full((len(ids), 8), 1e-3, np.float32)), np.full(50_000, 1e-3, np.float32)],
                              v, 8, {0: ids})
            c.done()
            return c.bytes_sent, c.bytes_received, srv.state.stats.as_dict()
    finally:
        srv.stop()


def test_the_half_width_wire_moves_half_the_value_bytes_each_way():
    sent32, received32, _ = _bytes(None)
    for wire in ("fp16", "bf16"):
        sent, received, stats = _bytes(wire)
        values_sent32 = 3 * (5_000 * 8 + 50_000) * 4  # the pushes' rows and dense deltas; ids travel as they are
        assert sent == pytest.approx(sent32 - values_sent32 / 2, abs=1024), wire
        assert received == pytest.approx(received32 / 2, rel=0.001), wire  # every reply is values
        assert stats["bytes_in"] == sent and 0 <= stats["bytes_out"] - received < 256  # the server counts its ACK too


def test_a_bf16_push_that_sends_float32_is_refused_and_the_server_keeps_serving():
    srv = _server([np.zeros(10, np.float32)])
    try:
        with PSClient(*srv.address, SECRET, 0, timeout=10) as bad:  # claims bf16 but sends float32
            bad.wire = None
            from sparkdl_train import net
            from sparkdl_train.ps import protocol as P

            net.send(bad._sock, net.Msg.PUSH, P.push_meta(0, 1, [], [], "bf16"), [np.ones(10, np.float32)])
            with pytest.raises((ConnectionError, OSError)):
                bad._call(net.Msg.PULL, {"want": []})
        with PSClient(*srv.address, SECRET, 1, timeout=10, wire="bf16") as good:
            v, got = good.pull()
            assert v == 0 and got[0].dtype == np.float32
            good.done()
        assert srv.state.version == 0  # the bad push changed nothing
    finally:
        srv.stop()
