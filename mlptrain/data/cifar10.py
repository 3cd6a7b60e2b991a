"""CIFAR-10: find the python-pickle batches (downloading and extracting the archive
when they are absent), verify, decode.

Where the batches are read from, under the data root:

    cifar10/cifar-10-batches-py/         the cache; when `cifar10/` exists but this does not,
                                         `cifar10/cifar-10-python.tar.gz` is downloaded (or taken
                                         as found, if its md5 is right), kept, and extracted here
    cifar10-subset/cifar-10-batches-py/  a subset in the same format (as in ../shared/datasets),
                                         read only when `cifar10/` does not exist

With neither, the archive is downloaded into `cifar10/` as above.
"""

import gzip
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from mlptrain.data.cifar_batch import IMAGE_SHAPE, NUM_CLASSES, read_cifar_batch
from mlptrain.data.dataset import ImageDataset, default_data_root
from mlptrain.data.download import CHUNK_BYTES, fetch, md5sum
from mlptrain.errors import UserError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
BATCH_FOLDER = "cifar-10-batches-py"
CACHE_FOLDER, SUBSET_FOLDER = "cifar10", "cifar10-subset"  # under the data root
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
# Every member of the canonical archive besides its folder; only these are extracted.
MEMBERS = (*TRAIN_BATCHES, TEST_BATCH, "batches.meta", "readme.html")

# Scalar constants over all pixels (pixel / 255) of the 50,000 training images:
# the mean of the usual per-channel means (0.49139968, 0.48215827, 0.44653124), and
# the pooled std sqrt(mean(std_c^2) + var(mean_c)) from the per-channel stds
# (0.24703233, 0.24348505, 0.26158768). The 5,085-image subset gives 0.4755, 0.2525.
MEAN, STD = 0.4734, 0.2516

# (size, md5) of the canonical batch files (md5s as torchvision lists them). A file
# of exactly this size is taken to be the canonical one, so its md5 must match:
# that catches flipped bytes the structural checks cannot see. Other files (subsets,
# re-pickled copies) are accepted on structure alone.
CANONICAL = {
    "data_batch_1": (31035704, "c99cafc152244af753f735de768cd75f"),
    "data_batch_2": (31035320, "d4bba439e000b95fd0a9bffe97cbabec"),
    "data_batch_3": (31035999, "54ebc095f3ab1f0389bbae665268c751"),
    "data_batch_4": (31035696, "634d18415352ddfa80567beed471001a"),
    "data_batch_5": (31035623, "482c414d41f54cd18b22e5b47cb7c3cb"),
    "test_batch": (31035526, "40351d587109b95175f43aff81a1287e"),
}


def load_cifar10(root: Path | None = None) -> ImageDataset:
    """CIFAR-10 from the batch folder under `root` that the module docstring
    describes (root defaults to `default_data_root()`), downloaded when absent.

    Images come back flattened to (N, 3072) uint8 in the canonical R, G, B planes
    of 32x32, labels as (N,) uint8 in 0..9; every batch may hold any number of rows.
    Raises `UserError` for a batch folder or file that is missing, damaged or
    unsafe, and when the archive cannot be fetched.
    """
    root = Path(root if root is not None else default_data_root())
    folder = _batch_folder(root)
    missing = [name for name in (*TRAIN_BATCHES, TEST_BATCH) if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder}: missing {', '.join(missing)}; {_fix(folder)}")
    train = [_read_verified(folder / name) for name in TRAIN_BATCHES]
    test_images, test_labels = _read_verified(folder / TEST_BATCH)
    return ImageDataset(
        name="cifar10", image_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES, mean=MEAN, std=STD,
        train_images=np.concatenate([images for images, _ in train]),
        train_labels=np.concatenate([labels for _, labels in train]),
        test_images=test_images, test_labels=test_labels,
    )


