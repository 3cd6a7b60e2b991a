"""The in-memory form every dataset loader returns, where datasets live on disk, the statistics
a network normalises with, and the record of what a run actually read."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlptrain.data.registry import BUILTIN
from mlptrain.errors import UserError
from mlptrain.util.user_paths import expand_user, user_cache_dir

PIXEL_SCALE = 255.0  # uint8 pixels are divided by this before standardising; float features by 1
CHUNK_VALUES = 1 << 20  # values per chunk of the statistics: bounded temporary memory on any dataset


@dataclass(frozen=True)
class Provenance:
    """Where a dataset's arrays came from, for the run's record (see `dataset_record`)."""

    location: str = ""  # the folder or file read
    checksums: tuple[tuple[str, str], ...] = ()  # (file, hex md5 of its content; of the decompressed bytes for gzip)
    label: str | None = None  # which of several label sets (cifar100: fine or coarse)
    cache_note: str | None = None  # what the decoded-data cache could not do (a fallback line; decoded_cache)
    read_note: str | None = None  # files reading skipped or converted (a fallback line; image_folder)


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays with == has no single truth value
class ImageDataset:
    """A labelled classification dataset, held on the host.

    Images are flattened to (N, D) with D = prod(image_shape), C-contiguous, one
    row per sample, so the device loader can copy them once and gather rows by
    index: uint8 pixels (image_shape (C, H, W), planes in turn) or float32
    features (image_shape (D,)). Labels are uint8 class indices in
    [0, num_classes). A network sees `(value / value_scale - mean) / std`, with
    mean and std computed over the training values (`value_statistics`).
    `val_images` / `val_labels` are a validation split of the dataset's own
    (an npz's `x_val`); without them validation rows are held out of the training part.

    The arrays may be read-only views of the decoded file bytes: copy before
    modifying them.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    image_shape: tuple[int, ...]
    num_classes: int
    mean: float
    std: float
    class_names: tuple[str, ...] = ()  # empty: the class indices as text
    value_scale: float = PIXEL_SCALE
    val_images: np.ndarray | None = None
    val_labels: np.ndarray | None = None
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self):
        # A loader bug, not a user mistake: fail loudly here rather than inside a kernel.
        if not self.class_names:
            object.__setattr__(self, "class_names", tuple(str(i) for i in range(self.num_classes)))
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{self.name}: {len(self.class_names)} class names for {self.num_classes} classes")
        features = int(np.prod(self.image_shape))
        for split in ("train", "val", "test"):
            images = getattr(self, f"{split}_images")
            labels = getattr(self, f"{split}_labels")
            if images is None and split == "val" and labels is None:
                continue
            if images.dtype not in (np.uint8, np.float32) or images.ndim != 2 or images.shape[1] != features:
                raise ValueError(f"{self.name} {split} images: expected uint8 or float32 (N, {features}), "
                                 f"got {images.dtype} {images.shape}")
            if images.dtype != self.train_images.dtype:
                raise ValueError(f"{self.name} {split} images are {images.dtype}, train images {self.train_images.dtype}")
            if not images.flags.c_contiguous:
                raise ValueError(f"{self.name} {split} images are not C-contiguous")
            if labels is None or labels.dtype != np.uint8 or labels.shape != (images.shape[0],):
                got = "none" if labels is None else f"{labels.dtype} {labels.shape}"
                raise ValueError(f"{self.name} {split} labels: expected uint8 ({images.shape[0]},), got {got}")

    @property
    def num_features(self) -> int:
        """Values per flattened image (784 for MNIST)."""
        return self.train_images.shape[1]

    @property
    def has_val_split(self) -> bool:
        """Whether the dataset brings its own validation split (else it is held out of train)."""
        return self.val_images is not None


def default_data_root() -> Path:
    """Folder holding one sub-folder per dataset (`mnist/`, ...).

    `$MLPTRAIN_DATA_DIR` when set, else `$XDG_CACHE_HOME/mlptrain`, else
    `~/.cache/mlptrain`.
    """
    explicit = os.environ.get("MLPTRAIN_DATA_DIR")
    if explicit:
        return expand_user(explicit, "MLPTRAIN_DATA_DIR")
    return user_cache_dir() / "mlptrain"


