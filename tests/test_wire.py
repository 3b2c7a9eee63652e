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
