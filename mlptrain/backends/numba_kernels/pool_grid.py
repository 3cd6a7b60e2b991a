"""The thread decomposition pool.py's and pool_words.py's kernels share (CUDA backend): a thread per element (or
word) of the small tensor, blocks walking rows.

A block is TC x TW threads: TC along channels (the contiguous axis, so a warp's loads and stores are coalesced), TW
along the small tensor's width; block z walks rows (n, i) z, z + gridDim.z, ... and columns past the grid's y
dimension loop too.
"""

import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda

THREADS = 256
# Each block walks rows z, z + gridDim.z, ...: a grid of about MAX_BLOCKS blocks
# (an H100 holds 1056 blocks of 256 threads at once) keeps every SM busy,
# while one block per row spent more time starting blocks than moving bytes.
MAX_BLOCKS = 4096
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535


def launch_shape(rows, width, channels):
    """(grid, block) for one thread per element of the small (rows, width, channels) tensor.

    TC = C when C <= THREADS: then consecutive threads of a block own
    consecutive elements of memory, whatever C is (C = 3 wastes no lanes). TW
    takes the rest of THREADS, or the width where that is narrower.
    """
    tc = min(THREADS, channels)
    tw = min(THREADS // tc, width)
    grid_x, grid_y = math.ceil(channels / tc), min(math.ceil(width / tw), MAX_GRID_Y)
    grid_z = min(rows, MAX_GRID_Z, max(1, MAX_BLOCKS // (grid_x * grid_y)))
    return (grid_x, grid_y, grid_z), (tc, tw)


@kernel_cache.device
def row_walk(rows):
    """(n, i) of this block's first row of an N x rows grid of rows, and the
    block's stride gridDim.z as (whole images, rows): divided once per thread,
    so the walk over rows needs no division (a 64-bit one per row cost 10-20%)."""
    first, stride = cuda.blockIdx.z, cuda.gridDim.z
    return first // rows, first % rows, stride // rows, stride % rows


@kernel_cache.device
def advance(n, i, step_n, step_i, rows):
    """Row (n, i) moved on by step_n images and step_i rows."""
    n, i = n + step_n, i + step_i
    if i >= rows:
        return n + 1, i - rows
    return n, i
