"""MNIST, Fashion-MNIST and KMNIST: the four IDX files of each (one layout, see `registry`),
found under `<root>/<name>/` or downloaded, verified, decoded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mlptrain.data.dataset import PIXEL_SCALE, ImageDataset, Provenance, default_data_root, value_statistics
from mlptrain.data.decoded_cache import load_cached
from mlptrain.data.download import fetch, offline_error, prepare_folder, read_bytes, remove_empty
from mlptrain.data.idx import GZIP_MAGIC, gunzip_if_gzipped, parse_idx
from mlptrain.data.registry import BuiltinDataset, DataFile
from mlptrain.errors import UserError

_FIX = "delete it so it is downloaded again"
SPLITS = ("train", "test")


def load_mnist_family(spec: BuiltinDataset, root: Path | None = None) -> ImageDataset:
    """The IDX dataset `spec` from `<root>/<spec.name>/` (root defaults to `default_data_root()`).

    Each file is read as `<name>.gz` or, failing that, the un-gzipped `<name>`; missing ones are
    downloaded from the mirrors (the folder is created first). A file must match its published
    md5 (of the .gz), or the md5 of its decompressed content where the table knows it. Where the table
    knows only the .gz's md5 (Fashion-MNIST, KMNIST), a re-compressed or un-gzipped copy cannot be
    verified by checksum: it is read when its structure is right (IDX magic and dimensions, the image
    size, one label per image, labels in range), and one warning line, recorded among the run's
    fallbacks, says so. Images come back flattened to (N, 784) uint8, labels as (N,) uint8. Raises
    `UserError` for a file that cannot be found, fetched, decoded or verified.
    """
    folder = Path(root if root is not None else default_data_root()) / spec.name
    _download_missing(spec, folder)
    sources = [_find(folder, file) for file in (*spec.train, *spec.test)]
    return load_cached(spec.name, folder, None, sources, lambda: _decode(spec, folder))


def _decode(spec: BuiltinDataset, folder: Path) -> ImageDataset:
    arrays, checksums, unverified = {}, [], []
    for split, (images_file, labels_file) in zip(SPLITS, (spec.train, spec.test)):
        images, images_md5, images_path = _read_verified(folder, images_file, unverified)
        labels, labels_md5, labels_path = _read_verified(folder, labels_file, unverified)
        _check_shapes(spec, images_path, images, labels_path, labels)
        arrays[f"{split}_images"] = images.reshape(len(images), -1)
        arrays[f"{split}_labels"] = labels
        checksums += [(images_file.name, images_md5), (labels_file.name, labels_md5)]
    mean, std = value_statistics(arrays["train_images"], PIXEL_SCALE, str(folder))
    names = spec.label_sets[0].class_names
    return ImageDataset(name=spec.name, image_shape=spec.image_shape, num_classes=len(names), mean=mean, std=std,
                        class_names=names, provenance=Provenance(str(folder), tuple(checksums),
                                                                 read_note=_unverified_note(spec, unverified)),
                        **arrays)


def _unverified_note(spec: BuiltinDataset, unverified: list[Path]) -> str | None:
    if not unverified:
        return None
    many = len(unverified) > 1
    return (f"{spec.title}: {len(unverified)} file{'s' if many else ''} could not be verified by checksum (a "
            f"re-compressed or uncompressed copy; only the published .gz md5s are known), e.g. {unverified[0]}; "
            f"{'their' if many else 'its'} structure is right (IDX header, {spec.image_shape[1]}x{spec.image_shape[2]} "
            f"images, one label per image in 0..{spec.num_classes - 1}), so {'they are' if many else 'it is'} read")


def _find(folder: Path, file: DataFile) -> Path | None:
    """The file on disk for `file`: gzip name first, then the raw name; None if neither."""
    for path in (folder / f"{file.name}.gz", folder / file.name):
        if path.is_file():
            return path
    return None


def _download_missing(spec: BuiltinDataset, folder: Path) -> None:
    """Fetch every file `_find` does not see, verified against its published .gz md5."""
    files = (*spec.train, *spec.test)
    missing = [file for file in files if _find(folder, file) is None]
    if not missing:
        return
    created = prepare_folder(folder)
    for file in missing:
        try:
            fetch([mirror + f"{file.name}.gz" for mirror in spec.mirrors], folder / f"{file.name}.gz", file.md5)
        except UserError as error:
            still = [(f"{f.name}.gz", spec.mirrors[0] + f"{f.name}.gz") for f in files if _find(folder, f) is None]
            remove_empty(created)
            raise offline_error(spec.title, folder, error, still) from None


def _read_verified(folder: Path, file: DataFile, unverified: list) -> tuple[np.ndarray, str, Path]:
    """(decoded array, md5 of the decompressed content, path) of `file`, which must be the published one;
    a copy that no known checksum can verify is added to `unverified` (its structure is checked after)."""
    path = _find(folder, file)
    raw = read_bytes(path)
    raw_md5 = hashlib.md5(raw).hexdigest() if raw.startswith(GZIP_MAGIC) else None  # None: not gzipped
    published = raw_md5 == file.md5
    try:
        content = gunzip_if_gzipped(raw, path)
    except UserError as error:
        raise UserError(f"{error}; {_FIX}") from None
    digest = hashlib.md5(content).hexdigest()
    if not published and digest != file.content_md5:
        if file.content_md5 is not None:  # the content's md5 is known, and this is not it: damaged
            raise UserError(_mismatch(path, file, digest))
        unverified.append(path)
    return parse_idx(content, path), digest, path


def _mismatch(path: Path, file: DataFile, digest: str) -> str:
    """A copy whose content md5 is known and differs: damaged (any copy of the right content verifies)."""
    return f"{path} is corrupt: md5 of its content is {digest}, expected {file.content_md5}; {_FIX}"


def _check_shapes(spec: BuiltinDataset, images_path: Path, images: np.ndarray, labels_path: Path,
                  labels: np.ndarray) -> None:
    """The decoded arrays have the table's image size, one label per image, labels in range: the md5s
    already guarantee this for canonical files, so this only catches a wrong table entry."""
    _, height, width = spec.image_shape
    if images.ndim != 3 or images.shape[1:] != (height, width):
        raise UserError(f"{images_path}: images of shape {images.shape[1:]}, expected {(height, width)}")
    if labels.shape != (len(images),):
        raise UserError(f"{labels_path}: {labels.shape} labels for {len(images)} images")
    if len(labels) and labels.max() >= spec.num_classes:
        raise UserError(f"{labels_path}: label {labels.max()} is not one of 0..{spec.num_classes - 1}")
