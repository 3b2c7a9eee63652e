import numpy as np
import pytest

from sparkdl_train import wire


def test_roundtrip_keeps_dtypes_shapes_and_values():
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(7, dtype=np.int64),  # 0-d (optimizer step counter)
        np.zeros((0, 5), dtype=np.float16),
        np.array([True, False]),
        np.arange(6, dtype=np.uint8)[::2],  # non-contiguous
    ]
    meta, out = wire.decode(wire.encode({"k": [1, "a"]}, arrays))
    assert meta == {"k": [1, "a"]}
    assert len(out) == len(arrays)
    for a, b in zip(arrays, out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_decode_views_are_read_only_unless_copied():
    blob = wire.encode({}, [np.ones(3)])
    _, (view,) = wire.decode(blob)
    assert not view.flags.writeable
    _, (copy,) = wire.decode(blob, copy=True)
    copy[0] = 5
    assert copy.flags.writeable


@pytest.mark.parametrize("cut", [0, 3, 8, 20, -1])
def test_truncated_messages_are_rejected(cut):
    blob = wire.encode({"x": 1}, [np.arange(10.0)])
    with pytest.raises(wire.FrameError):
        wire.decode(blob[:cut])


def test_bad_magic_version_trailing_and_object_dtype():
    blob = bytearray(wire.encode({}, [np.arange(3)]))
    with pytest.raises(wire.FrameError, match="magic"):
        wire.decode(b"XXXX" + bytes(blob[4:]))
    bad_version = bytearray(blob)
    bad_version[4] = 99
    with pytest.raises(wire.FrameError, match="version"):
        wire.decode(bytes(bad_version))
    with pytest.raises(wire.FrameError, match="trailing"):
        wire.decode(bytes(blob) + b"\x00")
    with pytest.raises(wire.FrameError, match="not allowed"):
        wire.encode({}, [np.array(["a"], dtype=object)])


def test_forged_descriptor_cannot_read_past_buffer():
    import json
    import struct

    header = json.dumps({"meta": {}, "arrays": [{"dtype": "<f8", "shape": [10**6], "nbytes": 8 * 10**6}]}).encode()
    blob = struct.pack("<4sBI", b"SDLT", 1, len(header)) + header + b"\x00" * 16
    with pytest.raises(wire.FrameError, match="truncated"):
        wire.decode(blob)
    header = json.dumps({"meta": {}, "arrays": [{"dtype": "<f8", "shape": [2], "nbytes": 8}]}).encode()
    with pytest.raises(wire.FrameError, match="does not match"):
        wire.decode(struct.pack("<4sBI", b"SDLT", 1, len(header)) + header + b"\x00" * 8)
    header = json.dumps({"meta": {}, "arrays": [{"dtype": "|O", "shape": [1], "nbytes": 8}]}).encode()
    with pytest.raises(wire.FrameError, match="not allowed"):
        wire.decode(struct.pack("<4sBI", b"SDLT", 1, len(header)) + header + b"\x00" * 8)


class _RecordingSocket:
    def __init__(self):
        self.sends = []

    def sendall(self, data):
        self.sends.append(bytes(data))


def test_a_frame_joins_its_small_parts_and_sends_large_arrays_from_their_memory():
    """Small parts (header, biases) travel joined, one send per run of them: sent one by one with
    TCP_NODELAY, each was a segment and a wake-up of the reader. The bytes are the same frame."""
    from sparkdl_train import net
    from sparkdl_train.net import framing

    arrays = [np.ones(3, np.float32), np.arange(40000, dtype=np.float32), np.zeros(2, np.int64), np.full(5, 7.0),
              np.arange(30000, dtype=np.float64)]
    sock = _RecordingSocket()
    n = framing.send(sock, net.Msg.PUSH, {"base_version": 3}, arrays)
    # header + first bias | large | two small | large
    assert [len(s) for s in sock.sends][1::2] == [160000, 240000] and len(sock.sends) == 4
    frame = b"".join(sock.sends)
    assert len(frame) == n
    meta, got = wire.decode(frame[framing.HEADER.size:])
    assert meta == {"base_version": 3}
    for a, b in zip(arrays, got):
        np.testing.assert_array_equal(a, b)
