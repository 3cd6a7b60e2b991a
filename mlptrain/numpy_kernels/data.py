"""Batch gathering from the resident uint8 dataset (NumPy backend)."""

import numpy as np


def gather_batch(images, labels, indices, start, x, y, scale, shift):
    """For i < x.shape[0]: r = indices[start + i];
    x[i] = images[r] * scale + shift (float32), y[i] = labels[r] (int32).
    """
    rows = indices[start:start + x.shape[0]]
    np.multiply(images[rows], np.float32(scale), out=x, casting="unsafe")
    x += np.float32(shift)
    y[...] = labels[rows]
