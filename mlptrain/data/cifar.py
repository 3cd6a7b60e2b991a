"""CIFAR-10 and CIFAR-100: find the python-pickle batches (downloading and extracting the
archive when they are absent), verify, decode.

Where the batches are read from, under the data root (shown for CIFAR-10; CIFAR-100 is
`cifar100/cifar-100-python/` with `train` and `test`):

    cifar10/cifar-10-batches-py/         the cache; when `cifar10/` exists but this does not,
                                         `cifar10/cifar-10-python.tar.gz` is downloaded (or taken
                                         as found, if its md5 is right, or if it is another copy
                                         of the same content: re-compressed, its batches with
                                         their published md5s), kept, and extracted here.
                                         Every batch must have its published md5.
    cifar10-subset/cifar-10-batches-py/  a subset in the same format (as in ../shared/datasets),
                                         read only when `cifar10/` does not exist, checked for
                                         structure; a run on it warns and records it (mlptrain.training.fallbacks)

With neither, the archive is downloaded into `cifar10/` as above.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np

from mlptrain.data.cifar_batch import parse_cifar_batch
from mlptrain.data.dataset import PIXEL_SCALE, ImageDataset, Provenance, default_data_root, value_statistics
from mlptrain.data.decoded_cache import load_cached
from mlptrain.data.download import CHUNK_BYTES, fetch, md5sum, offline_error, prepare_folder, read_bytes, remove_empty
from mlptrain.data.registry import BuiltinDataset, DataFile, LabelSet
from mlptrain.errors import UserError


def subset_folder(spec: BuiltinDataset) -> str:
    """The folder under the data root that may hold a subset of `spec` (`cifar10-subset`)."""
    return f"{spec.name}-subset"


def load_cifar(spec: BuiltinDataset, root: Path | None = None, label: str | None = None) -> ImageDataset:
    """The CIFAR dataset `spec` from the batch folder under `root` that the module docstring
    describes (root defaults to `default_data_root()`), downloaded when absent, labelled by the
    label set `label` picks (CIFAR-100: fine, the default, or coarse).

    Images come back flattened to (N, 3072) uint8 in the canonical R, G, B planes of 32x32;
    every batch may hold any number of rows. Raises `UserError` for a batch folder or file that
    is missing, damaged or unsafe, and when the archive cannot be fetched.
    """
    root = Path(root if root is not None else default_data_root())
    folder = _batch_folder(spec, root)
    labels = spec.label_set(label)
    missing = [file.name for file in (*spec.train, *spec.test) if not (folder / file.name).is_file()]
    if missing:
        raise UserError(f"{folder}: missing {', '.join(missing)}; {_fix(spec, folder)}")
    sources = [folder / file.name for file in (*spec.train, *spec.test)]
    return load_cached(spec.name, folder, labels.label, sources, lambda: _decode(spec, folder, labels))


def _decode(spec: BuiltinDataset, folder: Path, labels: LabelSet) -> ImageDataset:
    train = [_read_verified(spec, folder / file.name, file, labels) for file in spec.train]
    test = [_read_verified(spec, folder / file.name, file, labels) for file in spec.test]
    checksums = tuple((file.name, digest) for file, (_, _, digest) in zip((*spec.train, *spec.test), train + test))
    train_images = np.concatenate([images for images, _, _ in train])
    test_images = np.concatenate([images for images, _, _ in test])
    mean, std = value_statistics(train_images, PIXEL_SCALE, str(folder))
    return ImageDataset(
        name=spec.name, image_shape=spec.image_shape, num_classes=len(labels.class_names), mean=mean, std=std,
        train_images=train_images, train_labels=np.concatenate([label for _, label, _ in train]),
        test_images=test_images, test_labels=np.concatenate([label for _, label, _ in test]),
        class_names=labels.class_names,
        provenance=Provenance(str(folder), checksums, labels.label),
    )


def _batch_folder(spec: BuiltinDataset, root: Path) -> Path:
    cache, subset = root / spec.name, root / subset_folder(spec) / spec.batch_folder
    # A cifar10/ folder, even one holding only the archive, says the full set is wanted.
    if not cache.is_dir() and subset.is_dir():
        return subset
    if (cache / spec.batch_folder).is_dir():
        return cache / spec.batch_folder
    return _download_and_extract(spec, cache)


def _is_cache(spec: BuiltinDataset, folder: Path) -> bool:
    return folder.parent.name == spec.name


def _fix(spec: BuiltinDataset, folder: Path) -> str:
    """How to repair a damaged file in `folder`: the cache is rebuilt, a subset is not ours to rebuild."""
    if _is_cache(spec, folder):
        return f"delete the folder {folder} so it is extracted (and if need be downloaded) again"
    return (f"restore it, or create the folder {folder.parent.parent / spec.name} so the full {spec.title} "
            f"is downloaded there instead")


def _read_verified(spec: BuiltinDataset, path: Path, file: DataFile,
                   labels: LabelSet) -> tuple[np.ndarray, np.ndarray, str]:
    """(images, labels, md5) of one batch. In the cache a batch must have its published md5 (that
    catches flipped bytes the structural checks cannot see); a subset's batches are checked for
    structure alone. The file is read once, for its md5 and its batch."""
    data = read_bytes(path)
    digest = hashlib.md5(data).hexdigest()
    if _is_cache(spec, path.parent) and digest != file.md5:
        raise UserError(f"{path} is corrupt: md5 {digest}, expected the published {file.md5}; "
                        f"{_fix(spec, path.parent)}")
    try:
        images, batch_labels = parse_cifar_batch(data, path, labels.key, len(labels.class_names))
    except UserError as error:
        raise UserError(f"{error}; {_fix(spec, path.parent)}") from None
    return images, batch_labels, digest


def _download_and_extract(spec: BuiltinDataset, folder: Path) -> Path:
    """`folder/batch_folder`, extracted from the archive in `folder`, which is fetched unless already there
    and intact. The folder is created first: the message for an offline machine names it."""
    archive = folder / spec.archive.name
    found = md5sum(archive) if archive.is_file() else None
    if found is not None and found != spec.archive.md5:  # another copy of the content (re-compressed)?
        try:
            return _extract(spec, archive, folder, verify_batches=True)
        except UserError:  # not the same content: fetched as if absent (the message names the md5 found)
            pass
    if found != spec.archive.md5:
        created = prepare_folder(folder)
        try:
            fetch(list(spec.mirrors), archive, spec.archive.md5)
        except UserError as error:
            remove_empty(created)
            damaged = f"; the {archive.name} there has md5 {found}, expected {spec.archive.md5}" if found else ""
            batches = ", ".join(f.name for f in (*spec.train, *spec.test))
            raise offline_error(
                spec.title, folder, UserError(f"{error}{damaged}"), [(archive.name, spec.mirrors[0])],
                f"(it is extracted on the next run), or extract it there so that {folder / spec.batch_folder} "
                f"holds {batches},") from None
    return _extract(spec, archive, folder)


def _extract(spec: BuiltinDataset, archive: Path, folder: Path, verify_batches: bool = False) -> Path:
    """Extract the known members of `archive` into a hidden temporary folder beside
    the target, then rename it into place: the batch folder is absent or complete. With
    `verify_batches` (an archive whose own md5 is not the published one) every batch must have
    its published md5 before anything is put in place."""
    final = folder / spec.batch_folder
    try:
        temp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{spec.batch_folder}.", suffix=".part"))
        try:
            _extract_members(spec, archive, temp)
            missing = [f.name for f in (*spec.train, *spec.test) if not (temp / f.name).is_file()]
            if missing:
                raise UserError(f"{archive} lacks {', '.join(f'{spec.batch_folder}/{m}' for m in missing)}; "
                                f"delete it so it is downloaded again")
            wrong = [f.name for f in (*spec.train, *spec.test) if verify_batches and md5sum(temp / f.name) != f.md5]
            if wrong:
                raise UserError(f"{archive}: neither the published archive nor its content ({spec.batch_folder}/"
                                f"{wrong[0]} has another md5)")
            temp.chmod(0o755)  # mkdtemp's 0o700 would hide a shared data root's cache from other users
            try:
                temp.rename(final)
            except OSError:
                if not final.is_dir():  # else another process extracted it first: use theirs
                    raise
        finally:
            shutil.rmtree(temp, ignore_errors=True)  # gone after a successful rename
    except OSError as error:  # damage to the archive became UserError inside: what is left is local
        raise UserError(f"cannot extract {archive} into {folder} ({error.strerror or error})") from None
    return final


def _extract_members(spec: BuiltinDataset, archive: Path, temp: Path) -> None:
    """Copy each member of `archive` into `temp` by its base name; refuse any other member."""
    import lzma  # here: only an archive being extracted needs lzma and tarfile (~5 ms of every start otherwise)
    import tarfile  # here, as lzma above

    names = (*(f.name for f in (*spec.train, *spec.test)), *spec.other_members)
    expected = {f"{spec.batch_folder}/{name}": name for name in names}
    try:
        with tarfile.open(archive, "r:*") as tar:  # gzip as published; another compression of the same content
            for member in tar:
                name = member.name.removeprefix("./")
                # Only names from our own list are ever written, so no member name can
                # steer a write (absolute paths, `..`, links); anything else means the
                # archive is not the canonical one, and is refused rather than skipped.
                if member.isdir() and name.rstrip("/") == spec.batch_folder:
                    continue
                if name not in expected or not member.isfile():
                    raise UserError(f"{archive}: unexpected member {member.name!r} (not a file of "
                                    f"{spec.batch_folder}/); delete it so it is downloaded again")
                with tar.extractfile(member) as source, open(temp / expected[name], "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK_BYTES)
    # tarfile reports damage as TarError, EOFError (truncated), zlib.error, BadGzipFile, LZMAError (an .xz),
    # or an OSError without an errno (bz2's "Invalid data stream"); an OSError with one is local (disk full).
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:
            raise
        detail = " ".join(str(error).split())  # "r:*" lists each method it tried on a line of its own
        raise UserError(f"{archive}: corrupt archive ({detail}); delete it so it is downloaded again") from None
