"""MNIST loader on the real files: shapes, statistics, corrupt copies, raw copies, download path."""

import dataclasses
import functools
import gzip
import io
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest

from mlptrain.data import ImageDataset, default_data_root, load_dataset
from mlptrain.data import mnist as mnist_module
from mlptrain.data.download import md5sum
from mlptrain.data.mnist import load_mnist
from mlptrain.errors import UserError

# Published class counts of the canonical split.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
class Response(io.BytesIO):
    """Enough of urlopen's response for fetch(): read(n), headers, a context manager."""

    headers = {}


NAMES = [f.name for f in mnist_module.FILES.values()]


@functools.cache
def reference(root):
    """The real dataset, loaded once per session (every test below compares against it)."""
    return load_mnist(root)


def copy_mnist(data_dir, tmp_path):
    shutil.copytree(data_dir / "mnist", tmp_path / "mnist")
    for path in (tmp_path / "mnist").iterdir():
        path.chmod(0o644)  # the shared copies are read-only
    return tmp_path / "mnist"


def test_real_mnist(data_dir):
    ds = reference(data_dir)
    assert isinstance(ds, ImageDataset) and ds.name == "mnist"
    assert ds.image_shape == (1, 28, 28) and ds.num_classes == 10 and ds.num_features == 784
    for images, labels, counts in ((ds.train_images, ds.train_labels, TRAIN_COUNTS),
                                   (ds.test_images, ds.test_labels, TEST_COUNTS)):
        assert images.dtype == np.uint8 and labels.dtype == np.uint8
        assert images.shape == (len(labels), 784) and images.flags.c_contiguous
        assert np.bincount(labels, minlength=10).tolist() == counts
    assert ds.train_images.shape[0] == 60000 and ds.test_images.shape[0] == 10000
    assert ds.train_labels[:5].tolist() == [5, 0, 4, 1, 9] and ds.test_labels[0] == 7
    pixels = ds.train_images / 255.0
    assert pixels.mean() == pytest.approx(ds.mean, abs=1e-4)
    assert pixels.std() == pytest.approx(ds.std, abs=1e-4)


def test_load_dataset_registry_and_env(data_dir, monkeypatch):
    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    ds = load_dataset("mnist", None)
    np.testing.assert_array_equal(ds.test_images, reference(data_dir).test_images)
    with pytest.raises(UserError, match="unknown dataset 'cifar100'; valid: cifar10, mnist"):
        load_dataset("cifar100", None)


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(tmp_path / "data"))
    assert default_data_root() == tmp_path / "data"
    monkeypatch.delenv("MLPTRAIN_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_data_root() == tmp_path / "cache" / "mlptrain"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_root() == tmp_path / ".cache" / "mlptrain"


def test_raw_copy_loads_identically(data_dir, tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in NAMES:
        (folder / name).write_bytes(gzip.decompress((data_dir / "mnist" / f"{name}.gz").read_bytes()))
    ds, ref = load_mnist(tmp_path), reference(data_dir)
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(ds, field), getattr(ref, field))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_compressed(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def _flip_pixel_regzip(path):
    # A valid gzip of valid IDX whose content differs by one pixel: only the md5 can tell.
    data = bytearray(gzip.decompress(path.read_bytes()))
    data[-1] ^= 0x01
    path.write_bytes(gzip.compress(bytes(data), compresslevel=1))


def _empty(path):
    path.write_bytes(b"")


@pytest.mark.parametrize("damage, name", [
    (_truncate, "train-images-idx3-ubyte.gz"),
    (_flip_compressed, "train-labels-idx1-ubyte.gz"),
    (_flip_pixel_regzip, "t10k-images-idx3-ubyte.gz"),
    (_empty, "t10k-labels-idx1-ubyte.gz"),
], ids=["truncated", "flipped-byte", "changed-pixel", "empty"])
def test_corrupt_copy(data_dir, tmp_path, damage, name):
    folder = copy_mnist(data_dir, tmp_path)
    damage(folder / name)
    with pytest.raises(UserError) as caught:
        load_mnist(tmp_path)
    message = str(caught.value)
    assert str(folder / name) in message and "delete it" in message and "\n" not in message


def test_download_fills_missing_files(data_dir, tmp_path, monkeypatch):
    # The shared .gz files were re-compressed, so accept their md5s in place of the canonical ones.
    for key, file in mnist_module.FILES.items():
        shared_md5 = md5sum(data_dir / "mnist" / f"{file.name}.gz")
        monkeypatch.setitem(mnist_module.FILES, key, dataclasses.replace(file, gz_md5=shared_md5))
    requested = []

    def urlopen(url, timeout=None):
        requested.append(url)
        if url.startswith(mnist_module.MIRRORS[0]):
            raise urllib.error.URLError("first mirror down")
        return Response((data_dir / "mnist" / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    folder = copy_mnist(data_dir, tmp_path)
    (folder / "t10k-images-idx3-ubyte.gz").unlink()
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    ds = load_mnist(tmp_path)
    assert requested == [mirror + name for name in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")
                         for mirror in mnist_module.MIRRORS]
    np.testing.assert_array_equal(ds.test_images, reference(data_dir).test_images)
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{name}.gz" for name in NAMES)
