"""MNIST, Fashion-MNIST, KMNIST: the real MNIST files, synthetic IDX files in the same layout
(the published md5s of Fashion-MNIST and KMNIST then replaced by those of the synthetic files),
corrupt, truncated, re-compressed and raw copies, downloads and the offline message."""

import dataclasses
import functools
import gzip
import hashlib
import shutil

import numpy as np
import pytest

from mlptrain.data import ImageDataset, dataset_record, default_data_root, load_dataset
from mlptrain.data.mnist_family import load_mnist_family
from mlptrain.data.registry import BUILTIN, MNIST_FAMILY_NAMES, DataFile
from mlptrain.errors import UserError
from tests.data.test_idx import idx_bytes

# Published class counts of the canonical split.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
GZ_NAMES = [f"{name}.gz" for name in MNIST_FAMILY_NAMES]
MNIST = BUILTIN["mnist"]


@functools.cache
def reference(root):
    """The real dataset, loaded once per session (several tests compare against it)."""
    return load_dataset("mnist", root)


def copy_mnist(data_dir, tmp_path):
    shutil.copytree(data_dir / "mnist", tmp_path / "mnist")
    for path in (tmp_path / "mnist").iterdir():
        path.chmod(0o644)  # the shared copies are read-only
    return tmp_path / "mnist"


# --- the real MNIST --------------------------------------------------------------------

def test_real_mnist(data_dir):
    ds = reference(data_dir)
    assert isinstance(ds, ImageDataset) and ds.name == "mnist"
    assert ds.image_shape == (1, 28, 28) and ds.num_classes == 10 and ds.num_features == 784
    assert ds.class_names == tuple("0123456789") and ds.value_scale == 255.0 and not ds.has_val_split
    for images, labels, counts in ((ds.train_images, ds.train_labels, TRAIN_COUNTS),
                                   (ds.test_images, ds.test_labels, TEST_COUNTS)):
        assert images.dtype == np.uint8 and labels.dtype == np.uint8
        assert images.shape == (len(labels), 784) and images.flags.c_contiguous
        assert np.bincount(labels, minlength=10).tolist() == counts
    assert ds.train_labels[:5].tolist() == [5, 0, 4, 1, 9] and ds.test_labels[0] == 7
    # computed from the training images, and close to the constants everyone uses
    pixels = ds.train_images / 255.0
    assert ds.mean == pytest.approx(pixels.mean(), rel=1e-12) and ds.std == pytest.approx(pixels.std(), rel=1e-9)
    assert ds.mean == pytest.approx(0.1307, abs=1e-4) and ds.std == pytest.approx(0.3081, abs=1e-4)


def test_real_mnist_record_names_the_published_content(data_dir):
    ds = reference(data_dir)
    # the shared .gz files are re-compressed: what is recorded is the md5 of their content
    assert dict(ds.provenance.checksums) == {f.name: f.content_md5 for f in (*MNIST.train, *MNIST.test)}
    record = dataset_record(ds, 5000)
    assert record == {"name": "mnist", "location": str(data_dir / "mnist"), "shape": [1, 28, 28],
                      "dtype": "uint8", "classes": 10, "train": 55000, "val": 5000, "test": 10000,
                      "subset": False, "files": 4, "checksum": record["checksum"],
                      "inputs": {"mean": ds.mean, "std": ds.std, "value_scale": 255.0,
                                 "class_names": [str(k) for k in range(10)]}}
    assert len(record["checksum"]) == 32


