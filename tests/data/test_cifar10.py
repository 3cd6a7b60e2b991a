"""CIFAR-10 loader: the real subset, where the batches are looked for, damaged
folders, download, safe and atomic extraction, and the offline message.

No test touches the network: `urllib.request.urlopen` is replaced by a fake.
"""

import hashlib
import io
import pickle
import tarfile
import urllib.error
import urllib.request

import numpy as np
import pytest

from mlptrain.data import ImageDataset, load_dataset
from mlptrain.data import cifar10 as cifar10_module
from mlptrain.data.cifar10 import BATCH_FOLDER, TEST_BATCH, TRAIN_BATCHES, URL, load_cifar10
from mlptrain.errors import UserError
from tests.data.test_cifar_batch import assert_one_line, batch_bytes

BATCHES = (*TRAIN_BATCHES, TEST_BATCH)


class Response(io.BytesIO):
    """Enough of urlopen's response for fetch(): read(n), headers, a context manager."""

    headers = {}


@pytest.fixture
def serve(monkeypatch):
    """serve({url: bytes}); every other URL fails as if offline. Returns the URLs requested."""
    requested = []

    def install(routes):
        def urlopen(url, timeout=None):
            requested.append(url)
            if url not in routes:
                raise urllib.error.URLError("network is unreachable")
            return Response(routes[url])

        monkeypatch.setattr(urllib.request, "urlopen", urlopen)
        return requested

    return install


def write_folder(folder, rows, seed=0):
    """Six synthetic batches of `rows` images in `folder`; returns {name: (images, labels)}."""
    folder.mkdir(parents=True)
    written = {}
    for i, name in enumerate(BATCHES):
        images, labels, data = batch_bytes(rows, seed=seed * 10 + i)
        (folder / name).write_bytes(data)
        written[name] = images, labels
    return written


def assert_loaded(ds, written):
    np.testing.assert_array_equal(ds.train_images, np.concatenate([written[n][0] for n in TRAIN_BATCHES]))
    np.testing.assert_array_equal(ds.train_labels, np.concatenate([written[n][1] for n in TRAIN_BATCHES]))
    np.testing.assert_array_equal(ds.test_images, written[TEST_BATCH][0])
    np.testing.assert_array_equal(ds.test_labels, written[TEST_BATCH][1])


# --- the real subset -------------------------------------------------------------------

@pytest.fixture
def subset_root(data_dir):
    if not (data_dir / "cifar10-subset" / BATCH_FOLDER).is_dir():
        pytest.skip(f"CIFAR-10 subset not found under {data_dir}")
    return data_dir


def test_real_subset(subset_root):
    ds = load_cifar10(subset_root)
    assert isinstance(ds, ImageDataset) and ds.name == "cifar10"
    assert ds.image_shape == (3, 32, 32) and ds.num_classes == 10 and ds.num_features == 3072
    assert ds.train_images.shape == (5085, 3072) and ds.test_images.shape == (1017, 3072)
    for labels in (ds.train_labels, ds.test_labels):
        assert labels.dtype == np.uint8 and set(labels.tolist()) == set(range(10))
    # The standard reader on these trusted files is the reference.
    with open(subset_root / "cifar10-subset" / BATCH_FOLDER / "data_batch_2", "rb") as file:
        reference = pickle.load(file, encoding="bytes")
    np.testing.assert_array_equal(ds.train_images[1017:2034], reference[b"data"])
    assert ds.train_labels[1017:2034].tolist() == reference[b"labels"]
    # The constants are the full training set's; this random fifth of it lands close.
    pixels = ds.train_images / 255.0
    assert pixels.mean() == pytest.approx(ds.mean, abs=0.005)
    assert pixels.std() == pytest.approx(ds.std, abs=0.002)


def test_registry_finds_subset_through_env(subset_root, monkeypatch):
    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(subset_root))
    assert load_dataset("cifar10").test_images.shape == (1017, 3072)


# --- the folder: search order, missing and damaged files -----------------------------------

def test_small_batches_load_in_order(tmp_path):
    written = write_folder(tmp_path / "cifar10" / BATCH_FOLDER, rows=3)
    ds = load_cifar10(tmp_path)
    assert ds.train_images.shape == (15, 3072) and ds.test_images.shape == (3, 3072)
    assert_loaded(ds, written)


def test_cache_folder_wins_over_subset(tmp_path):
    written = write_folder(tmp_path / "cifar10" / BATCH_FOLDER, rows=2, seed=1)
    write_folder(tmp_path / "cifar10-subset" / BATCH_FOLDER, rows=1, seed=2)
    assert_loaded(load_cifar10(tmp_path), written)


def test_archive_in_cache_wins_over_subset(tmp_path, serve, archive):
    data, written = archive()
    write_folder(tmp_path / "cifar10-subset" / BATCH_FOLDER, rows=1)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "cifar-10-python.tar.gz").write_bytes(data)
    serve({})
    assert_loaded(load_cifar10(tmp_path), written)


def test_missing_batch_in_folder(tmp_path):
    folder = tmp_path / "cifar10" / BATCH_FOLDER
    write_folder(folder, rows=1)
    (folder / "data_batch_4").unlink()
    (folder / TEST_BATCH).unlink()
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, folder, "missing data_batch_4, test_batch", "delete the folder")


@pytest.mark.parametrize("parent, fix", [("cifar10", "delete the folder"), ("cifar10-subset", "restore it")])
def test_truncated_batch_in_folder(tmp_path, parent, fix):
    folder = tmp_path / parent / BATCH_FOLDER
    write_folder(folder, rows=2)
    path = folder / "data_batch_5"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, path, "truncated", fix)


