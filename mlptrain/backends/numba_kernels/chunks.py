"""Deterministic chunked sums: a weight gradient over a long batch split across blocks.

Each block writes its chunk's partial tile (make_weight_partials); a second launch adds the chunks in
chunk order (add_chunks). A fixed plan, read off the shapes alone, and a fixed order: the sums are the
same bits on every run and every device.
"""

import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.tiles import launch_grid

# A weight gradient's output can be too small to fill the GPU however a block splits its sum (an MLP's
# 128 x 128 layer is 16 SMALL blocks) while its sum over samples is long (a batch of 2048; every
# pixel of a convolution's batch). Given a workspace, the samples are cut into chunks of at least
# MIN_CHUNK (a multiple of CHUNK_STEP), enough for about CHUNK_BLOCKS blocks (two waves of one LARGE
# block per H100 SM); each block writes its chunk's partial tile, and a second launch adds the
# chunks in chunk order: a fixed plan and order, so the sums stay bitwise reproducible. A dense
# layer splits only below SPLIT_BELOW blocks: on the H100, batch 2048, its 128 x 128 gradient went
# from 1.5 to 3.7 TFLOP/s in chunks, while its 784 x 128 one (100 blocks) fell from 9.1 to 7.8.
SPLIT_BELOW = 66
CHUNK_BLOCKS = 264
MIN_CHUNK = 256
CHUNK_STEP = 64
SUM_THREADS = 256
SUM_MAX_BLOCKS = 2048


def chunk_plan(samples, rows, columns, tile):
    """(chunk, chunks, most chunks) for a rows x columns weight gradient summed over `samples`: `most
    chunks` (what the workspace is sized for) grows with the samples; rounding the chunk up to
    CHUNK_STEP may leave fewer in use."""
    grid, _ = launch_grid(rows, columns, tile)
    return blocks_chunk_plan(samples, grid[0] * grid[1])


def blocks_chunk_plan(samples, blocks, min_chunk=None):
    """chunk_plan for an output of `blocks` tiles, chunks of at least `min_chunk` samples (default MIN_CHUNK)."""
    most = max(1, min(math.ceil(CHUNK_BLOCKS / max(1, blocks)), samples // (min_chunk or MIN_CHUNK)))
    chunk = max(1, math.ceil(samples / most / CHUNK_STEP)) * CHUNK_STEP
    return chunk, max(1, math.ceil(samples / chunk)), most


def make_weight_partials(tile_product, layout, block, summed_by_a=False, **jit_options):
    """Kernel (a, dy, partials, chunk): partials[z] = A[:, chunk z] @ dy[chunk z] for the
    (chunks, rows, columns) partials, A the (rows, samples) operand (x.T, or a convolution's
    im2col(x).T) and dy (samples, columns), by a tile product of that Layout over BM x BN blocks.
    `summed_by_a`: the samples are a's second axis (a dense layer's forward or input gradient, a the
    (rows, summed) activations or gradients, gemm_split.py), else dy's first."""
    BM, BN = block
    TM, TN, row_of, col_of = layout

    # Block (by, bx, bz) owns rows by*BM:+BM, columns bx*BN:+BN of chunk bz's
    # partial sum (over samples bz*chunk:+chunk); it alone writes that tile of
    # partials[bz], so no atomics are needed.
    @kernel_cache.jit(**jit_options)
    def weight_partials_kernel(a, dy, partials, chunk):
        after_previous_grid()
        rows, columns = partials.shape[1], partials.shape[2]
        samples = a.shape[1] if summed_by_a else dy.shape[0]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        begin = cuda.blockIdx.z * chunk
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(a, dy, acc, m0, n0, rows, columns, begin, min(begin + chunk, samples)):
            return
        for i in range(TM):
            r = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if r < rows and n < columns:
                    partials[cuda.blockIdx.z, r, n] = acc[i, j]

    return weight_partials_kernel


# Thread t owns dw[t], dw[t + stride], ...: it adds the chunks' partial sums
# in chunk order, so the order is fixed and no atomics are needed; beta == 0
# never reads dw (it may hold garbage).
@kernel_cache.jit
def chunk_sum_kernel(partials, dw, beta):
    after_previous_grid()
    for e in range(cuda.grid(1), dw.shape[0], cuda.gridsize(1)):
        total = float32(0)
        for z in range(partials.shape[0]):
            total += partials[z, e]
        if beta == float32(0):
            dw[e] = total
        else:
            dw[e] = beta * dw[e] + total


def sum_blocks(elements):
    """Blocks of SUM_THREADS threads for a grid-stride launch over `elements`: enough for a thread each, between 1
    and SUM_MAX_BLOCKS."""
    return max(1, min(SUM_MAX_BLOCKS, math.ceil(elements / SUM_THREADS)))


def add_chunks(partials, dw, beta):
    """dw = beta * dw + partials summed over axis 0 in order; partials (chunks, E), dw (E,) float32."""
    blocks = sum_blocks(dw.shape[0])
    chunk_sum_kernel[blocks, SUM_THREADS, streams.current()](partials, dw, float32(beta))


def column_width(columns):
    """Columns a block covers: 32 (a warp along a row), or fewer for narrower gradients, so the rest
    of the block's threads split the rows instead of idling."""
    width = 1
    while width < min(columns, 32):
        width *= 2
    return width
