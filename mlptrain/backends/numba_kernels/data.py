"""Batch gathering from the resident uint8 dataset (CUDA backend)."""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int32, int64
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import checked_cursor, require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec

THREADS = 256
MAX_ROW_BLOCKS = 65535  # the grid's y limit; more rows loop


@functools.cache
def _make_gather_batch(dtype):
    _, store = codec(dtype)

    # Thread d of block row by owns x[i, d] for rows i = by, by + gridDim.y, ...
    # (threads of a block run along d, so the uint8 reads and the writes are
    # coalesced); thread 0 of the first block column owns y[i]. No atomics.
    @kernel_cache.jit
    def gather_batch_kernel(images, labels, indices, cursor, start, x, y, scale, shift):
        d = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        first = cursor[0] + start
        for i in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
            r = indices[first + i]
            if d < x.shape[1]:
                x[i, d] = store(float32(images[r, d]) * scale + shift)
            if d == 0:
                y[i] = int32(labels[r])

    return gather_batch_kernel


def gather_batch(images, labels, indices, start, x, y, scale, shift, cursor=None):
    """For i < x.shape[0]: r = indices[cursor[0] + start + i];
    x[i] = images[r] * scale + shift (computed in float32, stored in x's format), y[i] = labels[r] (int32).

    `cursor` (a 1-element int64 device array, read on the device; None reads as 0) lets a replayed CUDA
    graph move through the epoch: see `advance_cursor`. indices must hold valid rows of images and
    cursor[0] + start + x.shape[0] must not pass their end (neither is checked on the device).
    """
    require_one_of("images", images, ("uint8", "float32"), (None, None))  # pixels, or an npz's float features
    rows, width = images.shape
    require("labels", labels, "uint8", (rows,))
    require_one_of("indices", indices, ("int32", "int64"), (None,))
    require_one_of("x", x, STORAGE_DTYPES, (None, width))
    n = x.shape[0]
    require("y", y, "int32", (n,))
    if start < 0 or start + n > indices.shape[0]:
        raise ValueError(f"indices[{start}:{start + n}] is out of range for {indices.shape[0]} indices")
    if n == 0:
        return
    grid = (max(1, math.ceil(width / THREADS)), min(n, MAX_ROW_BLOCKS))
    _make_gather_batch(x.dtype)[grid, THREADS, streams.current()](images, labels, indices, checked_cursor(cursor),
                                                                  start, x, y, float32(scale), float32(shift))


@kernel_cache.jit
def advance_cursor_kernel(cursor, by):
    cursor[0] += by


def advance_cursor(cursor, by):
    """cursor[0] += by, on the device (so a graph replay can advance it)."""
    require("cursor", cursor, "int64", (1,))
    advance_cursor_kernel[1, 1, streams.current()](cursor, int64(by))
