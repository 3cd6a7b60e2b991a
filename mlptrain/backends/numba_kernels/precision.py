"""Conversions between float32 and each storage format (CUDA backend): the cast kernels and their
launchers, over the device codecs of codecs.py."""

import math

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

THREADS = 256
MAX_BLOCKS = 2048


def _make_cast(dtype):
    _, store = codec(dtype)

    # Thread t owns elements t, t + stride, ...: no atomics.
    @kernel_cache.jit
    def cast_kernel(src, dst):
        after_previous_grid()
        for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
            dst[i] = store(src[i])

    return cast_kernel


_CAST = {np.dtype(dtype): _make_cast(dtype) for dtype in STORAGE_DTYPES}


def cast(src, dst):
    """dst = src rounded to dst's storage format (float32 src, 1-D)."""
    require("src", src, "float32", (None,))
    require_one_of("dst", dst, STORAGE_DTYPES, src.shape)
    if src.shape[0]:
        _CAST[dst.dtype][max(1, min(MAX_BLOCKS, math.ceil(src.shape[0] / THREADS))), THREADS, streams.current()](src, dst)