def test_load_dataset_registry_and_env(data_dir, monkeypatch):
    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(data_dir))
    ds = load_dataset("mnist", None)
    np.testing.assert_array_equal(ds.test_images, reference(data_dir).test_images)
    with pytest.raises(UserError, match="unknown dataset 'svhn'; valid: mnist, fashion_mnist, kmnist, cifar10, "
                                        "cifar100, npz, folder"):
        load_dataset("svhn", None)


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
    for name in MNIST_FAMILY_NAMES:
        (folder / name).write_bytes(gzip.decompress((data_dir / "mnist" / f"{name}.gz").read_bytes()))
    ds, ref = load_dataset("mnist", tmp_path), reference(data_dir)
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(ds, field), getattr(ref, field))
    assert ds.provenance.checksums == ref.provenance.checksums


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
        load_dataset("mnist", tmp_path)
    message = str(caught.value)
    assert str(folder / name) in message and "delete it" in message and "\n" not in message


def test_download_fills_missing_files(data_dir, tmp_path, monkeypatch, http_folder):
    served, url = http_folder
    # the first mirror answers 404; the second serves the shared (re-compressed) files, whose md5s
    # stand in for the published ones
    for name in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        shutil.copyfile(data_dir / "mnist" / name, served / name)
    spec = dataclasses.replace(MNIST, mirrors=(url + "down/", url), **{
        split: tuple(dataclasses.replace(f, md5=hashlib.md5((data_dir / "mnist" / f"{f.name}.gz").read_bytes())
                                         .hexdigest()) for f in getattr(MNIST, split))
        for split in ("train", "test")})
    folder = copy_mnist(data_dir, tmp_path)
    (folder / "t10k-images-idx3-ubyte.gz").unlink()
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    ds = load_mnist_family(spec, tmp_path)
    np.testing.assert_array_equal(ds.test_images, reference(data_dir).test_images)
    assert sorted(p.name for p in folder.iterdir()) == sorted(GZ_NAMES)  # no temporary files left


def test_offline_message_names_files_urls_folder_and_env(tmp_path, offline):
    with pytest.raises(UserError) as caught:
        load_dataset("mnist", tmp_path)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("MNIST could not be downloaded (could not download train-images-idx3-ubyte.gz: "
                               "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz: "
                               "network is unreachable; http://yann.lecun.com/exdb/mnist/")
    assert lines[1] == f"put these files into {tmp_path / 'mnist'}:"
    assert lines[2:6] == [f"  {name}  from https://ossci-datasets.s3.amazonaws.com/mnist/{name}" for name in GZ_NAMES]
    assert lines[6] == "or set MLPTRAIN_DATA_DIR (or data.root) to a folder that holds mnist/"
    assert offline == [m + "train-images-idx3-ubyte.gz" for m in MNIST.mirrors]  # stops at the first failure
    assert not (tmp_path / "mnist").exists()  # the folder made for the download is gone again


def test_offline_lists_only_files_still_missing(tmp_path, offline, data_dir):
    (tmp_path / "mnist").mkdir()
    for name in GZ_NAMES[:2]:
        shutil.copyfile(data_dir / "mnist" / name, tmp_path / "mnist" / name)
    with pytest.raises(UserError) as caught:
        load_dataset("mnist", tmp_path)
    message = str(caught.value)
    assert all(f"  {name}  from" in message for name in GZ_NAMES[2:])
    assert not any(f"  {name}  from" in message for name in GZ_NAMES[:2])


def test_unwritable_root(tmp_path, offline):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match="cannot create .*a-file/mnist for the download.*MLPTRAIN_DATA_DIR"):
        load_dataset("mnist", tmp_path / "a-file")
    assert offline == []


# --- Fashion-MNIST and KMNIST on synthetic files ----------------------------------------

