"""An .npz whose array headers declare more than the file holds (or than memory holds) is refused from the
headers alone, before np.load allocates anything; every reader of a user's .npz checks it."""

import io
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlptrain.errors import UserError
from mlptrain.util.npz_sizes import check_npz_sizes

DTYPES = ["|u1", "<i8", "<f4", "<f8", "<u2"]


def npy_header(shape: tuple, descr: str, data: bytes = b"") -> bytes:
    """An .npy member as np.save writes it (format 1.0), its header declaring `shape`, followed by `data`."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + data


def write_npz(path, members: dict[str, bytes], compress: bool = False) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 10**6), min_size=1, max_size=4).map(tuple), descr=st.sampled_from(DTYPES),
       held=st.integers(0, 64), compress=st.booleans())
def test_a_header_declaring_more_than_the_file_holds_is_refused(tmp_path, shape, descr, held, compress):
    declared = int(np.prod(shape)) * np.dtype(descr).itemsize
    if declared <= held:
        return  # the file holds it all: not this case
    write_npz(tmp_path / "x.npz", {"x_train": npy_header(shape, descr, b"\0" * held)}, compress)
    with pytest.raises(UserError, match=r"x\.npz: array 'x_train' declares shape .* the file holds "
                                        f"{held:,} bytes of it; the data set is damaged or truncated"):
        check_npz_sizes(tmp_path / "x.npz", "data set")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple), descr=st.sampled_from(DTYPES),
       compress=st.booleans())
def test_arrays_np_savez_writes_pass(tmp_path, shape, descr, compress):
    save = np.savez_compressed if compress else np.savez
    save(tmp_path / "ok.npz", a=np.zeros(shape, descr), names=np.array(["x", "yz"]))
    check_npz_sizes(tmp_path / "ok.npz")


def test_more_than_the_memory_available_is_refused(tmp_path, monkeypatch):
    import mlptrain.util.npz_sizes as sizes

    np.savez(tmp_path / "big.npz", x=np.zeros(1000, np.uint8))
    monkeypatch.setattr(sizes, "host_available", lambda: 100)
    with pytest.raises(UserError, match=r"big\.npz: its arrays take .* in memory and .* is available"):
        check_npz_sizes(tmp_path / "big.npz")


def test_what_is_no_zip_is_left_to_np_load(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 garbage")
    check_npz_sizes(tmp_path / "junk.npz")  # np.load's own refusal names the damage; nothing raised here
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(3))
    (tmp_path / "single.npz").write_bytes(buffer.getvalue())
    check_npz_sizes(tmp_path / "single.npz")


def bomb(tmp_path, names: list[str], big: str, name: str = "bomb.npz"):
    """An .npz holding `names` as small valid arrays, except `big`, whose header asks for 10**12 rows."""
    members = {}
    for key in names:
        buffer = io.BytesIO()
        np.save(buffer, np.zeros((2, 4), np.float32) if key != big else np.zeros(0))
        members[key] = npy_header((10**12, 4), "<f4", b"\0" * 32) if key == big else buffer.getvalue()
    write_npz(tmp_path / name, members)
    return tmp_path / name


def test_every_reader_checks_the_headers_first(tmp_path):
    from mlptrain.data.npz import load_npz
    from mlptrain.inference.image_files import read_images
    from mlptrain.probe.features import load_features
    from mlptrain.training.checkpoint import load_checkpoint

    readers = [
        (lambda p: load_npz(p), ["x_train", "y_train", "x_test", "y_test"], "x_train", "npz dataset"),
        (lambda p: read_images(p, (1, 2, 2)), ["images"], "images", "image file"),
        (lambda p: load_features(p), ["train_x", "train_y", "test_x", "test_y"], "train_x", "features file"),
        (lambda p: load_checkpoint(p), ["params/fc1.weight", "meta/epoch"], "params/fc1.weight", "checkpoint"),
    ]
    for read, names, big, what in readers:
        path = bomb(tmp_path, names, big)
        with pytest.raises(UserError, match=f"array '{big}' declares shape \\(1000000000000, 4\\) of float32 "
                                            f".* the {what} is damaged or truncated"):
            read(path)


@pytest.mark.parametrize("content", [b"hello", b"", None])
def test_a_member_that_is_no_npy_is_refused_by_every_reader(tmp_path, content):
    """np.load hands a member that does not start as an .npy back as bytes, not an array: every reader
    then failed on `.ndim` or `.dtype` (an AttributeError traceback). None: a zip folder entry."""
    from mlptrain.data.npz import load_npz
    from mlptrain.inference.image_files import read_images
    from mlptrain.probe.features import load_features
    from mlptrain.training.checkpoint import load_checkpoint

    readers = [
        (load_npz, ["x_train", "y_train", "x_test", "y_test"], "x_train", "npz dataset"),
        (lambda p: read_images(p, (1, 2, 2)), ["images"], "images", "image file"),
        (load_features, ["train_x", "train_y", "test_x", "test_y"], "train_x", "features file"),
        (load_checkpoint, ["params/fc1.weight", "meta/epoch"], "params/fc1.weight", "checkpoint"),
    ]
    for read, names, odd, what in readers:
        path = tmp_path / f"{what}.npz"
        with zipfile.ZipFile(path, "w") as archive:
            for name in names:
                buffer = io.BytesIO()
                np.save(buffer, np.zeros((2, 2, 2), np.uint8))
                if name != odd:
                    archive.writestr(f"{name}.npy", buffer.getvalue())
                elif content is None:
                    archive.writestr(f"{name}.npy/", b"")
                else:
                    archive.writestr(f"{name}.npy", content)
        with pytest.raises(UserError, match=f"member '{odd}.npy/?' is not a NumPy array .* the {what} is damaged"):
            read(path)