def _batch_folder(root: Path) -> Path:
    cache, subset = root / CACHE_FOLDER, root / SUBSET_FOLDER / BATCH_FOLDER
    # A cifar10/ folder, even one holding only the archive, says the full set is wanted.
    if not cache.is_dir() and subset.is_dir():
        return subset
    if (cache / BATCH_FOLDER).is_dir():
        return cache / BATCH_FOLDER
    return _download_and_extract(cache)


def _fix(folder: Path) -> str:
    """How to repair a damaged file in `folder`: the cache is rebuilt, a subset is not ours to rebuild."""
    if folder.parent.name == CACHE_FOLDER:
        return f"delete the folder {folder} so it is extracted (and if need be downloaded) again"
    cache = folder.parent.parent / CACHE_FOLDER
    return f"restore it, or create the folder {cache} so the full CIFAR-10 is downloaded there instead"


def _read_verified(path: Path) -> tuple[np.ndarray, np.ndarray]:
    size, md5 = CANONICAL[path.name]
    if path.stat().st_size == size and (digest := md5sum(path)) != md5:
        raise UserError(f"{path} is corrupt: it has the canonical size but md5 {digest}, "
                        f"expected {md5}; {_fix(path.parent)}")
    try:
        return read_cifar_batch(path)
    except UserError as error:
        raise UserError(f"{error}; {_fix(path.parent)}") from None


def _download_and_extract(folder: Path) -> Path:
    """`folder/BATCH_FOLDER`, extracted from `folder/ARCHIVE`, which is fetched unless already there and intact."""
    archive = folder / ARCHIVE
    found = md5sum(archive) if archive.is_file() else None
    if found != ARCHIVE_MD5:
        try:
            fetch([URL], archive, ARCHIVE_MD5)
        except UserError as error:
            damaged = f"; the {ARCHIVE} there has md5 {found}, expected {ARCHIVE_MD5}" if found else ""
            raise UserError(
                f"CIFAR-10 is not in {folder.parent} ({error}){damaged}; download {URL} into {folder} "
                f"(it is extracted on the next run), or extract it there so that {folder / BATCH_FOLDER} holds "
                f"{', '.join(TRAIN_BATCHES)} and {TEST_BATCH}, or set MLPTRAIN_DATA_DIR to a folder that holds cifar10/"
            ) from None
    return _extract(archive, folder)


def _extract(archive: Path, folder: Path) -> Path:
    """Extract the known members of `archive` into a hidden temporary folder beside
    the target, then rename it into place: the batch folder is absent or complete."""
    final = folder / BATCH_FOLDER
    try:
        temp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{BATCH_FOLDER}.", suffix=".part"))
        try:
            _extract_members(archive, temp)
            missing = [name for name in (*TRAIN_BATCHES, TEST_BATCH) if not (temp / name).is_file()]
            if missing:
                raise UserError(f"{archive} lacks {', '.join(f'{BATCH_FOLDER}/{m}' for m in missing)}; "
                                f"delete it so it is downloaded again")
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


def _extract_members(archive: Path, temp: Path) -> None:
    """Copy each member of `archive` into `temp` by its base name; refuse any other member."""
    expected = {f"{BATCH_FOLDER}/{name}": name for name in MEMBERS}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                # Only names from our own list are ever written, so no member name can
                # steer a write (absolute paths, `..`, links); anything else means the
                # archive is not the canonical one, and is refused rather than skipped.
                if member.isdir() and name.rstrip("/") == BATCH_FOLDER:
                    continue
                if name not in expected or not member.isfile():
                    raise UserError(f"{archive}: unexpected member {member.name!r} (not a file of "
                                    f"{BATCH_FOLDER}/); delete it so it is downloaded again")
                with tar.extractfile(member) as source, open(temp / expected[name], "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK_BYTES)
    # tarfile reports damage as TarError, EOFError (truncated), zlib.error or BadGzipFile.
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise UserError(f"{archive}: corrupt archive ({error}); delete it so it is downloaded again") from None
