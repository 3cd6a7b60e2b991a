"""Deterministic reductions (CUDA backend): every sum in a fixed order, no atomics."""

import functools
import math

from numba import config, cuda, float32

from mlptrain.numba_kernels import streams
from mlptrain.numba_kernels.checks import require, require_one_of
from mlptrain.numba_kernels.precision import STORAGE_DTYPES, codec

COLUMNS = 32  # columns per block: one warp reads 32 consecutive floats of a row
ROW_GROUPS = 8  # threads per column, each summing every ROW_GROUPS-th row
# sum_of_squares: a fixed grid (not sized to the GPU), so the summation order
# and hence the result are the same on every device. The simulator runs every
# thread in Python: there a small grid keeps a training step to seconds.
PARTIALS = 4 if config.ENABLE_CUDASIM else 256
SQUARES_THREADS = 32 if config.ENABLE_CUDASIM else 256


@functools.cache
def _make_bias_backward(dtype):
    load, _ = codec(dtype)

    # Block b owns columns b*COLUMNS ... +COLUMNS of db. Thread (c, g) sums rows
    # g, g + ROW_GROUPS, ... of column c in order, then thread (c, 0) adds the
    # ROW_GROUPS partials in order g = 0, 1, ...: a fixed order, no atomics.
    @cuda.jit
    def bias_backward_kernel(dy, db, beta):
        partial = cuda.shared.array((ROW_GROUPS, COLUMNS), float32)
        c, g = cuda.threadIdx.x, cuda.threadIdx.y
        rows, columns = dy.shape
        n = cuda.blockIdx.x * COLUMNS + c
        total = float32(0)
        if n < columns:
            for r in range(g, rows, ROW_GROUPS):
                total += load(dy[r, n])
        partial[g, c] = total
        cuda.syncthreads()
        if g == 0 and n < columns:
            total = float32(0)
            for k in range(ROW_GROUPS):
                total += partial[k, c]
            if beta == float32(0):  # never read db: it may hold garbage
                db[n] = total
            else:
                db[n] = beta * db[n] + total

    return bias_backward_kernel


def bias_backward(dy, db, beta):
    """db = beta * db + sum over rows of dy (beta 0 overwrites, 1 accumulates); dy in any
    storage format, db float32."""
    require_one_of("dy", dy, STORAGE_DTYPES, (None, None))
    require("db", db, "float32", (dy.shape[1],))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if dy.shape[1] == 0:
        return
    blocks = math.ceil(dy.shape[1] / COLUMNS)
    _make_bias_backward(dy.dtype)[blocks, (COLUMNS, ROW_GROUPS), streams.current()](dy, db, float32(beta))


# Block b sums the squares of elements t, t + stride, ... (t its global thread
# index, stride the fixed grid's size) thread by thread, then a shared-memory
# tree adds them in a fixed pairing and thread 0 writes partials[b]: no atomics,
# the same order on every run and every GPU.
@cuda.jit
def sum_of_squares_kernel(x, partials):
    cache = cuda.shared.array(SQUARES_THREADS, float32)
    t = cuda.threadIdx.x
    total = float32(0)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        total += x[i] * x[i]
    cache[t] = total
    cuda.syncthreads()
    width = SQUARES_THREADS // 2
    while width > 0:
        if t < width:
            cache[t] += cache[t + width]
        cuda.syncthreads()
        width //= 2
    if t == 0:
        partials[cuda.blockIdx.x] = cache[0]


def sum_of_squares(x, partials):
    """partials[b] = the sum of x[i]^2 over block b's share of x; sum(partials) = ||x||^2.

    x float32 (1-D), partials float32 (PARTIALS,). An inf or NaN in x makes the total inf or NaN.
    """
    require("x", x, "float32", (None,))
    require("partials", partials, "float32", (PARTIALS,))
    sum_of_squares_kernel[PARTIALS, SQUARES_THREADS, streams.current()](x, partials)
