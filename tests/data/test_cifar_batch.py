"""CIFAR-10 batch files: round trips of synthetic batches in every pickle protocol,
one-line UserErrors for malformed ones, and the restricted unpickler refusing code."""

import io
import os
import pickle
import struct

import numpy as np
import pytest

from mlptrain.data.cifar_batch import read_cifar_batch
from mlptrain.errors import UserError


def batch_dict(images, labels, *, text_keys=False):
    """The canonical batch dict (https://www.cs.toronto.edu/~kriz/cifar.html), written from the format description."""
    entries = {"batch_label": b"synthetic batch", "labels": [int(x) for x in labels], "data": images,
               "filenames": [f"image_{i}.png".encode() for i in range(len(labels))]}
    return {(key if text_keys else key.encode()): value for key, value in entries.items()}


def batch_bytes(rows, seed=0, protocol=4, **kwargs):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(rows, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=rows)
    return images, labels, pickle.dumps(batch_dict(images, labels, **kwargs), protocol=protocol)


def assert_one_line(error, *fragments):
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert str(fragment) in message, message


def _numpy1_names(data):
    return data.replace(b"numpy._core.", b"numpy.core.")  # protocol 2 names modules in plain text


class Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 wrote its str (BINSTRING), as in the canonical files,
    where Python 3's protocol 2 would write `_codecs.encode(text, "latin1")`."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_bytes_as_python2_str(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_bytes_as_python2_str


def _python2_bytes(images, labels):
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump(batch_dict(images, labels))
    return _numpy1_names(buffer.getvalue())


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("variant", ["python2", "protocol-2", "numpy1-names", "protocol-4", "protocol-5",
                                     "text-keys"])
def test_synthetic_batch_round_trip(tmp_path, rows, variant):
    protocol = {"protocol-2": 2, "numpy1-names": 2, "protocol-5": 5}.get(variant, 4)
    images, labels, data = batch_bytes(rows, protocol=protocol, text_keys=variant == "text-keys")
    if variant == "numpy1-names":
        data = _numpy1_names(data)
    elif variant == "python2":
        data = _python2_bytes(images, labels)
        assert b"_codecs" not in data and b"numpy.core.multiarray" in data
    path = tmp_path / "data_batch_1"
    path.write_bytes(data)
    out_images, out_labels = read_cifar_batch(path)
    assert out_images.dtype == np.uint8 and out_images.shape == (rows, 3072) and out_images.flags.c_contiguous
    assert out_labels.dtype == np.uint8 and out_labels.shape == (rows,)
    np.testing.assert_array_equal(out_images, images)
    np.testing.assert_array_equal(out_labels, labels)


def _dumps(obj):
    return pickle.dumps(obj, protocol=4)


IMAGES = np.zeros((4, 3072), np.uint8)
LABELS = [0, 1, 2, 9]
GOOD = _dumps(batch_dict(IMAGES, LABELS))

MALFORMED = {
    "empty": (b"", "corrupt or truncated pickle"),
    "truncated": (GOOD[: len(GOOD) // 2], "corrupt or truncated pickle"),
    "last-byte-cut": (GOOD[:-1], "corrupt or truncated pickle"),
    "not-a-pickle": (b"\x1f\x8b\x08 gzip, not pickle", "corrupt or truncated pickle"),
    "trailing-bytes": (GOOD + b"junk", "trailing bytes"),
    "not-a-dict": (_dumps([IMAGES, LABELS]), "expected a dict"),
    "no-labels": (_dumps({b"data": IMAGES}), "b'labels'"),
    "columns-3071": (_dumps(batch_dict(np.zeros((4, 3071), np.uint8), LABELS)), "(N, 3072)"),
    "4d-images": (_dumps(batch_dict(np.zeros((4, 3, 32, 32), np.uint8), LABELS)), "(N, 3072)"),
    "float-images": (_dumps(batch_dict(np.zeros((4, 3072), np.float32), LABELS)), "float32"),
    "bytes-images": (_dumps(batch_dict(IMAGES.tobytes(), LABELS)), "got bytes"),
    "zero-rows": (_dumps(batch_dict(np.zeros((0, 3072), np.uint8), [])), "no images"),
    "labels-short": (_dumps(batch_dict(IMAGES, LABELS[:3])), "must be 4 ints"),
    "label-10": (_dumps(batch_dict(IMAGES, [0, 1, 2, 10])), "0..9"),
    "label-negative": (_dumps(batch_dict(IMAGES, [0, -1, 2, 3])), "0..9"),
    "label-strings": (_dumps({b"data": IMAGES, b"labels": [b"cat"] * 4}), "must be 4 ints"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_malformed_batch(tmp_path, case):
    data, fragment = MALFORMED[case]
    path = tmp_path / "data_batch_3"
    path.write_bytes(data)
    with pytest.raises(UserError) as caught:
        read_cifar_batch(path)
    assert_one_line(caught, path, fragment)


def test_missing_batch_file(tmp_path):
    with pytest.raises(UserError) as caught:
        read_cifar_batch(tmp_path / "absent")
    assert_one_line(caught, tmp_path / "absent", "cannot read")


class CallsSystem:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class Evaluates:
    def __reduce__(self):
        return eval, ("1 + 1",)


def test_pickle_that_calls_os_system_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "data_batch_1"
    path.write_bytes(_dumps({b"data": CallsSystem(f"touch {marker}"), b"labels": [0]}))
    with pytest.raises(UserError) as caught:
        read_cifar_batch(path)
    assert_one_line(caught, path, "refused to unpickle", "system", "malicious")
    assert not marker.exists()


@pytest.mark.parametrize("payload", [Evaluates(), getattr, io.FileIO], ids=["eval", "getattr", "FileIO"])
def test_other_globals_are_refused(tmp_path, payload):
    path = tmp_path / "test_batch"
    path.write_bytes(_dumps({b"data": payload, b"labels": [0]}))
    with pytest.raises(UserError, match="refused to unpickle"):
        read_cifar_batch(path)


def test_codecs_encode_only_as_pickle_uses_it(tmp_path):
    # What protocol 2 writes for bytes, but asking for another codec.
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x05\x00\x00\x00rot13\x86R.")
    with pytest.raises(UserError, match=r"refused to unpickle _codecs\.encode with encoding 'rot13'"):
        read_cifar_batch(path)
