"""The dataset resident on the device (uint8 pixels or float32 features), and the index arrays
that select batches.

Training and validation share one image array on the device; a split is
only an index array into it. Each step a kernel gathers and normalises the
rows `order[cursor + start:][:rows]` (the cursor on the device), so no image crosses the bus inside
the loop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from mlptrain.data.dataset import held_out_rows
from mlptrain.errors import UserError


@dataclass
class ResidentSplit:
    images: object  # backend uint8 (pixels) or float32 (features) array (N, D)
    labels: object  # backend uint8 array (N,)
    index: np.ndarray  # host int32 rows of `images` in this split
    device_index: object  # the same rows on the device, in their natural order
    # `labels` on the host (None: read them from the device): an evaluation's confusion matrix needs them, and
    # reading them back would wait for every launch queued on the device (a packed lane's queued epoch end)
    host_labels: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.index)


def check_val_size(dataset, val_size: int | float) -> None:
    if dataset.has_val_split or not len(dataset.train_images):  # its own split; test data alone (check_trainable)
        return
    n, rows = len(dataset.train_images), held_out_rows(val_size, len(dataset.train_images))
    if rows >= n:
        given = f"{val_size} ({rows:,} images)" if isinstance(val_size, float) else f"{val_size:,}"
        raise UserError(f"data.val_size: {given} leaves no training images; {dataset.name} has {n:,}, use fewer "
                        "(a count, or a fraction such as 0.1)")


def check_trainable(dataset) -> None:
    """Refuse test data alone (an .npz of x_test and y_test) for training: it is there to be evaluated on."""
    if not len(dataset.train_images):
        raise UserError(f"{dataset.provenance.location or dataset.name}: holds no training images (x_train, y_train), "
                        "only test data: evaluate a run on it (mlptrain evaluate RUN --data dataset=npz,path=FILE), "
                        "or add x_train and y_train to train on it")


def val_size_note(dataset, val_size: int | float) -> str | None:
    """A warning line when validation holds out more than half of the training images (data.val_size 5000 of
    a 5,085-image dataset trains on 85): legal, rarely meant."""
    if dataset.has_val_split:
        return None
    n, rows = len(dataset.train_images), held_out_rows(val_size, len(dataset.train_images))
    if rows * 2 <= n:
        return None
    return (f"data.val_size {val_size} holds out {rows:,} of {dataset.name}'s {n:,} training images, training on "
            f"{n - rows:,}; set a smaller count or a fraction (data.val_size=0.1)")


def resident_splits(dataset, backend, val_size: int | float, seed: int):
    """(train, val, test): `val_size` training images held out by a seeded permutation, or, for a
    dataset with its own validation split, its validation images appended to the training images
    (one resident array, as for a held-out split) and `val_size` unused."""
    check_val_size(dataset, val_size)
    n = len(dataset.train_images)
    val_size = held_out_rows(val_size, n)
    images, labels = dataset.train_images, dataset.train_labels
    if dataset.has_val_split:
        images, labels = np.concatenate([images, dataset.val_images]), np.concatenate([labels, dataset.val_labels])
        train_index = np.arange(n, dtype=np.int32)
        val_index = np.arange(n, len(images), dtype=np.int32)
    else:
        val_index, train_index = held_out_index(n, val_size, seed)
    host = labels
    images, labels = backend.resident(images), backend.resident(labels)
    return (
        ResidentSplit(images, labels, train_index, backend.to_device(train_index), host),
        ResidentSplit(images, labels, val_index, backend.to_device(val_index), host),
        whole_split(backend, dataset.test_images, dataset.test_labels),
    )


@functools.lru_cache(maxsize=16)
def held_out_index(n: int, val_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(val rows, train rows) of `n` training images, `val_size` held out by a permutation seeded by `seed`,
    each sorted; read-only, kept for the next run of the same seed: a session is built three times over
    (twice to count its memory, mlptrain.training.memory_plan), and a sweep's trials share a few seeds, so
    the permutation and sorts (~3 ms for MNIST) were a third of building a session."""
    held_out = np.random.default_rng([seed, 0x5EED]).permutation(n)
    val_index = np.sort(held_out[:val_size]).astype(np.int32)
    train_index = np.sort(held_out[val_size:]).astype(np.int32)
    val_index.flags.writeable = train_index.flags.writeable = False
    return val_index, train_index


def whole_split(backend, images: np.ndarray, labels: np.ndarray) -> ResidentSplit:
    """Every row of `images`, in order, resident on the device."""
    index = np.arange(len(images), dtype=np.int32)
    return ResidentSplit(backend.resident(images), backend.resident(labels), index, backend.to_device(index), labels)


def epoch_order(split: ResidentSplit, seed: int, epoch: int) -> np.ndarray:
    """The training order of one epoch: a function of (seed, epoch) only, so the
    order never depends on the batch size and a resumed run sees the same data."""
    return np.random.default_rng([seed, epoch]).permutation(split.index).astype(np.int32)