def synthetic_files(folder, rng, train=12, test=5, classes=10):
    """Four gzip IDX files of random 28x28 images in `folder`; returns (arrays, {name: gz md5})."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = [rng.integers(0, 256, (train, 28, 28), dtype=np.uint8), rng.integers(0, classes, train, dtype=np.uint8),
              rng.integers(0, 256, (test, 28, 28), dtype=np.uint8), rng.integers(0, classes, test, dtype=np.uint8)]
    md5s = {}
    for name, array in zip(MNIST_FAMILY_NAMES, arrays):
        data = gzip.compress(idx_bytes(array), mtime=0)
        (folder / f"{name}.gz").write_bytes(data)
        md5s[name] = hashlib.md5(data).hexdigest()
    return arrays, md5s


def with_md5s(spec, md5s, mirrors=None):
    """`spec` with `md5s` standing in for its published ones (and other mirrors, if given)."""
    def files(split):
        return tuple(DataFile(f.name, md5s[f.name]) for f in getattr(spec, split))
    return dataclasses.replace(spec, train=files("train"), test=files("test"), mirrors=mirrors or spec.mirrors)


@pytest.mark.parametrize("name", ["fashion_mnist", "kmnist"])
def test_synthetic_files_load(tmp_path, rng, name):
    arrays, md5s = synthetic_files(tmp_path / name, rng)
    ds = load_mnist_family(with_md5s(BUILTIN[name], md5s), tmp_path)
    assert ds.name == name and ds.image_shape == (1, 28, 28) and ds.class_names == BUILTIN[name].label_sets[0].class_names
    np.testing.assert_array_equal(ds.train_images, arrays[0].reshape(12, 784))
    np.testing.assert_array_equal(ds.train_labels, arrays[1])
    np.testing.assert_array_equal(ds.test_images, arrays[2].reshape(5, 784))
    assert ds.mean == pytest.approx(arrays[0].mean() / 255) and ds.std == pytest.approx(arrays[0].std() / 255)


def test_fashion_class_names():
    assert BUILTIN["fashion_mnist"].label_sets[0].class_names[0] == "T-shirt/top"
    assert BUILTIN["kmnist"].label_sets[0].class_names == ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")


def test_a_recompressed_copy_without_a_content_md5_is_read_for_its_structure_with_a_note(tmp_path, rng):
    arrays, md5s = synthetic_files(tmp_path / "kmnist", rng)
    path = tmp_path / "kmnist" / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), compresslevel=1, mtime=1))
    ds = load_mnist_family(with_md5s(BUILTIN["kmnist"], md5s), tmp_path)
    np.testing.assert_array_equal(ds.test_images, arrays[2].reshape(5, 784))  # the good data, read
    note = ds.provenance.read_note
    assert note.startswith("Kuzushiji-MNIST: 1 file could not be verified by checksum") and str(path) in note
    assert "delete" not in note and "\n" not in note
    again = load_mnist_family(with_md5s(BUILTIN["kmnist"], md5s), tmp_path)  # from the decoded-data cache
    assert again.provenance.read_note == note and again.provenance.cache_note is None


def test_an_uncompressed_copy_without_a_content_md5_is_read_for_its_structure(tmp_path, rng):
    arrays, md5s = synthetic_files(tmp_path / "fashion_mnist", rng)
    for name in ("train-labels-idx1-ubyte", "train-images-idx3-ubyte"):
        gz = tmp_path / "fashion_mnist" / f"{name}.gz"
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    ds = load_mnist_family(with_md5s(BUILTIN["fashion_mnist"], md5s), tmp_path)
    np.testing.assert_array_equal(ds.train_labels, arrays[1])
    assert "2 files could not be verified" in ds.provenance.read_note


def test_an_unverifiable_copy_of_the_wrong_structure_is_refused(tmp_path, rng):
    _, md5s = synthetic_files(tmp_path / "kmnist", rng)
    path = tmp_path / "kmnist" / "train-labels-idx1-ubyte.gz"
    labels = bytearray(gzip.decompress(path.read_bytes()))
    labels[-1] = 200  # a label no class has
    path.write_bytes(gzip.compress(bytes(labels), mtime=1))
    with pytest.raises(UserError, match=r"train-labels-idx1-ubyte.gz: label 200 is not one of 0..9"):
        load_mnist_family(with_md5s(BUILTIN["kmnist"], md5s), tmp_path)


def test_truncated_synthetic_file(tmp_path, rng):
    _, md5s = synthetic_files(tmp_path / "kmnist", rng)
    path = tmp_path / "kmnist" / "train-images-idx3-ubyte.gz"
    _truncate(path)
    with pytest.raises(UserError, match=f"{path}: corrupt or truncated gzip data .*delete it"):
        load_mnist_family(with_md5s(BUILTIN["kmnist"], md5s), tmp_path)


def test_download_over_http(tmp_path, rng, http_folder):
    served, url = http_folder
    arrays, md5s = synthetic_files(served, rng)
    spec = with_md5s(BUILTIN["kmnist"], md5s, mirrors=(url + "missing/", url))  # a 404, then the files
    ds = load_mnist_family(spec, tmp_path)
    np.testing.assert_array_equal(ds.test_labels, arrays[3])
    assert sorted(p.name for p in (tmp_path / "kmnist").iterdir()) == sorted(GZ_NAMES)
    assert (tmp_path / "kmnist" / GZ_NAMES[0]).read_bytes() == (served / GZ_NAMES[0]).read_bytes()


def test_download_of_a_damaged_file_is_refused(tmp_path, rng, http_folder):
    served, url = http_folder
    _, md5s = synthetic_files(served, rng)
    (served / GZ_NAMES[1]).write_bytes(b"\x1f\x8b not the labels")
    with pytest.raises(UserError) as caught:
        load_mnist_family(with_md5s(BUILTIN["fashion_mnist"], md5s, mirrors=(url,)), tmp_path)
    assert "does not match the expected" in str(caught.value) and "Fashion-MNIST could not be downloaded" in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "fashion_mnist").iterdir()) == [GZ_NAMES[0]]  # nothing half-written


# --- the table against the published checksums ---------------------------------------------

# Transcribed from the sources the registry cites: torchvision's mnist.py and the Fashion-MNIST
# README (identical for Fashion-MNIST), in the order train images, train labels, test images, test labels.
PUBLISHED = {
    "mnist": ["f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
              "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"],
    "fashion_mnist": ["8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
                      "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"],
    "kmnist": ["bdb82020997e1d708af4cf47b453dcf7", "e144d726b3acfaa3e44228e80efcd344",
               "5c965bf0a639b31b8f53240b1b52f4d7", "7320c461ea6c1c855c0b718fb2a4b134"],
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_table_matches_published_md5s(name):
    spec = BUILTIN[name]
    assert [f.name for f in (*spec.train, *spec.test)] == list(MNIST_FAMILY_NAMES)
    assert [f.md5 for f in (*spec.train, *spec.test)] == PUBLISHED[name]
    assert spec.num_classes == 10 and spec.image_shape == (1, 28, 28)


def test_mnist_content_md5s_match_the_real_files(data_dir):
    for file in (*MNIST.train, *MNIST.test):
        content = gzip.decompress((data_dir / "mnist" / f"{file.name}.gz").read_bytes())
        assert hashlib.md5(content).hexdigest() == file.content_md5


def test_a_record_reads_back_as_a_dataset_that_feeds_a_model_the_same(data_dir):
    from mlptrain.data import recorded_dataset

    ds = reference(data_dir)
    stand_in = recorded_dataset(dataset_record(ds, 5000))
    assert stand_in.image_shape == ds.image_shape and stand_in.num_classes == ds.num_classes
    assert (stand_in.mean, stand_in.std, stand_in.value_scale, stand_in.class_names) == \
        (ds.mean, ds.std, ds.value_scale, ds.class_names)
    assert stand_in.train_images.shape == (0, 784) and stand_in.train_images.dtype == np.uint8
    damaged = dataset_record(ds, 5000)
    damaged["inputs"]["mean"] = "lots"
    assert recorded_dataset(damaged) is None and recorded_dataset({"name": "mnist"}) is None
