"""A damaged .npz is refused in one line by every reader (npz datasets, `predict` inputs, features files,
checkpoints): whichever layer meets the damage (zip directory, compressed stream, CRC, .npy header) and
whatever it raises (zlib.error from `savez_compressed` data was a traceback in three of the readers)."""

import io
import random
import zipfile

import numpy as np
import pytest

from mlptrain.errors import UserError
from mlptrain.util.npz_archive import open_npz

LOCAL, CENTRAL = b"PK\x03\x04", b"PK\x01\x02"


def readers():
    from mlptrain.data.npz import load_npz
    from mlptrain.inference.image_files import read_images
    from mlptrain.probe.features import load_features
    from mlptrain.training.checkpoint import load_checkpoint

    return {"npz dataset": (load_npz, ["x_train", "y_train", "x_test", "y_test"]),
            "image file": (lambda p: read_images(p, (1, 2, 2)), ["images"]),
            "features file": (load_features, ["train_x", "train_y", "test_x", "test_y"]),
            "checkpoint": (load_checkpoint, ["params/fc1.weight", "meta/epoch"])}


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def archive(names, compression=zipfile.ZIP_STORED, member=None) -> bytearray:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as zipped:
        for name in names:
            zipped.writestr(f"{name}.npy", member if member is not None else npy(np.arange(600, dtype=np.float32)))
    return bytearray(buffer.getvalue())


def patch_headers(data: bytearray, local_offset: int, central_offset: int, value: int) -> bytearray:
    """Write the 2-byte `value` at a field of every local and central header (both say the same)."""
    for signature, offset in ((LOCAL, local_offset), (CENTRAL, central_offset)):
        start = data.find(signature)
        while start != -1:
            data[start + offset:start + offset + 2] = value.to_bytes(2, "little")
            start = data.find(signature, start + 4)
    return data


def flip_member_data(data: bytearray, names, at: int) -> bytearray:
    """XOR 32 bytes `at` bytes into each member's stored or compressed data."""
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as zipped:
        infos = zipped.infolist()
    for info in infos:
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + at
        data[start:start + 32] = bytes(b ^ 0xFF for b in data[start:start + 32])
    return data


DAMAGE = {  # each a different exception from zipfile, zlib or NumPy before the fix
    "deflate-stream": lambda names: flip_member_data(archive(names, zipfile.ZIP_DEFLATED), names, 10),  # zlib.error
    "crc": lambda names: flip_member_data(archive(names), names, 200),  # BadZipFile: Bad CRC-32
    "unknown-method": lambda names: patch_headers(archive(names), 8, 10, 99),  # NotImplementedError
    "encrypted": lambda names: patch_headers(archive(names), 6, 8, 1),  # RuntimeError: password required
    "npy-header": lambda names: archive(names, member=b"\x93NUMPY\x01\x00\x10\x00{'descr': (((((\n"),  # TokenError
    "truncated": lambda names: archive(names, zipfile.ZIP_DEFLATED)[:-40],  # BadZipFile
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_every_reader_refuses_each_kind_of_damage_in_one_line(tmp_path, damage):
    for what, (read, names) in readers().items():
        path = tmp_path / f"{what.replace(' ', '-')}.npz"
        path.write_bytes(bytes(DAMAGE[damage](names)))
        with pytest.raises(UserError) as caught:
            read(path)
        message = str(caught.value)
        assert str(path) in message and "\n" not in message and len(message) < 400, message
        assert f"not a readable {what}, damaged or truncated" in message, message


def test_a_savez_compressed_file_damaged_anywhere_is_read_or_refused(tmp_path):
    """Random flips and cuts of a compressed and a stored archive: what opens reads, the rest is refused."""
    rng = random.Random(36)
    arrays = {"a": np.arange(3000, dtype=np.float32).reshape(30, 100), "b": np.array("text"), "c": np.arange(10)}
    path, refused = tmp_path / "f.npz", 0
    for save in (np.savez_compressed, np.savez):
        buffer = io.BytesIO()
        save(buffer, **arrays)
        for _ in range(150):
            data = bytearray(buffer.getvalue())
            if rng.random() < 0.3:
                data = data[:rng.randrange(len(data))]
            else:
                for _ in range(rng.randint(1, 3)):
                    data[rng.randrange(len(data)) if rng.random() < 0.5 else rng.randrange(300)] = rng.randrange(256)
            path.write_bytes(bytes(data))
            try:
                with open_npz(path, "checkpoint") as npz:
                    [npz[name] for name in npz.files]
            except UserError as err:
                refused += 1
                assert "\n" not in str(err) and str(path) in str(err)
    assert refused > 200  # the damage was real


@pytest.mark.parametrize("content, fragment", [
    (b"", "not an .npz archive (an .npz is a zip file"),
    (npy(np.zeros(3)), "a single .npy array, not an .npz archive"),
    (None, "no such checkpoint"),
])
def test_what_is_no_npz_is_named(tmp_path, content, fragment):
    path = tmp_path / "c.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        with open_npz(path, "checkpoint"):
            pass


def test_a_damaged_checkpoint_has_no_origin_to_report(tmp_path):
    from mlptrain.inference.loading import checkpoint_origin

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.npz").write_bytes(bytes(DAMAGE["deflate-stream"](["meta/epoch"])))
    assert checkpoint_origin(tmp_path, "best") == {}
