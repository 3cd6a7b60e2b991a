"""Batch gathering from the resident uint8 dataset (NumPy backend)."""

import numpy as np

from mlptrain.precision import from_float32


def gather_batch(images, labels, indices, start, x, y, scale, shift):
    """For i < x.shape[0]: r = indices[start + i];
    x[i] = images[r] * scale + shift (computed in float32, stored in x's format), y[i] = labels[r] (int32).
    """
    rows = indices[start:start + x.shape[0]]
    values = images[rows].astype(np.float32)
    values *= np.float32(scale)
    values += np.float32(shift)
    x[...] = from_float32(values, x.dtype)
    y[...] = labels[rows]
