"""Deterministic reductions (CUDA backend)."""

import math

from numba import cuda, float32

from mlptrain.numba_kernels.checks import require

COLUMNS = 32  # columns per block: one warp reads 32 consecutive floats of a row
ROW_GROUPS = 8  # threads per column, each summing every ROW_GROUPS-th row


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
            total += dy[r, n]
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


def bias_backward(dy, db, beta):
    """db = beta * db + sum over rows of dy (beta 0 overwrites, 1 accumulates)."""
    require("dy", dy, "float32", (None, None))
    require("db", db, "float32", (dy.shape[1],))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if dy.shape[1] == 0:
        return
    blocks = math.ceil(dy.shape[1] / COLUMNS)
    bias_backward_kernel[blocks, (COLUMNS, ROW_GROUPS)](dy, db, float32(beta))
