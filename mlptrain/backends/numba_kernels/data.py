"""Batch gathering from the resident uint8 dataset (CUDA backend)."""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int32
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import (
    checked_cursor, require, require_lanes, require_lanes_one_of, require_one_of)
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

THREADS = 256
# Each thread gathers COLUMN_STEPS columns THREADS apart (coalesced), its loads issued before its stores. With one
# column a thread, each thread's pixel load waited on its index load, in 8 waves of threads for 16 lanes of MNIST:
# 27.6 -> 13.9 µs under ncu on an H200 (benchmarks/NOTES.md, issue 30 step 15). The values are the same.
COLUMN_STEPS = 4  # gather_rows is written out for four
MAX_ROW_BLOCKS = 65535  # the grid's y limit; more rows loop


def _column_blocks(width):
    return max(1, math.ceil(width / (THREADS * COLUMN_STEPS)))


@functools.cache
def _make_gather(dtype):
    """(gather_batch_kernel, gather_lanes_kernel) storing x in this format; both run one device function,
    so a lane's rows are the solo kernel's bits."""
    _, store = codec(dtype)

    # Thread t of block (bx, by) owns x[i, d] for d = bx * THREADS * COLUMN_STEPS + t + s * THREADS, s <
    # COLUMN_STEPS, and rows i = by, by + gridDim.y, ... (threads of a block run along d, so the uint8 reads and
    # the writes are coalesced); thread 0 of the first block column owns y[i]. No atomics. The four loads come
    # first, written out, so that no store (x might alias images, as far as the compiler knows) holds them back.
    @kernel_cache.device
    def gather_rows(images, labels, indices, first, x, y, scale, shift):
        d0 = cuda.blockIdx.x * (cuda.blockDim.x * COLUMN_STEPS) + cuda.threadIdx.x
        step, width = cuda.blockDim.x, x.shape[1]
        d1, d2, d3 = d0 + step, d0 + 2 * step, d0 + 3 * step
        for i in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
            r = indices[first + i]
            v0 = float32(images[r, d0]) if d0 < width else float32(0)
            v1 = float32(images[r, d1]) if d1 < width else float32(0)
            v2 = float32(images[r, d2]) if d2 < width else float32(0)
            v3 = float32(images[r, d3]) if d3 < width else float32(0)
            if d0 < width:
                x[i, d0] = store(v0 * scale + shift)
            if d1 < width:
                x[i, d1] = store(v1 * scale + shift)
            if d2 < width:
                x[i, d2] = store(v2 * scale + shift)
            if d3 < width:
                x[i, d3] = store(v3 * scale + shift)
            if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
                y[i] = int32(labels[r])

    @kernel_cache.jit
    def gather_batch_kernel(images, labels, indices, cursor, start, x, y, scale, shift):
        after_previous_grid()
        gather_rows(images, labels, indices, cursor[0] + start, x, y, scale, shift)

    # Blocks of grid layer z serve lane z as the solo kernel's grid would; an inactive lane's blocks return
    # before reading its cursor or indices.
    @kernel_cache.jit
    def gather_lanes_kernel(images, labels, indices, cursor, start, x, y, scale, shift, active):
        after_previous_grid()
        z = cuda.blockIdx.z
        if active[z] != 0:
            gather_rows(images, labels, indices[z], cursor[z, 0] + start, x[z], y[z], scale, shift)

    return gather_batch_kernel, gather_lanes_kernel


def _check_dataset(images, labels):
    """(rows, width) of the resident dataset."""
    require_one_of("images", images, ("uint8", "float32"), (None, None))  # pixels, or an npz's float features
    rows, width = images.shape
    require("labels", labels, "uint8", (rows,))
    return rows, width


def _check_window(start, n, available):
    if start < 0 or start + n > available:
        raise ValueError(f"indices[{start}:{start + n}] is out of range for {available} indices")


def gather_batch(images, labels, indices, start, x, y, scale, shift, cursor=None):
    """For i < x.shape[0]: r = indices[cursor[0] + start + i];
    x[i] = images[r] * scale + shift (computed in float32, stored in x's format), y[i] = labels[r] (int32).

    `cursor` (a 1-element int64 device array, read on the device; None reads as 0) lets a replayed CUDA
    graph move through the epoch (the step's rules advance it: `step_rules.record_norm`). indices must hold
    valid rows of images and cursor[0] + start + x.shape[0] must not pass their end (neither is checked on the
    device).
    """
    _, width = _check_dataset(images, labels)
    require_one_of("indices", indices, ("int32", "int64"), (None,))
    require_one_of("x", x, STORAGE_DTYPES, (None, width))
    n = x.shape[0]
    require("y", y, "int32", (n,))
    _check_window(start, n, indices.shape[0])
    if n == 0:
        return
    grid = (_column_blocks(width), min(n, MAX_ROW_BLOCKS))
    _make_gather(x.dtype)[0][grid, THREADS, streams.current()](images, labels, indices, checked_cursor(cursor),
                                                               start, x, y, float32(scale), float32(shift))


def gather_lanes(images, labels, indices, start, x, y, scale, shift, cursor, active):
    """`gather_batch` for every active lane z (active[z] != 0) in one launch: lane z gathers
    x[z], y[z] from the shared images and labels through its own indices[z] and cursor[z].

    indices (K, n) int32 or int64, x (K, rows, D) in a storage format, y (K, rows) int32, cursor (K, 1)
    int64, active (K,) int32; lane operands may be lane views (`mlptrain.backends.lanes.lane_view`). An
    inactive lane is not touched: not even its cursor or indices are read.
    """
    _, width = _check_dataset(images, labels)
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes_one_of("indices", indices, ("int32", "int64"), (lanes, None))
    require_lanes_one_of("x", x, STORAGE_DTYPES, (lanes, None, width))
    n = x.shape[1]
    require_lanes("y", y, "int32", (lanes, n))
    require_lanes("cursor", cursor, "int64", (lanes, 1))
    _check_window(start, n, indices.shape[1])
    if n == 0 or lanes == 0:
        return
    grid = (_column_blocks(width), min(n, MAX_ROW_BLOCKS), lanes)
    _make_gather(x.dtype)[1][grid, THREADS, streams.current()](images, labels, indices, cursor, start, x, y,
                                                               float32(scale), float32(shift), active)
