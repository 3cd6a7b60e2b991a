"""Deterministic reductions (CUDA backend): every sum in a fixed order, no atomics."""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32
from mlptrain.backends.numba_kernels import chunks, streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.chunks import column_width
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec

BIAS_THREADS = 256
# bias_backward: rows are cut into chunks of CHUNK_ROWS, each summed by its own blocks; with a
# workspace the chunks' partial sums are added in chunk order by a second launch. A fixed plan (not
# sized to the GPU), so the order and hence the result are the same on every device. One block per 32
# columns summing every row left an H100 nearly idle: a convolution's 262,144 x 256 gradient took
# 4.1 ms in 8 blocks.
CHUNK_ROWS = 1024
# sum_of_squares: a fixed grid (not sized to the GPU), so the summation order
# and hence the result are the same on every device. The simulator runs every
# thread in Python: there a small grid keeps a training step to seconds.
PARTIALS = 4 if config.ENABLE_CUDASIM else 256
SQUARES_THREADS = 32 if config.ENABLE_CUDASIM else 256


@functools.cache
def _make_bias_backward(dtype, width):
    load, _ = codec(dtype)
    GROUPS = BIAS_THREADS // width

    # Block (bx, by) owns columns bx*width:+width of rows by*chunk:+chunk. Thread (c, g)
    # sums rows g, g + GROUPS, ... of its column in that chunk in order, then thread (c, 0) adds
    # the GROUPS partials in order g = 0, 1, ... and writes out[by, column]: a fixed order, no atomics.
    # With one chunk, out is db itself and beta applies; with several, out holds the chunks' partials.
    @kernel_cache.jit
    def bias_backward_kernel(dy, out, chunk, beta):
        partial = cuda.shared.array((GROUPS, width), float32)
        c, g = cuda.threadIdx.x, cuda.threadIdx.y
        rows, columns = dy.shape
        n = cuda.blockIdx.x * width + c
        begin = cuda.blockIdx.y * chunk
        end = min(begin + chunk, rows)
        total = float32(0)
        if n < columns:
            for r in range(begin + g, end, GROUPS):
                total += load(dy[r, n])
        partial[g, c] = total
        cuda.syncthreads()
        if g == 0 and n < columns:
            total = float32(0)
            for k in range(GROUPS):
                total += partial[k, c]
            if beta == float32(0):  # never read out: it may hold garbage
                out[cuda.blockIdx.y, n] = total
            else:
                out[cuda.blockIdx.y, n] = beta * out[cuda.blockIdx.y, n] + total

    return bias_backward_kernel


def bias_backward_workspace(rows, columns):
    """float32 elements of workspace bias_backward uses for a (rows, columns) gradient: 0 for a
    single chunk. Never smaller for fewer rows, so one workspace sized for the largest batch serves all."""
    chunks = math.ceil(rows / CHUNK_ROWS)
    return chunks * columns if chunks > 1 else 0


def bias_backward(dy, db, beta, workspace=None):
    """db = beta * db + sum over rows of dy (beta 0 overwrites, 1 accumulates); dy in any
    storage format, db float32. Given a float32 workspace of `bias_backward_workspace(...)` elements,
    rows beyond CHUNK_ROWS are summed in chunks by separate blocks; without, each column group by one block."""
    require_one_of("dy", dy, STORAGE_DTYPES, (None, None))
    rows, columns = dy.shape
    require("db", db, "float32", (columns,))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if columns == 0:
        return
    width = column_width(columns)
    kernel = _make_bias_backward(dy.dtype, width)
    blocks, threads = math.ceil(columns / width), (width, BIAS_THREADS // width)
    count = math.ceil(rows / CHUNK_ROWS)
    if workspace is not None and count > 1:
        require("workspace", workspace, "float32", (None,))
        if workspace.shape[0] < count * columns:
            raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {count * columns} "
                             "(bias_backward_workspace(rows, columns))")
        partials = workspace[:count * columns].reshape(count, columns)
        kernel[(blocks, count), threads, streams.current()](dy, partials, CHUNK_ROWS, float32(0))
        chunks.add_chunks(partials, db, beta)
        return
    kernel[(blocks, 1), threads, streams.current()](dy, db.reshape(1, columns), max(rows, 1), float32(beta))


# Block b sums the squares of elements t, t + stride, ... (t its global thread
# index, stride the fixed grid's size) thread by thread, then a shared-memory
# tree adds them in a fixed pairing and thread 0 writes partials[b]: no atomics,
# the same order on every run and every GPU.
@kernel_cache.jit
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
