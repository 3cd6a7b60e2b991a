"""Batch gathering from the resident uint8 dataset (NumPy backend)."""

import numpy as np

from mlptrain.dtypes import from_float32


def gather_batch(images, labels, indices, start, x, y, scale, shift, cursor=None):
    """For i < x.shape[0]: r = indices[cursor[0] + start + i] (cursor None reads as 0);
    x[i] = images[r] * scale + shift (computed in float32, stored in x's format), y[i] = labels[r] (int32).
    """
    start += 0 if cursor is None else int(cursor[0])
    rows = indices[start:start + x.shape[0]]
    values = images[rows].astype(np.float32)
    values *= np.float32(scale)
    values += np.float32(shift)
    x[...] = from_float32(values, x.dtype)
    y[...] = labels[rows]


def gather_lanes(images, labels, indices, start, x, y, scale, shift, cursor, active):
    """`gather_batch` for every active lane z (active[z] != 0): lane z gathers x[z], y[z] from the shared
    images and labels through its own indices[z] and cursor[z]. An inactive lane is not touched: not even
    its cursor or indices are read."""
    for z in np.flatnonzero(active):
        gather_batch(images, labels, indices[z], start, x[z], y[z], scale, shift, cursor[z])
