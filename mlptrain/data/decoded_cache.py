"""Decoded built-in datasets kept on disk, so a run does not gunzip, verify and decode the same files again.

Decoding MNIST from its four .gz files (gunzip, two md5s, the pixel statistics) takes ~0.3 s of every
run's start; reading back the decoded arrays takes a few hundredths. One entry per dataset folder (and
label set) lives under the user's cache folder, not beside the data: a shared, read-only data folder
gets the cache too.

An entry is `MAGIC`, the length and CRC-32 of a JSON header, the header, then the arrays' raw bytes. The header
holds the key (the dataset, the folder, and each source file's size, mtime, ctime and inode as `stat`
reports them), the ImageDataset's other fields (mean and std as JSON floats, which read back bitwise;
the md5s verified when the entry was written) and the CRC-32 of the arrays' bytes. An entry is used only when its
key is the current one (else the files changed: decoded again, the entry replaced, nothing said) and its
length and CRC match (else it is corrupt: decoded again and rewritten, with one warning line). It is
written to a temporary file and renamed into place, so concurrent runs each leave a whole entry.

What the cache could not do reaches the user as the dataset's `cache_note`, which a run warns once and
records in summary.json's `fallbacks` (mlptrain.training.fallbacks): the folder cannot be written (read-only, full,
not a folder), or an entry was corrupt. `MLPTRAIN_DATA_CACHE=off` turns the cache off without a word.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mlptrain.data.dataset import ImageDataset, Provenance
from mlptrain.util.atomic import replacing
from mlptrain.util.host_memory import host_available
from mlptrain.util.regular_file import open_regular
from mlptrain.util.user_paths import cache_folder

CACHE_ENV = "MLPTRAIN_DATA_CACHE"
MAGIC = b"MLPTRAIN-DATASET-1\n"
FORMAT = 1  # bump when a loader decodes differently: every older entry then misses
PREFIX = len(MAGIC) + 8 + 4  # the magic, the header's length and its CRC-32
MAX_HEADER = 1 << 20
ALIGN = 64
ARRAYS = ("train_images", "train_labels", "test_images", "test_labels", "val_images", "val_labels")
ENTRY = re.compile(r"[^.].*-[0-9a-f]{16}\.data")  # see entry_path
STRAY = re.compile(r"\.[^.].*-[0-9a-f]{16}\.data\.[0-9a-f]{8}\.tmp")  # a write that did not finish (atomic.replacing)


class CorruptEntry(Exception):
    """An entry that is not a whole, well-formed one (its reason is the message)."""


def cache_dir() -> Path | None:
    """$MLPTRAIN_DATA_CACHE (a folder; `off` turns the cache off: None), else $XDG_CACHE_HOME/mlptrain/decoded
    or ~/.cache/mlptrain/decoded."""
    return cache_folder(CACHE_ENV, "decoded")


def entry_path(root: Path, name: str, folder: Path, label: str | None) -> Path:
    where = hashlib.sha256(json.dumps([name, str(folder), label]).encode()).hexdigest()[:16]
    return root / f"{name}-{where}.data"


def entries(root: Path) -> list[Path]:
    """The entries in `root`: only files named as `entry_path` names them, so a cache folder pointed at
    a folder of other things (MLPTRAIN_DATA_CACHE=~) shows and loses none of them."""
    try:
        return sorted(p for p in root.iterdir() if ENTRY.fullmatch(p.name) and p.is_file())
    except OSError:  # absent or unreadable: nothing of ours to show
        return []


def clear(root: Path) -> int:
    """Remove every entry and the temporary files of interrupted writes; returns the entries removed.
    Safe while a run reads one: its open file stays readable, and the next run decodes again."""
    try:
        listing = list(root.iterdir())
    except OSError:  # absent or unreadable: nothing of ours to remove
        return 0
    ours = [p for p in listing if ENTRY.fullmatch(p.name) and p.is_file()]
    for path in ours + [p for p in listing if STRAY.fullmatch(p.name)]:
        path.unlink(missing_ok=True)
    return len(ours)


def source_key(name: str, folder: Path, label: str | None, sources: list[Path]) -> dict:
    """What an entry must have been made from: a change to any source file changes its stat (ctime and the
    inode as well as size and mtime, so even a same-sized copy with its old mtime restored misses). The folder
    as given too: the dataset's record names it so (a link to the same folder is another key)."""
    files = []
    for path in sources:
        st = path.stat()
        files.append([path.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
    return {"format": FORMAT, "dataset": name, "folder": str(folder), "resolved": str(folder.resolve()),
            "label": label, "files": files}


def load_cached(name: str, folder: Path, label: str | None, sources: list[Path],
                decode: Callable[[], ImageDataset]) -> ImageDataset:
    """The dataset `decode()` returns for the files `sources` in `folder`, from the cache when it holds them
    unchanged; else decoded (refusals are decode's) and stored. See the module docstring."""
    root = cache_dir()
    if root is None:
        return decode()
    try:
        path, key = entry_path(root, name, folder.resolve(), label), source_key(name, folder, label, sources)
    except OSError:  # a source file that cannot be looked at: decoding names it in its own refusal
        return decode()
    problem = None
    try:
        return read_entry(path, key)
    except (FileNotFoundError, NotADirectoryError):  # absent, stale, or no cache folder (the write says why)
        pass
    except CorruptEntry as why:
        problem = f"{path} {why}"
    except OSError as err:
        problem = f"cannot read {path} ({err.strerror or err})"
    dataset = decode()
    not_written = write_entry(path, key, dataset)
    if problem is not None:
        done = "the entry rewritten" if not_written is None else f"the entry not rewritten ({not_written})"
        note = f"data cache: {problem}; {name} decoded from {folder} again, {done}"
    elif not_written is not None:
        note = (f"data cache: cannot write {root} ({not_written}); {name} is decoded from its files on every run "
                f"(set {CACHE_ENV} to a writable folder, or to off)")
    else:
        return dataset
    return dataclasses.replace(dataset, provenance=dataclasses.replace(dataset.provenance, cache_note=note))


def read_entry(path: Path, key: dict) -> ImageDataset:
    """The dataset stored at `path` for `key`; FileNotFoundError when absent or made from other files
    (stale), CorruptEntry when damaged, OSError when unreadable."""
    with open_regular(path) as file:  # a FIFO here would block open() forever
        size = os.fstat(file.fileno()).st_size
        head = file.read(PREFIX)
        if len(head) < PREFIX or not head.startswith(MAGIC):
            raise CorruptEntry("is not a data cache entry")
        length = int.from_bytes(head[len(MAGIC):len(MAGIC) + 8], "little")
        text = file.read(min(length, MAX_HEADER))
        if len(text) != length or zlib.crc32(text) != int.from_bytes(head[-4:], "little"):
            raise CorruptEntry("has a damaged or truncated header")
        try:
            header = json.loads(text)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise CorruptEntry("has a damaged header") from None
        if not isinstance(header, dict) or header.get("key") != key:
            raise FileNotFoundError(path)  # stale: its files changed since (or another folder's entry)
        try:
            start, total = PREFIX + length, header["bytes"]
            if size != start + total:
                raise CorruptEntry(f"is truncated or padded ({size} bytes, expected {start + total})")
            _check_declared(header, total)
            file.seek(start)
            data = bytearray(total)
            if file.readinto(data) != total or zlib.crc32(data) != header["crc32"]:
                raise CorruptEntry("fails its CRC-32 check")
            return _dataset(header, data)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptEntry(f"has a damaged header ({type(err).__name__}: {err})") from None


def _check_declared(header: dict, total: int) -> None:
    """The header's sizes before `total` bytes are allocated: a header that passes its CRC-32 yet declares more
    than its arrays hold, or more than free memory (a huge sparse file), is corrupt, not a MemoryError."""
    ends = [offset + int(np.prod(shape)) * np.dtype(dtype).itemsize for _, dtype, shape, offset in header["arrays"]]
    if total != max(ends, default=0):
        raise CorruptEntry(f"declares {total:,} bytes, its arrays {max(ends, default=0):,}")
    free = host_available()
    if free is not None and total > free:
        raise CorruptEntry(f"declares {total:,} bytes, more than the {free:,} bytes of free memory")


def _dataset(header: dict, data: bytearray) -> ImageDataset:
    arrays = {}
    for name, dtype, shape, offset in header["arrays"]:
        if name not in ARRAYS:
            raise ValueError(f"unknown array {name!r}")
        count = int(np.prod(shape))
        arrays[name] = np.frombuffer(data, np.dtype(dtype), count, offset).reshape(shape)
    fields = header["fields"]
    provenance = Provenance(fields["location"], tuple(tuple(c) for c in fields["checksums"]), fields["label"],
                            read_note=fields.get("read_note"))  # an entry from before the note: none
    return ImageDataset(name=fields["name"], image_shape=tuple(fields["image_shape"]),
                        num_classes=fields["num_classes"], mean=fields["mean"], std=fields["std"],
                        class_names=tuple(fields["class_names"]), value_scale=fields["value_scale"],
                        provenance=provenance, **arrays)


def write_entry(path: Path, key: dict, dataset: ImageDataset) -> str | None:
    """Store `dataset` at `path` (temporary file, then rename); None when written, else why not."""
    placed, chunks, crc, at = [], [], 0, 0
    for name in ARRAYS:
        array = getattr(dataset, name)
        if array is None:
            continue
        padding = -at % ALIGN
        chunks += [bytes(padding), memoryview(np.ascontiguousarray(array)).cast("B")]
        placed.append([name, array.dtype.str, list(array.shape), at + padding])
        at += padding + array.nbytes
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    source = dataset.provenance
    fields = {"name": dataset.name, "image_shape": list(dataset.image_shape), "num_classes": dataset.num_classes,
              "mean": dataset.mean, "std": dataset.std, "class_names": list(dataset.class_names),
              "value_scale": dataset.value_scale, "location": source.location,
              "checksums": [list(c) for c in source.checksums], "label": source.label, "read_note": source.read_note}
    text = json.dumps({"key": key, "fields": fields, "arrays": placed, "bytes": at, "crc32": crc}).encode()
    text = text.ljust(len(text) + -(PREFIX + len(text)) % ALIGN)  # JSON ignores the trailing spaces
    prefix = MAGIC + len(text).to_bytes(8, "little") + zlib.crc32(text).to_bytes(4, "little")
    return _replace(path, [prefix, text, *chunks])


def _replace(path: Path, parts: list) -> str | None:
    """No fsync: a torn entry after a crash fails its length or CRC check and is rebuilt."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, durable=False) as file:
            for part in parts:
                file.write(part)
        return None
    except OSError as err:
        return err.strerror or str(err)
