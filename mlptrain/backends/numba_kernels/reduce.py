"""Deterministic reductions (CUDA backend): every sum in a fixed order, no atomics."""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32
from mlptrain.backends.numba_kernels import chunks, streams, wide
from mlptrain.backends.numba_kernels.block_sums import accumulate, make_block_sum
from mlptrain.backends.numba_kernels.checks import require, require_lanes, require_lanes_one_of, require_one_of
from mlptrain.backends.numba_kernels.chunks import column_width
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.wide import load_quad

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
# Its blocks' threads, which Adam's update summing the squares as it reads the gradient shares (optim.adam_update's
# partials): the partition below. 512, not 256: the update's 256 blocks then keep twice as many warps an SM reading
# (the MLP step at batch 128 -0.7 us; 1024 was 3 us slower, and the lanes' update cannot launch that wide:
# benchmarks/NOTES.md, issue 31 step 5). The simulator runs every thread in Python.
SQUARES_THREADS = 32 if config.ENABLE_CUDASIM else 512
square_sum = make_block_sum(SQUARES_THREADS)  # adds a block's sums


@functools.cache
def make_column_sum(dtype, width):
    """The device function (dy, n, begin, end, c, g, span) -> float32 of a block summing `width` columns of dy's
    rows begin:end, BIAS_THREADS // width groups of rows a column: thread (c, g) sums groups g, g + span, ... (a
    block of `span` x width threads; a 1-D one passes c = t % width, g = t // width), then thread (c, 0) adds the
    groups' partials in order, and only its return value is column n's sum. Group k holds rows begin + k, begin +
    k + GROUPS, ..., added in order: the same bits whatever the block's shape. Every thread of the block calls it
    (it holds a barrier)."""
    load, _ = codec(dtype)
    GROUPS = BIAS_THREADS // width

    @kernel_cache.device
    def column_sum(dy, n, begin, end, c, g, span):
        partial = cuda.shared.array((GROUPS, width), float32)
        k = g
        while k < GROUPS:
            total = float32(0)
            if n < dy.shape[1]:
                # four loads in flight, added in the order of one row at a time: the same bits
                r = begin + k
                while r + 3 * GROUPS < end:
                    a, b = load(dy[r, n]), load(dy[r + GROUPS, n])
                    e, f = load(dy[r + 2 * GROUPS, n]), load(dy[r + 3 * GROUPS, n])
                    total += a
                    total += b
                    total += e
                    total += f
                    r += 4 * GROUPS
                while r < end:
                    total += load(dy[r, n])
                    r += GROUPS
            partial[k, c] = total
            k += span
        cuda.syncthreads()
        total = float32(0)
        if g == 0:
            for k in range(GROUPS):
                total += partial[k, c]
        return total

    return column_sum


@functools.cache
def _make_bias_backward(dtype, width):
    """(bias_backward_kernel, bias_backward_lanes_kernel) for dy in this format and blocks `width` columns
    wide; both sum through one device function, so a lane's sums are the solo kernel's bits."""
    column_sum = make_column_sum(dtype, width)
    GROUPS = BIAS_THREADS // width

    # Block (bx, by) owns columns bx*width:+width of rows by*chunk:+chunk, and thread (c, 0) writes
    # out[by, column]: no atomics. With one chunk, out is db itself and beta applies; with several, out
    # holds the chunks' partials.
    @kernel_cache.jit
    def bias_backward_kernel(dy, out, chunk, beta):
        after_previous_grid()
        n = cuda.blockIdx.x * width + cuda.threadIdx.x
        begin = cuda.blockIdx.y * chunk
        total = column_sum(dy, n, begin, min(begin + chunk, dy.shape[0]), cuda.threadIdx.x, cuda.threadIdx.y, GROUPS)
        if cuda.threadIdx.y == 0 and n < dy.shape[1]:
            accumulate(out, cuda.blockIdx.y, n, total, beta)

    # Block (bx, z) owns columns bx*width:+width of lane z, all rows in one chunk (bias_backward without a
    # workspace), and thread (c, 0) writes db[z, column]: no atomics.
    @kernel_cache.jit
    def bias_backward_lanes_kernel(dy, db, beta):
        after_previous_grid()
        n, z = cuda.blockIdx.x * width + cuda.threadIdx.x, cuda.blockIdx.y
        lane = dy[z]
        total = column_sum(lane, n, 0, lane.shape[0], cuda.threadIdx.x, cuda.threadIdx.y, GROUPS)
        if cuda.threadIdx.y == 0 and n < lane.shape[1]:
            accumulate(db, z, n, total, beta)

    return bias_backward_kernel, bias_backward_lanes_kernel


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
    kernel = _make_bias_backward(dy.dtype, width)[0]
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


