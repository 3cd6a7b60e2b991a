"""The decoded-data cache: what it gives back is bitwise what decoding gives; a stale, corrupt, foreign or
unreadable entry is never used; a cache folder that cannot be written costs one fallback line, not a run."""

import os
import shutil

import numpy as np
import pytest

from mlptrain.data import dataset_record, load_dataset
from mlptrain.data.dataset import ImageDataset, Provenance
from mlptrain.data.decoded_cache import CACHE_ENV, MAGIC, cache_dir, entry_path, load_cached

FIELDS = ("train_images", "train_labels", "test_images", "test_labels", "val_images", "val_labels")


def same(a: ImageDataset, b: ImageDataset) -> None:
    """Bitwise the same dataset: every array's dtype, shape and bytes, every other field exactly."""
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and x.flags.c_contiguous, name
            assert x.tobytes() == y.tobytes(), name
    assert (a.name, a.image_shape, a.num_classes, a.class_names, a.value_scale) == \
           (b.name, b.image_shape, b.num_classes, b.class_names, b.value_scale)
    assert a.mean.hex() == b.mean.hex() and a.std.hex() == b.std.hex()
    assert (a.provenance.location, a.provenance.checksums, a.provenance.label) == \
           (b.provenance.location, b.provenance.checksums, b.provenance.label)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def entries(cache) -> list:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.is_dir() else []


# --- the real datasets: cached equals decoded --------------------------------------------

@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_cached_arrays_are_bitwise_the_decoded_ones(name, data_dir, cache, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "off")
    decoded = load_dataset(name, data_dir)
    assert not cache.exists()  # off writes nothing
    monkeypatch.setenv(CACHE_ENV, str(cache))
    first = load_dataset(name, data_dir)  # decodes, writes the entry
    assert len(entries(cache)) == 1 and first.provenance.cache_note is None
    second = load_dataset(name, data_dir)  # read back from the entry
    same(first, decoded)
    same(second, decoded)
    assert dataset_record(second, 5000) == dataset_record(decoded, 5000)
    assert not any(p.name.endswith(".tmp") for p in cache.iterdir())


def test_a_corrupt_entry_is_refused_with_one_note_and_rewritten(data_dir, cache):
    decoded = load_dataset("mnist", data_dir)
    [entry] = entries(cache)
    data = bytearray(entry.read_bytes())
    data[-1000] ^= 0x01  # one flipped bit in the pixels
    entry.write_bytes(data)
    again = load_dataset("mnist", data_dir)
    same(again, decoded)
    assert "fails its CRC-32 check" in again.provenance.cache_note and str(entry) in again.provenance.cache_note
    third = load_dataset("mnist", data_dir)  # rewritten: whole again, and silent
    assert third.provenance.cache_note is None
    same(third, decoded)


# --- synthetic sources: every way an entry can be wrong ----------------------------------

def tiny(folder, seed=0) -> ImageDataset:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (6, 4), dtype=np.uint8)
    return ImageDataset("tiny", images, np.arange(6, dtype=np.uint8) % 2, images[:3].copy(),
                        np.zeros(3, np.uint8), (4,), 2, mean=0.1 + seed, std=1 / 3,
                        provenance=Provenance(str(folder), (("a.bin", "0" * 32),)))


class Decoder:
    """decode() for load_cached, counting its calls; the dataset follows the source file's first byte."""

    def __init__(self, source):
        self.source, self.calls = source, 0

    def __call__(self):
        self.calls += 1
        return tiny(self.source.parent, self.source.read_bytes()[0])


def load(source, decoder, label=None):
    return load_cached("tiny", source.parent, label, [source], decoder)


@pytest.fixture
def source(tmp_path):
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "a.bin"
    path.write_bytes(b"\x00" * 8)
    return path


def test_a_hit_does_not_decode_and_a_changed_source_does(source, cache):
    decode = Decoder(source)
    same(load(source, decode), tiny(source.parent, 0))
    same(load(source, decode), tiny(source.parent, 0))
    assert decode.calls == 1
    # the same size and the old mtime put back: the ctime (and so the key) still changes
    stat = source.stat()
    source.write_bytes(b"\x01" * 8)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = load(source, decode)
    assert decode.calls == 2 and changed.provenance.cache_note is None  # stale is a plain miss: no warning
    same(changed, tiny(source.parent, 1))
    same(load(source, decode), tiny(source.parent, 1))
    assert decode.calls == 2 and len(entries(cache)) == 1  # the stale entry was replaced, not kept beside


def test_another_folder_or_label_set_is_another_entry(source, cache, tmp_path):
    decode = Decoder(source)
    load(source, decode)
    load(source, decode, label="coarse")
    other = tmp_path / "other" / "a.bin"
    other.parent.mkdir()
    shutil.copy2(source, other)
    load(other, Decoder(other))
    assert decode.calls == 2 and len(entries(cache)) == 3


def test_a_link_to_the_folder_gets_the_record_decoding_gives(source, cache, tmp_path):
    """The dataset's record names the folder as given: an entry written through another path is not used."""
    link = tmp_path / "link"
    link.symlink_to(source.parent)
    decode = Decoder(source)
    load(source, decode)
    through = load_cached("tiny", link, None, [link / "a.bin"], lambda: tiny(link, 0))
    assert through.provenance.location == str(link) and through.provenance.cache_note is None
    assert len(entries(cache)) == 1  # the same folder: one entry, now written through the link


