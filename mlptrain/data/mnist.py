"""MNIST: find the four IDX files (downloading the missing ones), verify, decode."""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.data.dataset import ImageDataset, default_data_root
from mlptrain.data.download import fetch
from mlptrain.data.idx import parse_idx, read_decompressed
from mlptrain.errors import UserError

# Tried in order; the first is the mirror torchvision uses, the second the original.
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
# Per-pixel constants of the 60,000 training images (pixel / 255), as everyone uses them.
MEAN, STD = 0.1307, 0.3081
_FIX = "delete it so it is downloaded again"


@dataclass(frozen=True)
class MnistFile:
    """One canonical MNIST file: its name without `.gz` and the md5s of the canonical
    download (gzip) and of its decompressed content (which also fixes its shape)."""

    name: str
    gz_md5: str
    content_md5: str


# Files on disk are checked by the md5 of their decompressed content: a re-compressed
# copy (other gzip level or tool) is as good as the canonical download.
FILES = {
    "train_images": MnistFile("train-images-idx3-ubyte", "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                              "6bbc9ace898e44ae57da46a324031adb"),
    "train_labels": MnistFile("train-labels-idx1-ubyte", "d53e105ee54ea40749a09fcbcd1e9432",
                              "a25bea736e30d166cdddb491f175f624"),
    "test_images": MnistFile("t10k-images-idx3-ubyte", "9fb629c4189551a2d022fa330f9573f3",
                             "2646ac647ad5339dbf082846283269ea"),
    "test_labels": MnistFile("t10k-labels-idx1-ubyte", "ec29112dd5afa0611ce80d1b7f02629c",
                             "27ae3e4e09519cfbb04c329615203637"),
}


def load_mnist(root: Path | None = None) -> ImageDataset:
    """MNIST from `<root>/mnist/` (root defaults to `default_data_root()`).

    Each file is read as `<name>.gz` or, failing that, the un-gzipped `<name>`;
    missing ones are downloaded from `MIRRORS`. Images come back flattened to
    (N, 784) uint8, labels as (N,) uint8 in 0..9. Raises `UserError` for a
    file that cannot be found or fetched, or whose content is not the canonical one.
    """
    folder = Path(root if root is not None else default_data_root()) / "mnist"
    _download_missing(folder)
    arrays = {key: _read_verified(_find(folder, file), file) for key, file in FILES.items()}
    for split in ("train", "test"):  # the content md5s already fixed every shape and label
        images = arrays[f"{split}_images"]
        arrays[f"{split}_images"] = images.reshape(len(images), -1)
    return ImageDataset(name="mnist", image_shape=(1, 28, 28), num_classes=10, mean=MEAN, std=STD, **arrays)


def _find(folder: Path, file: MnistFile) -> Path | None:
    """The file on disk for `file`: gzip name first, then the raw name; None if neither."""
    for path in (folder / f"{file.name}.gz", folder / file.name):
        if path.is_file():
            return path
    return None


def _download_missing(folder: Path) -> None:
    """Fetch every file `_find` does not see, verified against the canonical .gz md5."""
    for file in FILES.values():
        if _find(folder, file) is not None:
            continue
        urls = [mirror + f"{file.name}.gz" for mirror in MIRRORS]
        try:
            fetch(urls, folder / f"{file.name}.gz", file.gz_md5)
        except UserError as error:
            missing = [f"{f.name}.gz" for f in FILES.values() if _find(folder, f) is None]
            raise UserError(
                f"MNIST files missing from {folder}: {', '.join(missing)} ({error}); "
                f"download them into that folder, or set MLPTRAIN_DATA_DIR to a folder that holds mnist/"
            ) from None


def _read_verified(path: Path, file: MnistFile) -> np.ndarray:
    """Decompress once, check the content md5 on the bytes in memory, then decode."""
    try:
        data = read_decompressed(path)
    except UserError as error:
        raise UserError(f"{error}; {_FIX}") from None
    digest = hashlib.md5(data).hexdigest()
    if digest != file.content_md5:
        raise UserError(f"{path} is corrupt: md5 of its content is {digest}, "
                        f"expected {file.content_md5}; {_FIX}")
    return parse_idx(data, path)