def bias_backward_lanes(dy, db, beta):
    """db[z] = beta * db[z] + sum over rows of dy[z] for every lane z, in one launch: each lane's sums
    in `bias_backward`'s order without a workspace (one chunk), so its bits are that call's.

    dy (K, M, N) in a storage format, db (K, N) float32, usually a lane view of the lanes' gradients
    (`mlptrain.backends.lanes.lane_view`); beta 0.0 overwrites, 1.0 accumulates.
    """
    require_lanes_one_of("dy", dy, STORAGE_DTYPES, (None, None, None))
    lanes, _, columns = tuple(dy.shape)
    require_lanes("db", db, "float32", (lanes, columns))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if columns == 0 or lanes == 0:
        return
    width = column_width(columns)
    grid, threads = (math.ceil(columns / width), lanes), (width, BIAS_THREADS // width)
    _make_bias_backward(dy.dtype, width)[1][grid, threads, streams.current()](dy, db, float32(beta))


# The partition of a gradient's sum of squares, which `optim.adam_update` follows too as it reads the gradient
# (its `partials`): thread t of block b, t' = b * blockDim + t and stride the fixed grid's size along x, sums the
# quads q = t', t' + stride, ... (elements 4q..4q+3 in order), then the last size % 4 elements e = size - size % 4
# + t', + stride, ...; `square_sum` then adds the block's sums in a fixed pairing. The same order on every run and
# every GPU, and wherever x lies: `quads` (x 16-byte aligned, wide.aligned_quads) only reads a quad in one access.
@kernel_cache.device
def _thread_sum_of_squares(x, quads):
    total = float32(0)
    first, stride, n = cuda.grid(1), cuda.gridsize(1), x.shape[0]
    q, count = first, n // 4
    # two quads in flight, their squares added in the order one at a time would: the same bits
    while q + stride < count:
        a0, a1, a2, a3 = load_quad(x, 4 * q, quads)
        b0, b1, b2, b3 = load_quad(x, 4 * (q + stride), quads)
        total += a0 * a0
        total += a1 * a1
        total += a2 * a2
        total += a3 * a3
        total += b0 * b0
        total += b1 * b1
        total += b2 * b2
        total += b3 * b3
        q += 2 * stride
    if q < count:
        a0, a1, a2, a3 = load_quad(x, 4 * q, quads)
        total += a0 * a0
        total += a1 * a1
        total += a2 * a2
        total += a3 * a3
    for i in range(4 * count + first, n, stride):
        total += x[i] * x[i]
    return total


# Thread 0 of block b writes partials[b]: no atomics.
@kernel_cache.jit
def sum_of_squares_kernel(x, partials, quads):
    after_previous_grid()
    total = square_sum(_thread_sum_of_squares(x, quads))
    if cuda.threadIdx.x == 0:
        partials[cuda.blockIdx.x] = total


def sum_of_squares(x, partials):
    """partials[b] = the sum of x[i]^2 over block b's share of x; sum(partials) = ||x||^2.

    x float32 (1-D), partials float32 (PARTIALS,). An inf or NaN in x makes the total inf or NaN.
    """
    require("x", x, "float32", (None,))
    require("partials", partials, "float32", (PARTIALS,))
    sum_of_squares_kernel[PARTIALS, SQUARES_THREADS, streams.current()](x, partials, wide.aligned_quads(x))


# Block (b, z) is block b of lane z's solo grid (cuda.grid(1) and gridsize(1) count along x only), and its
# thread 0 writes partials[z, b]: no atomics.
@kernel_cache.jit
def sum_of_squares_lanes_kernel(x, partials, quads):
    after_previous_grid()
    z = cuda.blockIdx.y
    total = square_sum(_thread_sum_of_squares(x[z], quads))
    if cuda.threadIdx.x == 0:
        partials[z, cuda.blockIdx.x] = total


def sum_of_squares_lanes(x, partials):
    """`sum_of_squares` for every lane z in one launch: partials[z] are the bits `sum_of_squares(x[z],
    partials[z])` writes. x (K, P) float32, partials (K, PARTIALS) float32; either may be a lane view."""
    require_lanes("x", x, "float32", (None, None))
    lanes = x.shape[0]
    require_lanes("partials", partials, "float32", (lanes, PARTIALS))
    if lanes == 0:
        return
    sum_of_squares_lanes_kernel[(PARTIALS, lanes), SQUARES_THREADS, streams.current()](x, partials,
                                                                                       wide.aligned_quads(x))