@pytest.mark.parametrize("damage, why", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0", "truncated or padded"),
    (lambda b: b[:len(MAGIC) + 20], "damaged or truncated header"),
    (lambda b: b[:len(MAGIC) + 14] + b"X" + b[len(MAGIC) + 15:], "damaged or truncated header"),
    (lambda b: b"NOT-AN-ENTRY" + b[12:], "not a data cache entry"),
    (lambda b: b"", "not a data cache entry"),
])
def test_a_damaged_entry_is_decoded_again_with_one_note(source, cache, damage, why):
    decode = Decoder(source)
    load(source, decode)
    [entry] = entries(cache)
    entry.write_bytes(damage(entry.read_bytes()))
    again = load(source, decode)
    assert decode.calls == 2 and why in again.provenance.cache_note
    same(again, tiny(source.parent, 0))
    assert load(source, decode).provenance.cache_note is None and decode.calls == 2


def test_an_entry_moved_onto_another_name_is_not_used(source, cache, tmp_path):
    """A foreign entry (another folder's, copied over this one's) carries its own key: a miss."""
    other = tmp_path / "other" / "a.bin"
    other.parent.mkdir()
    other.write_bytes(b"\x05" * 8)
    load(other, Decoder(other))
    mine = entry_path(cache, "tiny", source.parent.resolve(), None)
    shutil.copy(entry_path(cache, "tiny", other.parent.resolve(), None), mine)
    decode = Decoder(source)
    got = load(source, decode)
    assert decode.calls == 1 and got.provenance.cache_note is None
    same(got, tiny(source.parent, 0))


def test_a_cache_that_cannot_be_written_notes_it_and_still_loads(source, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    decode = Decoder(source)
    got = load(source, decode)
    same(got, tiny(source.parent, 0))
    note = got.provenance.cache_note
    assert note.startswith(f"data cache: cannot write {blocker / 'cache'}") and CACHE_ENV in note
    assert "\n" not in note
    assert sorted(p.name for p in source.parent.iterdir()) == ["a.bin"]  # nothing beside the data


def test_off_and_the_default_folder(monkeypatch, tmp_path, source):
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_dir() is None
    decode = Decoder(source)
    assert load(source, decode).provenance.cache_note is None
    load(source, decode)
    assert decode.calls == 2
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "mlptrain" / "decoded"


def test_a_run_warns_the_cache_note_once_and_records_it(tmp_path, capsys):
    """The note is a fallback: one warning line when training starts, and summary.json's `fallbacks`."""
    import dataclasses
    import json

    from mlptrain.backends.cpu import CpuBackend
    from mlptrain.training.loop import train
    from mlptrain.training.session import build_session
    from tests.training.test_accumulation import make_config, synthetic_dataset
    from tests.training.test_resume import new_run

    note = "data cache: cannot write /nowhere (Read-only file system); tiny is decoded from its files on every run"
    data = synthetic_dataset()
    data = dataclasses.replace(data, provenance=dataclasses.replace(data.provenance, cache_note=note))
    config = make_config(64, 1, epochs=1)
    session = build_session(config, CpuBackend(), data)
    assert session.fallbacks == [note]
    summary = train(session, new_run(tmp_path, "run", config))
    assert summary["fallbacks"] == [note]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["fallbacks"] == [note]
    assert capsys.readouterr().err.count("cannot write /nowhere") == 1


@pytest.mark.parametrize("replace", [os.mkfifo, lambda path: path.symlink_to("/dev/zero")])
def test_an_entry_that_is_a_fifo_or_device_is_decoded_again_not_waited_on(source, cache, replace):
    """open() of a FIFO blocks until a writer comes: every run hung at start-up."""
    from tests.util.test_regular_file import within

    decode = Decoder(source)
    load(source, decode)
    [entry] = entries(cache)
    entry.unlink()
    replace(entry)
    with within(5):
        again = load(source, decode)
    assert decode.calls == 2 and "not a regular file" in again.provenance.cache_note
    same(again, tiny(source.parent, 0))
    assert entry.is_file() and load(source, decode).provenance.cache_note is None


def rewrite_header(entry, change) -> None:
    """The entry with `change(header)` applied and its header's CRC made right again, the file then sized to
    the bytes the header declares (sparse): a well-formed header that lies."""
    import json
    import zlib

    from mlptrain.data.decoded_cache import PREFIX
    raw = entry.read_bytes()
    length = int.from_bytes(raw[len(MAGIC):len(MAGIC) + 8], "little")
    header = json.loads(raw[PREFIX:PREFIX + length])
    change(header)
    text = json.dumps(header).encode()
    with open(entry, "wb") as file:
        file.write(MAGIC + len(text).to_bytes(8, "little") + zlib.crc32(text).to_bytes(4, "little") + text)
        file.truncate(PREFIX + len(text) + header["bytes"])


def _huge_array(header) -> None:
    header["arrays"] = [["train_images", "|u1", [1 << 40], 0]]  # one 1 TiB array, and the total to match
    header["bytes"] = 1 << 40


@pytest.mark.parametrize("change, why", [
    (lambda header: header.update(bytes=1 << 40), "its arrays"),
    (_huge_array, "free memory"),
])
def test_an_entry_declaring_more_than_it_holds_or_memory_is_decoded_again(source, cache, change, why):
    """Its header passes its CRC, and the file is as long as it says (sparse): bytearray(1 TiB) was a
    MemoryError traceback."""
    decode = Decoder(source)
    load(source, decode)
    [entry] = entries(cache)
    rewrite_header(entry, change)
    again = load(source, decode)
    assert decode.calls == 2 and why in again.provenance.cache_note, again.provenance.cache_note
    same(again, tiny(source.parent, 0))