def test_canonical_size_requires_canonical_md5(tmp_path, monkeypatch):
    folder = tmp_path / "cifar10" / BATCH_FOLDER
    write_folder(folder, rows=2)
    path = folder / "data_batch_2"
    monkeypatch.setitem(cifar10_module.CANONICAL, "data_batch_2", (path.stat().st_size, "0" * 32))
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, path, "canonical size", "0" * 32, "delete the folder")


# --- download and extraction ------------------------------------------------------------

def _add(tar, name, data=b"", **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def archive_bytes(rows=2, skip=(), extra=()):
    """A tar.gz laid out as the canonical archive, with synthetic batches; returns (bytes, written)."""
    buffer, written = io.BytesIO(), {}
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        _add(tar, BATCH_FOLDER, type=tarfile.DIRTYPE, mode=0o755)
        for i, name in enumerate(BATCHES):
            images, labels, data = batch_bytes(rows, seed=20 + i, protocol=2)
            written[name] = images, labels
            if name not in skip:
                _add(tar, f"{BATCH_FOLDER}/{name}", data)
        _add(tar, f"{BATCH_FOLDER}/batches.meta", pickle.dumps({b"label_names": [b"airplane"]}, protocol=2))
        for name, fields in extra:
            _add(tar, name, b"evil", **fields)
    return buffer.getvalue(), written


@pytest.fixture
def archive(monkeypatch):
    """archive(**archive_bytes kwargs): those bytes, with their md5 made the canonical one."""
    def make(**kwargs):
        data, written = archive_bytes(**kwargs)
        monkeypatch.setattr(cifar10_module, "ARCHIVE_MD5", hashlib.md5(data).hexdigest())
        return data, written
    return make


def test_download_extracts_into_cache(tmp_path, serve, archive):
    data, written = archive()
    requested = serve({URL: data})
    assert_loaded(load_cifar10(tmp_path), written)
    assert requested == [URL]
    cache = tmp_path / "cifar10"
    assert sorted(p.name for p in cache.iterdir()) == [BATCH_FOLDER, "cifar-10-python.tar.gz"]
    assert sorted(p.name for p in (cache / BATCH_FOLDER).iterdir()) == sorted([*BATCHES, "batches.meta"])
    serve({})  # offline now: the cache is enough
    assert_loaded(load_cifar10(tmp_path), written)


def test_archive_in_place_is_extracted_without_network(tmp_path, serve, archive):
    data, written = archive()
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "cifar-10-python.tar.gz").write_bytes(data)
    requested = serve({})
    assert_loaded(load_cifar10(tmp_path), written)
    assert requested == []


def test_offline_names_url_folder_files_and_env(tmp_path, serve):
    requested = serve({})
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, URL, "network is unreachable", tmp_path / "cifar10" / BATCH_FOLDER,
                    "data_batch_1", "data_batch_5", "test_batch", "MLPTRAIN_DATA_DIR")
    assert requested == [URL]
    assert list(tmp_path.iterdir()) == []  # not even the cifar10/ folder made for the download


def test_offline_with_damaged_archive_in_place(tmp_path, serve):
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "cifar-10-python.tar.gz").write_bytes(b"half an archive")
    serve({})
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, URL, "has md5", cifar10_module.ARCHIVE_MD5)


def _assert_nothing_extracted(root):
    cache = root / "cifar10"
    assert sorted(p.name for p in cache.iterdir()) == ["cifar-10-python.tar.gz"]  # no batch folder, no temp
    assert not list(root.rglob("evil")) and not (root.parent / "evil").exists()


@pytest.mark.parametrize("extra, fragment", [
    ([("../evil", {})], "'../evil'"),
    ([(f"{BATCH_FOLDER}/../../evil", {})], "/../../evil'"),
    ([("/tmp/evil", {})], "'/tmp/evil'"),
    ([(f"{BATCH_FOLDER}/readme.html", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})], "readme.html"),
], ids=["dot-dot", "nested-dot-dot", "absolute", "symlink"])
def test_unsafe_member_is_refused(tmp_path, serve, archive, extra, fragment):
    data, _ = archive(extra=extra)
    serve({URL: data})
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, "unexpected member", fragment)
    _assert_nothing_extracted(tmp_path)


def test_archive_without_test_batch(tmp_path, serve, archive):
    data, _ = archive(skip=(TEST_BATCH,))
    serve({URL: data})
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, "lacks", f"{BATCH_FOLDER}/test_batch", "delete it")
    _assert_nothing_extracted(tmp_path)


def test_corrupt_archive(tmp_path, serve, monkeypatch):
    data, _ = archive_bytes()
    data = data[: len(data) // 2]
    monkeypatch.setattr(cifar10_module, "ARCHIVE_MD5", hashlib.md5(data).hexdigest())
    serve({URL: data})
    with pytest.raises(UserError) as caught:
        load_cifar10(tmp_path)
    assert_one_line(caught, "corrupt archive", "delete it")
    _assert_nothing_extracted(tmp_path)


def test_interrupted_extraction_leaves_no_partial_folder(tmp_path, serve, archive, monkeypatch):
    data, written = archive()
    serve({URL: data})
    copy, copies = cifar10_module.shutil.copyfileobj, []

    def interrupted_at_third_file(source, out, length=0):
        copies.append(out.name)
        if len(copies) == 3:
            raise KeyboardInterrupt
        copy(source, out, length)

    monkeypatch.setattr(cifar10_module.shutil, "copyfileobj", interrupted_at_third_file)
    with pytest.raises(KeyboardInterrupt):
        load_cifar10(tmp_path)
    _assert_nothing_extracted(tmp_path)
    serve({})
    assert_loaded(load_cifar10(tmp_path), written)  # the kept archive completes the job offline
