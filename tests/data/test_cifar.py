"""CIFAR-10 and CIFAR-100 loaders: the real CIFAR-10 subset, where the batches are looked for,
damaged folders, download, safe and atomic extraction, label sets, and the offline message.

No test touches the real mirrors: `urllib.request.urlopen` is replaced by a fake, or the mirror
is a local HTTP server. Synthetic batches stand in for the canonical ones; their md5s replace the
published ones in a copy of the table entry (`with_md5s`).
"""

import dataclasses
import hashlib
import io
import pickle
import tarfile
import urllib.error
import urllib.request

import numpy as np
import pytest

from mlptrain.data import ImageDataset, dataset_record, is_subset, load_dataset
from mlptrain.data import cifar as cifar_module
from mlptrain.data.cifar import load_cifar
from mlptrain.data.registry import BUILTIN, DataFile
from mlptrain.errors import UserError
from mlptrain.training.fallbacks import subset_note
from tests.data.test_cifar_batch import assert_one_line

CIFAR10, CIFAR100 = BUILTIN["cifar10"], BUILTIN["cifar100"]
FOLDER10 = CIFAR10.batch_folder
URL10 = CIFAR10.mirrors[0]


def batch_bytes(spec, rows, seed):
    """(images, {label key: labels}, pickle bytes) of a synthetic batch in `spec`'s format."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(rows, 3072), dtype=np.uint8)
    labels = {s.key: rng.integers(0, len(s.class_names), size=rows) for s in spec.label_sets}
    entries = {b"batch_label": b"synthetic", b"data": images, b"filenames": [b"x.png"] * rows,
               **{key.encode(): [int(v) for v in value] for key, value in labels.items()}}
    return images, labels, pickle.dumps(entries, protocol=2)


def batch_files(spec):
    return (*spec.train, *spec.test)


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


def write_folder(spec, folder, rows, seed=0):
    """Synthetic batches of `rows` images in `folder`; returns ({name: (images, labels)}, {name: md5})."""
    folder.mkdir(parents=True)
    written, md5s = {}, {}
    for i, file in enumerate(batch_files(spec)):
        images, labels, data = batch_bytes(spec, rows, seed=seed * 10 + i)
        (folder / file.name).write_bytes(data)
        written[file.name], md5s[file.name] = (images, labels), hashlib.md5(data).hexdigest()
    return written, md5s


def with_md5s(spec, md5s, archive_md5=None):
    """`spec` with `md5s` (and `archive_md5`) standing in for the published ones."""
    def files(split):
        return tuple(DataFile(f.name, md5s.get(f.name, f.md5)) for f in getattr(spec, split))
    archive = dataclasses.replace(spec.archive, md5=archive_md5) if archive_md5 else spec.archive
    return dataclasses.replace(spec, train=files("train"), test=files("test"), archive=archive)


def assert_loaded(ds, written, spec=CIFAR10, key="labels"):
    train, test = [f.name for f in spec.train], [f.name for f in spec.test]
    np.testing.assert_array_equal(ds.train_images, np.concatenate([written[n][0] for n in train]))
    np.testing.assert_array_equal(ds.train_labels, np.concatenate([written[n][1][key] for n in train]))
    np.testing.assert_array_equal(ds.test_images, np.concatenate([written[n][0] for n in test]))
    np.testing.assert_array_equal(ds.test_labels, np.concatenate([written[n][1][key] for n in test]))


# --- the real subset -------------------------------------------------------------------

@pytest.fixture
def subset_root(data_dir):
    if not (data_dir / "cifar10-subset" / FOLDER10).is_dir():
        from tests.conftest import real_data_missing
        real_data_missing("the CIFAR-10 subset")
    return data_dir


def test_real_subset(subset_root):
    ds = load_dataset("cifar10", subset_root)
    assert isinstance(ds, ImageDataset) and ds.name == "cifar10"
    assert ds.image_shape == (3, 32, 32) and ds.num_classes == 10 and ds.num_features == 3072
    assert ds.class_names[:3] == ("airplane", "automobile", "bird")
    assert ds.train_images.shape == (5085, 3072) and ds.test_images.shape == (1017, 3072)
    for labels in (ds.train_labels, ds.test_labels):
        assert labels.dtype == np.uint8 and set(labels.tolist()) == set(range(10))
    # The standard reader on these trusted files is the reference.
    with open(subset_root / "cifar10-subset" / FOLDER10 / "data_batch_2", "rb") as file:
        reference = pickle.load(file, encoding="bytes")
    np.testing.assert_array_equal(ds.train_images[1017:2034], reference[b"data"])
    assert ds.train_labels[1017:2034].tolist() == reference[b"labels"]
    # computed from these training images (the full set's would be 0.4734, 0.2516)
    pixels = ds.train_images / 255.0
    assert ds.mean == pytest.approx(pixels.mean(), rel=1e-12) and ds.std == pytest.approx(pixels.std(), rel=1e-9)
    # a subset: its fallback line names it and where it came from, and the record says so
    assert is_subset(ds) and subset_note(ds) == (
        f"data: cifar10 is a subset (5,085 of 50,000 training and 1,017 of 10,000 test images, from "
        f"{subset_root / 'cifar10-subset' / FOLDER10}); its metrics are not comparable with the full dataset's")
    record = dataset_record(ds, 1000)
    assert record["subset"] is True and (record["train"], record["val"], record["test"]) == (4085, 1000, 1017)
    assert record["files"] == 6 and record["location"] == str(subset_root / "cifar10-subset" / FOLDER10)


def test_registry_finds_subset_through_env(subset_root, monkeypatch):
    monkeypatch.setenv("MLPTRAIN_DATA_DIR", str(subset_root))
    assert load_dataset("cifar10").test_images.shape == (1017, 3072)


# --- the folders: search order, verification, missing and damaged files -----------------------

def test_subset_batches_load_in_order(tmp_path):
    written, _ = write_folder(CIFAR10, tmp_path / "cifar10-subset" / FOLDER10, rows=3)
    ds = load_cifar(CIFAR10, tmp_path)
    assert ds.train_images.shape == (15, 3072) and ds.test_images.shape == (3, 3072)
    assert_loaded(ds, written)
    assert is_subset(ds) and dataset_record(ds, 1)["subset"] is True


def test_cache_batches_with_published_md5s_load(tmp_path):
    written, md5s = write_folder(CIFAR10, tmp_path / "cifar10" / FOLDER10, rows=2)
    ds = load_cifar(with_md5s(CIFAR10, md5s), tmp_path)
    assert_loaded(ds, written)
    assert is_subset(ds)  # 10 + 2 images: canonical files (md5s), but not all of them
    assert dict(ds.provenance.checksums) == md5s


def test_cache_batch_without_published_md5_is_refused(tmp_path):
    written, md5s = write_folder(CIFAR10, tmp_path / "cifar10" / FOLDER10, rows=2)
    path = tmp_path / "cifar10" / FOLDER10 / "data_batch_2"
    with pytest.raises(UserError) as caught:
        load_cifar(with_md5s(CIFAR10, {**md5s, "data_batch_2": "0" * 32}), tmp_path)
    assert_one_line(caught, path, "is corrupt: md5", "expected the published " + "0" * 32, "delete the folder")


def test_cache_folder_wins_over_subset(tmp_path):
    written, md5s = write_folder(CIFAR10, tmp_path / "cifar10" / FOLDER10, rows=2, seed=1)
    write_folder(CIFAR10, tmp_path / "cifar10-subset" / FOLDER10, rows=1, seed=2)
    assert_loaded(load_cifar(with_md5s(CIFAR10, md5s), tmp_path), written)


def test_archive_in_cache_wins_over_subset(tmp_path, serve, archive):
    data, written, spec = archive()
    write_folder(CIFAR10, tmp_path / "cifar10-subset" / FOLDER10, rows=1)
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / CIFAR10.archive.name).write_bytes(data)
    serve({})
    assert_loaded(load_cifar(spec, tmp_path), written)


def test_missing_batch_in_folder(tmp_path):
    folder = tmp_path / "cifar10" / FOLDER10
    write_folder(CIFAR10, folder, rows=1)
    (folder / "data_batch_4").unlink()
    (folder / "test_batch").unlink()
    with pytest.raises(UserError) as caught:
        load_cifar(CIFAR10, tmp_path)
    assert_one_line(caught, folder, "missing data_batch_4, test_batch", "delete the folder")


def test_truncated_batch_in_subset(tmp_path):
    folder = tmp_path / "cifar10-subset" / FOLDER10
    write_folder(CIFAR10, folder, rows=2)
    path = folder / "data_batch_5"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError) as caught:
        load_cifar(CIFAR10, tmp_path)
    assert_one_line(caught, path, "truncated", "restore it", f"create the folder {tmp_path / 'cifar10'}")


# --- CIFAR-100: its files and label sets -------------------------------------------------

def test_cifar100_fine_and_coarse(tmp_path):
    written, md5s = write_folder(CIFAR100, tmp_path / "cifar100" / "cifar-100-python", rows=4)
    spec = with_md5s(CIFAR100, md5s)
    fine = load_cifar(spec, tmp_path)
    assert fine.num_classes == 100 and fine.class_names[:2] == ("apple", "aquarium_fish")
    assert_loaded(fine, written, CIFAR100, "fine_labels")
    coarse = load_cifar(spec, tmp_path, "coarse")
    assert coarse.num_classes == 20 and coarse.class_names[-1] == "vehicles_2"
    assert_loaded(coarse, written, CIFAR100, "coarse_labels")
    assert dataset_record(coarse, 1)["label"] == "coarse" and dataset_record(fine, 1)["label"] == "fine"
    np.testing.assert_array_equal(fine.train_images, coarse.train_images)


def test_cifar100_label_out_of_range(tmp_path):
    folder = tmp_path / "cifar100-subset" / "cifar-100-python"
    write_folder(CIFAR100, folder, rows=2)
    images = np.zeros((2, 3072), np.uint8)
    (folder / "test").write_bytes(pickle.dumps({b"data": images, b"fine_labels": [0, 100], b"coarse_labels": [0, 1]}))
    with pytest.raises(UserError) as caught:
        load_cifar(CIFAR100, tmp_path)
    assert_one_line(caught, folder / "test", "b'fine_labels' must be in 0..99", "found 0..100")


def test_label_set_choice_is_checked():
    with pytest.raises(UserError, match="data.label: cifar10 has no 'coarse' labels; data.label must be left out"):
        load_dataset("cifar10", label="coarse")
    with pytest.raises(UserError, match="data.path is for data.dataset npz or folder"):
        load_dataset("cifar100", path="x.npz")


# --- download and extraction ------------------------------------------------------------

def _add(tar, name, data=b"", **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def archive_bytes(spec=CIFAR10, rows=2, skip=(), extra=()):
    """A tar.gz laid out as the canonical archive, with synthetic batches; returns (bytes, written, md5s)."""
    buffer, written, md5s = io.BytesIO(), {}, {}
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        _add(tar, spec.batch_folder, type=tarfile.DIRTYPE, mode=0o755)
        for i, file in enumerate(batch_files(spec)):
            images, labels, data = batch_bytes(spec, rows, seed=20 + i)
            written[file.name], md5s[file.name] = (images, labels), hashlib.md5(data).hexdigest()
            if file.name not in skip:
                _add(tar, f"{spec.batch_folder}/{file.name}", data)
        for name in spec.other_members:
            _add(tar, f"{spec.batch_folder}/{name}", b"meta")
        for name, fields in extra:
            _add(tar, name, b"evil", **fields)
    return buffer.getvalue(), written, md5s


@pytest.fixture
def archive():
    """archive(**archive_bytes kwargs): (bytes, written, the spec with their md5s as the published ones)."""
    def make(spec=CIFAR10, **kwargs):
        data, written, md5s = archive_bytes(spec, **kwargs)
        return data, written, with_md5s(spec, md5s, hashlib.md5(data).hexdigest())
    return make


@pytest.mark.parametrize("spec", [CIFAR10, CIFAR100], ids=["cifar10", "cifar100"])
def test_download_extracts_into_cache(tmp_path, serve, archive, spec):
    data, written, patched = archive(spec)
    requested = serve({spec.mirrors[0]: data})
    key = spec.label_sets[0].key
    assert_loaded(load_cifar(patched, tmp_path), written, spec, key)
    assert requested == [spec.mirrors[0]]
    cache = tmp_path / spec.name
    assert sorted(p.name for p in cache.iterdir()) == sorted([spec.batch_folder, spec.archive.name])
    assert sorted(p.name for p in (cache / spec.batch_folder).iterdir()) == sorted(
        [f.name for f in batch_files(spec)] + list(spec.other_members))
    serve({})  # offline now: the cache is enough
    assert_loaded(load_cifar(patched, tmp_path), written, spec, key)


def test_download_over_http(tmp_path, archive, http_folder):
    served, url = http_folder
    data, written, spec = archive()
    (served / spec.archive.name).write_bytes(data)
    spec = dataclasses.replace(spec, mirrors=(url + "gone.tar.gz", url + spec.archive.name))
    assert_loaded(load_cifar(spec, tmp_path), written)


def test_archive_in_place_is_extracted_without_network(tmp_path, serve, archive):
    data, written, spec = archive()
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / CIFAR10.archive.name).write_bytes(data)
    requested = serve({})
    assert_loaded(load_cifar(spec, tmp_path), written)
    assert requested == []


@pytest.mark.parametrize("spec", [CIFAR10, CIFAR100], ids=["cifar10", "cifar100"])
def test_offline_message_names_url_folder_files_and_env(tmp_path, offline, spec):
    with pytest.raises(UserError) as caught:
        load_dataset(spec.name, tmp_path)
    lines = str(caught.value).splitlines()
    folder = tmp_path / spec.name
    assert lines[0] == (f"{spec.title} could not be downloaded (could not download {spec.archive.name}: "
                        f"{spec.mirrors[0]}: network is unreachable)")
    assert lines[1:3] == [f"put this file into {folder}:", f"  {spec.archive.name}  from {spec.mirrors[0]}"]
    batches = ", ".join(f.name for f in batch_files(spec))
    assert lines[3] == (f"(it is extracted on the next run), or extract it there so that "
                        f"{folder / spec.batch_folder} holds {batches},")
    assert lines[4] == f"or set MLPTRAIN_DATA_DIR (or data.root) to a folder that holds {spec.name}/"
    assert offline == list(spec.mirrors)
    assert list(tmp_path.iterdir()) == []  # the folder it made for the download is gone again: nothing left behind


def test_offline_with_damaged_archive_in_place(tmp_path, offline):
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / CIFAR10.archive.name).write_bytes(b"half an archive")
    with pytest.raises(UserError) as caught:
        load_dataset("cifar10", tmp_path)
    first = str(caught.value).splitlines()[0]
    assert URL10 in first and "has md5" in first and CIFAR10.archive.md5 in first


def _assert_nothing_extracted(root, spec=CIFAR10):
    cache = root / spec.name
    assert sorted(p.name for p in cache.iterdir()) == [spec.archive.name]  # no batch folder, no temp
    assert not list(root.rglob("evil")) and not (root.parent / "evil").exists()


@pytest.mark.parametrize("extra, fragment", [
    ([("../evil", {})], "'../evil'"),
    ([(f"{FOLDER10}/../../evil", {})], "/../../evil'"),
    ([("/tmp/evil", {})], "'/tmp/evil'"),
    ([(f"{FOLDER10}/readme.html", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})], "readme.html"),
], ids=["dot-dot", "nested-dot-dot", "absolute", "symlink"])
def test_unsafe_member_is_refused(tmp_path, serve, archive, extra, fragment):
    data, _, spec = archive(extra=extra)
    serve({URL10: data})
    with pytest.raises(UserError) as caught:
        load_cifar(spec, tmp_path)
    assert_one_line(caught, "unexpected member", fragment)
    _assert_nothing_extracted(tmp_path)


def test_archive_without_test_batch(tmp_path, serve, archive):
    data, _, spec = archive(skip=("test_batch",))
    serve({URL10: data})
    with pytest.raises(UserError) as caught:
        load_cifar(spec, tmp_path)
    assert_one_line(caught, "lacks", f"{FOLDER10}/test_batch", "delete it")
    _assert_nothing_extracted(tmp_path)


def test_corrupt_archive(tmp_path, serve):
    data, _, _ = archive_bytes()
    data = data[: len(data) // 2]
    serve({URL10: data})
    with pytest.raises(UserError) as caught:
        load_cifar(with_md5s(CIFAR10, {}, hashlib.md5(data).hexdigest()), tmp_path)
    assert_one_line(caught, "corrupt archive", "delete it")
    _assert_nothing_extracted(tmp_path)


@pytest.mark.parametrize("mode", ["w:xz", "w:bz2"])
def test_a_damaged_recompressed_archive_is_one_line(tmp_path, serve, mode):
    """Damage inside an .xz raises lzma.LZMAError and inside a .bz2 an OSError without an errno: neither is
    tarfile's own TarError, and both are the archive's damage, not the disk's."""
    data, _, _ = archive_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as source, tarfile.open(fileobj=buffer, mode=mode) as again:
        for member in source:
            again.addfile(member, source.extractfile(member) if member.isfile() else None)
    damaged = bytearray(buffer.getvalue())
    middle = len(damaged) // 2
    damaged[middle:middle + 16] = bytes(b ^ 0xFF for b in damaged[middle:middle + 16])
    serve({URL10: bytes(damaged)})
    with pytest.raises(UserError) as caught:
        load_cifar(with_md5s(CIFAR10, {}, hashlib.md5(damaged).hexdigest()), tmp_path)
    assert_one_line(caught, "corrupt archive", "delete it")
    _assert_nothing_extracted(tmp_path)


