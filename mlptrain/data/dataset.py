"""The in-memory form every dataset loader returns, and where datasets live on disk."""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, eq=False)  # eq=False: comparing arrays with == has no single truth value
class ImageDataset:
    """A labelled image classification dataset, held as uint8 on the host.

    Images are flattened to (N, D) with D = prod(image_shape), C-contiguous, one
    row per image, so the device loader can copy them once and gather rows by
    index. Labels are uint8 class indices in [0, num_classes). A network sees
    `(pixel / 255 - mean) / std`; mean and std are the usual per-dataset
    constants computed over the training images.

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

    def __post_init__(self):
        # A loader bug, not a user mistake: fail loudly here rather than inside a kernel.
        features = int(np.prod(self.image_shape))
        for split in ("train", "test"):
            images = getattr(self, f"{split}_images")
            labels = getattr(self, f"{split}_labels")
            if images.dtype != np.uint8 or images.ndim != 2 or images.shape[1] != features:
                raise ValueError(f"{self.name} {split} images: expected uint8 (N, {features}), "
                                 f"got {images.dtype} {images.shape}")
            if not images.flags.c_contiguous:
                raise ValueError(f"{self.name} {split} images are not C-contiguous")
            if labels.dtype != np.uint8 or labels.shape != (images.shape[0],):
                raise ValueError(f"{self.name} {split} labels: expected uint8 ({images.shape[0]},), "
                                 f"got {labels.dtype} {labels.shape}")

    @property
    def num_features(self) -> int:
        """Values per flattened image (784 for MNIST)."""
        return self.train_images.shape[1]


def default_data_root() -> Path:
    """Folder holding one sub-folder per dataset (`mnist/`, ...).

    `$MLPTRAIN_DATA_DIR` when set, else `$XDG_CACHE_HOME/mlptrain`, else
    `~/.cache/mlptrain`.
    """
    explicit = os.environ.get("MLPTRAIN_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "mlptrain"
