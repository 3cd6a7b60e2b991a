"""im2col for the NumPy convolutions: the columns of a few images at a time (at most COLUMN_BYTES of them, so
a batch of 256 32x32 images with 256 channels never needs its 2.4 GB column matrix at once), and a batch
viewed as rows of pixels. The CUDA backend's convolutions read their im2col operands in place
(numba_kernels/im2col.py)."""

import numpy as np

COLUMN_BYTES = 64 * 2**20


def image_columns(x, size):
    """im2col of x (n, H, W, C): (n*H*W, size*size*C), column (dh, dw, c) of
    pixel (n, h, w) holding x[n, h + dh - P, w + dw - P, c] (zero outside)."""
    n, H, W, C = x.shape
    pad = size // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # zero bits are 0.0 in every storage format
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))  # (n, H, W, C, dh, dw)
    return windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * H * W, size * size * C)


def image_chunks(x, size):
    """Slices of the batch whose im2col columns fit in COLUMN_BYTES."""
    N, H, W, C = x.shape
    per_image = H * W * size * size * C * x.itemsize
    step = max(1, COLUMN_BYTES // max(1, per_image))
    return [slice(i, min(i + step, N)) for i in range(0, N, step)]


def pixel_rows(array):
    """An (N, H, W, C) array viewed (N*H*W, C): pixels as rows; a view (so
    writes land in the array) only when the array is C-contiguous."""
    if not array.flags.c_contiguous:
        raise ValueError(f"arrays must be C-contiguous (a batch slice buf[:n] is), got strides {array.strides}")
    return array.reshape(-1, array.shape[3])
