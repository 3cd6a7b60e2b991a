"""The dataset resident on the device (uint8 pixels or float32 features), and the index arrays
that select batches.

Training and validation share one image array on the device; a split is
only an index array into it. Each step a kernel gathers and normalises the
rows `order[cursor + start:][:rows]` (the cursor on the device), so no image crosses the bus inside
the loop.
"""

from __future__ import annotations

import functools
import threading
import weakref
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
        train_index, val_index = rows(0, n), rows(n, len(images))
    else:
        val_index, train_index = held_out_index(n, val_size, seed)
    host = labels
    images, labels = backend.resident(images), backend.resident(labels)
    return (
        ResidentSplit(images, labels, train_index, backend.resident_index(train_index), host),
        ResidentSplit(images, labels, val_index, backend.resident_index(val_index), host),
        whole_split(backend, dataset.test_images, dataset.test_labels),
    )


def train_rows(dataset, val_size: int | float) -> int:
    """The rows of `resident_splits`' training split, without making it."""
    n = len(dataset.train_images)
    return n if dataset.has_val_split else n - held_out_rows(val_size, n)


@functools.lru_cache(maxsize=16)
def rows(start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as a read-only int32 index, one array for every split that asks (a device copy each
    GPU shares while it lives: Backend.resident_index)."""
    index = np.arange(start, stop, dtype=np.int32)
    index.flags.writeable = False
    return index


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
    index = rows(0, len(images))
    return ResidentSplit(backend.resident(images), backend.resident(labels), index, backend.resident_index(index),
                         labels)


def epoch_order(split: ResidentSplit, seed: int, epoch: int) -> np.ndarray:
    """The training order of one epoch: a function of (seed, epoch) only, so the
    order never depends on the batch size and a resumed run sees the same data. Read-only where the split's
    index is (held_out_index's, shared by the runs of a seed): kept for the other runs of the seed (`_ORDERS`)."""
    index = split.index
    if index.flags.writeable:  # an index its owner may change: nothing to share
        return _permuted(index, seed, epoch)
    with _ORDERS_LOCK:  # a sweep's worker threads start their epochs at once
        orders = _ORDERS.get(id(index))
        if orders is None:  # dropped with the index (an ndarray is not hashable: by its id while it lives)
            orders = _ORDERS[id(index)] = {}
            weakref.finalize(index, _ORDERS.pop, id(index), None)
        order = orders.get((seed, epoch))
    if order is None:
        order = _permuted(index, seed, epoch)
        order.flags.writeable = False
        with _ORDERS_LOCK:
            if len(orders) >= ORDERS_KEPT:  # the oldest epochs' first: runs of a seed train their epochs together
                del orders[min(orders, key=lambda key: key[1])]
            orders[(seed, epoch)] = order
    return order


def _permuted(index: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(index).astype(np.int32)


# the epoch orders of each shared read-only index (dropped with it), by (seed, epoch): the 16 lanes of a packed
# sweep start each epoch together while the GPU waits, and each lane's permutation of MNIST's rows took ~1.4 ms
# there, of a ~50 ms epoch end (benchmarks/NOTES.md, issue 30 step 16); a sweep's trials share a few seeds
_ORDERS: dict[int, dict[tuple[int, int], np.ndarray]] = {}
_ORDERS_LOCK = threading.Lock()
ORDERS_KEPT = 8  # orders of one index: a few seeds' current epochs (~0.2 MB each for MNIST)