def value_statistics(images: np.ndarray, value_scale: float, source: str) -> tuple[float, float]:
    """(mean, std) over every value of `images` / value_scale, raising `UserError` naming `source`
    when they are all equal (std 0 would divide by zero when standardising).

    uint8 pixels: exact integer sums of the values and their squares (a square fits uint16),
    chunk by chunk through one small buffer, ~1 ns a pixel. Float features: float64 sums in
    chunks, the variance about the mean (two passes: no cancellation)."""
    flat = images.reshape(-1)
    n = flat.size
    if n == 0:
        raise UserError(f"{source}: no training values to compute the mean and std from")
    chunks = range(0, n, CHUNK_VALUES)
    if images.dtype == np.uint8:
        total = squares = 0
        buffer = np.empty(min(n, CHUNK_VALUES), np.uint16)
        for start in chunks:
            chunk = buffer[:min(CHUNK_VALUES, n - start)]
            np.copyto(chunk, flat[start:start + CHUNK_VALUES])
            total += int(chunk.sum(dtype=np.uint64))
            np.multiply(chunk, chunk, out=chunk)
            squares += int(chunk.sum(dtype=np.uint64))
        mean = total / n / value_scale
        variance = (squares * n - total * total) / (n * n) / value_scale ** 2  # exact integers until the divide
    else:
        total = sum(float(flat[s:s + CHUNK_VALUES].sum(dtype=np.float64)) for s in chunks)
        mean = total / n / value_scale
        variance = sum(float(np.square(flat[s:s + CHUNK_VALUES].astype(np.float64) / value_scale - mean).sum())
                       for s in chunks) / n
    if variance <= 0:
        raise UserError(f"{source}: every training value is {flat[0]}; a constant input has nothing to learn from")
    std = float(np.sqrt(variance))
    with np.errstate(over="ignore"):  # the model's input is value * (1 / std) - mean / std, in float32
        representable = np.isfinite(np.float32(1.0 / (value_scale * std))) and np.isfinite(np.float32(mean / std))
    if not representable:
        raise UserError(f"{source}: values of mean {mean:.3g} spread by a standard deviation of only {std:.3g}; "
                        "standardising them overflows float32: scale or centre the features first")
    return mean, std


def is_subset(dataset: ImageDataset) -> bool | None:
    """Whether a built-in dataset holds fewer images than published (e.g. the project's cifar10-subset/);
    None for data the table does not know (npz, folder), whose full size nobody published."""
    spec = BUILTIN.get(dataset.name)
    if spec is None:
        return None
    train, test = spec.sizes
    return len(dataset.train_images) < train or len(dataset.test_images) < test


def manifest_checksum(checksums: tuple[tuple[str, str], ...]) -> str:
    """One md5 for a set of files: over their `md5  name` lines sorted by name (md5sum's format)."""
    lines = "".join(f"{md5}  {name}\n" for name, md5 in sorted(checksums))
    return hashlib.md5(lines.encode()).hexdigest()


def held_out_rows(val_size: int | float, n: int) -> int:
    """The training images `data.val_size` holds out of `n`: a count as it is, a fraction of `n` rounded to the
    nearest image."""
    return val_size if isinstance(val_size, int) else int(round(val_size * n))


def dataset_record(dataset: ImageDataset, val_size: int | float) -> dict:
    """What a run read, as plain values for config.yaml and summary.json: the dataset's name (and
    label set), where it came from, its shape and classes, the sizes of the train / val / test
    splits this run uses (`val_size` training images held out unless the dataset has its own
    validation split), whether it is a subset of the canonical dataset, and one checksum of its files."""
    source = dataset.provenance
    held_out = 0 if dataset.has_val_split else held_out_rows(val_size, len(dataset.train_images))
    val = len(dataset.val_images) if dataset.has_val_split else held_out
    train = len(dataset.train_images) - held_out
    record = {"name": dataset.name}
    if source.label is not None:
        record["label"] = source.label
    record.update({
        "location": source.location, "shape": list(dataset.image_shape),
        "dtype": str(dataset.train_images.dtype), "classes": dataset.num_classes,
        "train": train, "val": val, "test": len(dataset.test_images), "subset": is_subset(dataset),
        "files": len(source.checksums), "checksum": manifest_checksum(source.checksums) if source.checksums else None,
        # what a model needs to read new images as it read these (recorded_dataset): a run predicts and exports
        # with no dataset at hand
        "inputs": {"mean": float(dataset.mean), "std": float(dataset.std), "value_scale": float(dataset.value_scale),
                   "class_names": [str(name) for name in dataset.class_names]},
    })
    return record


def recorded_dataset(record: dict) -> ImageDataset | None:
    """A dataset without images that feeds a model exactly as the one `dataset_record` described did (its
    shape, storage type, classes, class names and normalisation): what predict and export need. None for
    a record without `inputs` (a run from before runs kept them) or one that does not read back."""
    try:
        inputs, shape = record["inputs"], tuple(int(n) for n in record["shape"])
        dtype = np.dtype(record["dtype"])
        names = tuple(str(name) for name in inputs["class_names"])
        if dtype not in (np.uint8, np.float32) or not shape or min(shape) < 1:
            return None
        images, labels = np.empty((0, int(np.prod(shape))), dtype), np.empty(0, np.uint8)
        return ImageDataset(str(record["name"]), images, labels, images, labels, shape, int(record["classes"]),
                            float(inputs["mean"]), float(inputs["std"]), names, float(inputs["value_scale"]),
                            provenance=Provenance(location=str(record.get("location", ""))))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
