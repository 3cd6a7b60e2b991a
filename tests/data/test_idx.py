"""IDX reader: round trips on crafted arrays, and one-line UserErrors for every malformed file."""

import gzip
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlptrain.data.idx import parse_idx, read_decompressed, read_idx
from mlptrain.errors import UserError


def idx_bytes(array, type_code=0x08):
    """IDX encoding of `array`, written from the format description (independent of the reader)."""
    header = struct.pack(">HBB", 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


SHAPES = [(0,), (1,), (7,), (3, 5), (4, 2, 3), (2, 1, 3, 2), (3, 0, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
def test_round_trip(tmp_path, rng, shape, compress):
    array = rng.integers(0, 256, size=shape, dtype=np.uint8)
    data = idx_bytes(array)
    path = tmp_path / ("a.idx.gz" if compress else "a.idx")
    path.write_bytes(gzip.compress(data) if compress else data)
    out = read_idx(path)
    assert out.dtype == np.uint8 and out.shape == shape and out.flags.c_contiguous
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("compress, name", [(False, "raw.gz"), (True, "gzipped-without-suffix")])
def test_compression_is_told_by_content_not_suffix(tmp_path, compress, name):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / name
    path.write_bytes(gzip.compress(idx_bytes(array)) if compress else idx_bytes(array))
    np.testing.assert_array_equal(read_idx(path), array)


def test_multi_member_gzip_reads_whole(tmp_path):
    data = idx_bytes(np.arange(100, dtype=np.uint8).reshape(10, 10))
    path = tmp_path / "two-members.gz"
    path.write_bytes(gzip.compress(data[:30]) + gzip.compress(data[30:]))
    np.testing.assert_array_equal(read_idx(path), np.arange(100).reshape(10, 10))


def test_result_is_read_only(tmp_path):
    path = tmp_path / "a.idx"
    path.write_bytes(idx_bytes(np.zeros((2, 2), np.uint8)))
    with pytest.raises(ValueError):
        read_idx(path)[0, 0] = 1


GOOD = idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5))
GOOD_GZ = gzip.compress(GOOD)


def _flip(data, index):
    return data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1:]


MALFORMED = {
    "empty": (b"", "shorter than the 4-byte header"),
    "short header": (b"\x00\x00", "shorter than the 4-byte header"),
    "bad magic": (b"\x12\x34" + GOOD[2:], "magic"),
    "float32 type": (GOOD[:2] + b"\x0d" + GOOD[3:], "0x0d"),
    "unknown type": (GOOD[:2] + b"\x42" + GOOD[3:], "0x42"),
    "zero dims": (b"\x00\x00\x08\x00", "0 dimensions"),
    "truncated dims": (GOOD[:10], "truncated IDX header"),
    "truncated payload": (GOOD[:-1], "truncated"),
    "trailing garbage": (GOOD + b"junk", "trailing bytes"),
    "huge dims": (struct.pack(">HBB3I", 0, 8, 3, 2**32 - 1, 2**32 - 1, 2**32 - 1), "truncated"),
    "gz truncated": (GOOD_GZ[:-12], "gzip"),
    "gz header only": (GOOD_GZ[:5], "gzip"),
    "gz corrupt deflate": (_flip(GOOD_GZ, 12), "gzip"),
    "gz bad crc": (_flip(GOOD_GZ, len(GOOD_GZ) - 6), "gzip"),
    "gz trailing garbage": (GOOD_GZ + b"garbage!", "gzip"),
    "gz of malformed idx": (gzip.compress(GOOD[:-3]), "truncated"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_malformed_raises_one_line_naming_file(tmp_path, case):
    data, fragment = MALFORMED[case]
    path = tmp_path / "broken-file.idx"
    path.write_bytes(data)
    # pytest.raises(UserError) alone also proves no struct.error, EOFError, zlib.error,
    # BadGzipFile or numpy error escaped: any of those would fail the test.
    with pytest.raises(UserError) as caught:
        read_idx(path)
    message = str(caught.value)
    assert str(path) in message and fragment in message and "\n" not in message


def test_missing_file_and_directory(tmp_path):
    for path in (tmp_path / "absent.idx", tmp_path):
        with pytest.raises(UserError, match=str(path)):
            read_idx(path)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_decode_or_raise_user_error(data):
    try:
        out = parse_idx(data, "fuzz.idx")
    except UserError as error:
        assert "fuzz.idx" in str(error)
    else:
        assert out.dtype == np.uint8 and out.size == len(data) - 4 - 4 * out.ndim


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(GOOD_GZ) - 1), st.integers(1, 255), st.integers(0, len(GOOD_GZ)))
def test_damaged_gzip_never_escapes_as_another_exception(tmp_path_factory, index, mask, keep):
    damaged = (GOOD_GZ[:index] + bytes([GOOD_GZ[index] ^ mask]) + GOOD_GZ[index + 1:])[:keep]
    path = tmp_path_factory.mktemp("fuzz") / "damaged.gz"
    path.write_bytes(damaged)
    try:
        data = read_decompressed(path)
    except UserError as error:
        assert str(path) in str(error) and "\n" not in str(error)
    else:  # a flip in the gzip header's flags or mtime can leave the content intact
        assert data == GOOD or not damaged.startswith(b"\x1f\x8b")