def test_interrupted_extraction_leaves_no_partial_folder(tmp_path, serve, archive, monkeypatch):
    data, written, spec = archive()
    serve({URL10: data})
    copy, copies = cifar_module.shutil.copyfileobj, []

    def interrupted_at_third_file(source, out, length=0):
        copies.append(out.name)
        if len(copies) == 3:
            raise KeyboardInterrupt
        copy(source, out, length)

    monkeypatch.setattr(cifar_module.shutil, "copyfileobj", interrupted_at_third_file)
    with pytest.raises(KeyboardInterrupt):
        load_cifar(spec, tmp_path)
    _assert_nothing_extracted(tmp_path)
    serve({})
    assert_loaded(load_cifar(spec, tmp_path), written)  # the kept archive completes the job offline


# --- the table against the published checksums ---------------------------------------------


@pytest.mark.parametrize("mode", ["w:xz", "w:gz"], ids=["xz", "gzip-again"])
def test_a_recompressed_archive_holding_the_published_batches_is_extracted(tmp_path, serve, archive, mode):
    data, written, spec = archive()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as source, \
            tarfile.open(fileobj=buffer, mode=mode, **({"compresslevel": 1} if mode == "w:gz" else {})) as again:
        for member in source:
            again.addfile(member, source.extractfile(member) if member.isfile() else None)
    assert hashlib.md5(buffer.getvalue()).hexdigest() != spec.archive.md5
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / CIFAR10.archive.name).write_bytes(buffer.getvalue())
    requested = serve({})
    assert_loaded(load_cifar(spec, tmp_path), written)  # its batches have the published md5s: no download
    assert requested == []


def test_an_archive_of_other_batches_is_not_taken_for_the_published_one(tmp_path, serve, archive):
    data, written, spec = archive()
    other, _, _ = archive_bytes(rows=3)  # the same layout, other batches
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / CIFAR10.archive.name).write_bytes(other)
    requested = serve({spec.mirrors[0]: data})
    assert_loaded(load_cifar(spec, tmp_path), written)  # downloaded, as if absent
    assert requested == [spec.mirrors[0]] and not list((tmp_path / "cifar10").glob(".*part"))
