"""The weight gradient's kernels of a dense layer, dw = beta * dw + x.T @ dy (CUDA backend; gemm.py launches
them): a tile of dw a block, on the CUDA cores' tiles ("fma") or tf32x3's; and the same blocks with a layer's
bias gradient in extra blocks of the one launch (reduce.bias_backward's sums, the same bits)."""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import gemm_engines, gemm_split
from mlptrain.backends.numba_kernels.block_sums import accumulate
from mlptrain.backends.numba_kernels.chunks import column_width
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.reduce import bias_backward_workspace, make_column_sum
from mlptrain.backends.numba_kernels.tiles import dense_operand

# A run's own layer sums its bias gradient in extra blocks of its weight gradient's launch, where both are one
# launch (weight_bias_plan): a launch fewer a layer (784-512-512-10 at batch 128 on an H200: 72.1 -> 67.8-68.7 µs
# a step; benchmarks/NOTES.md, issue 31 step 3c)
GROUP_BIAS = True


@functools.cache
def make_weight_tile(tile, dtype, engine, staging):
    """The device function (x, dy, dw, beta) of a weight-gradient block on `engine`'s `tile`."""
    BM, BN = tile[:2]
    load, _ = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    TM, TN, row_of, col_of = layout
    tile_product = make_product(dense_operand(load, False), dense_operand(load, False))

    # Block (by, bx) owns dw[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the batch, group 0 adds them in order and each of its
    # threads writes its own TM x TN weights. No atomics; beta == 0 never
    # reads dw (it may hold garbage).
    @kernel_cache.device
    def weight_tile(x, dy, dw, beta):
        B, K = x.shape
        N = dy.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(x, dy, acc, m0, n0, K, N, 0, B):
            return
        for i in range(TM):
            k = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if k < K and n < N:
                    # unsigned indices: numba adds no negative-index fix-up (a compare and two selects an index)
                    r, c = uint64(k), uint64(n)
                    accumulate(dw, r, c, acc[i, j], beta)

    return weight_tile


@functools.cache
def make_linear_backward_weight(tile, dtype, trials=False, engine="fma", staging=(False, False, 0), **jit_options):
    weight_tile = make_weight_tile(tile, dtype, engine, staging)

    if trials:
        @kernel_cache.jit(**jit_options)
        def trial_weight_kernel(x, dy, dw, beta, active):
            after_previous_grid()
            z = cuda.blockIdx.z
            if active[z] != 0:  # the whole block, uniformly
                weight_tile(x[z], dy[z], dw[z], beta)

        return trial_weight_kernel

    @kernel_cache.jit(**jit_options)
    def linear_backward_weight_kernel(x, dy, dw, beta):
        after_previous_grid()
        weight_tile(x, dy, dw, beta)

    return linear_backward_weight_kernel


@functools.cache
def make_linear_backward_weight_bias(tile, dtype, engine, staging, width, threads, trials=False):
    """The kernel (x, dy, dw, db, beta, weight_rows) of a layer's weight and bias gradients in one launch:
    blocks (bx, by < weight_rows) are make_linear_backward_weight's, block (bx, weight_rows + j) sums db's
    columns (j * gridDim.x + bx) * width:+width over every row as bias_backward's one-chunk blocks do, its
    `threads` threads (a multiple of width) as column t % width, group t // width: the bits of the two launches.
    With `trials`, (x, dy, dw, db, beta, weight_rows, active) of packed lanes, block z's lane z's (db (K, N)):
    the bits of linear_backward_weight's trial-axis launch and reduce.bias_backward_lanes'."""
    weight_tile, column_sum = make_weight_tile(tile, dtype, engine, staging), make_column_sum(dtype, width)
    SPAN = threads // width  # groups of bias rows summed at once: a thread sums groups g, g + SPAN, ...

    # Both passes read dy and nothing the other writes; the branch is the whole block's, so every barrier in
    # either is met by all its threads. Column n's bias goes to db[row, n]. No atomics.
    @kernel_cache.device
    def weight_bias_block(x, dy, dw, db, beta, weight_rows, row):
        if cuda.blockIdx.y < weight_rows:
            weight_tile(x, dy, dw, beta)
            return
        t = cuda.threadIdx.x
        c = t % width
        n = ((cuda.blockIdx.y - weight_rows) * cuda.gridDim.x + cuda.blockIdx.x) * width + c
        total = column_sum(dy, n, 0, dy.shape[0], c, t // width, SPAN)
        if t < width and n < dy.shape[1]:
            accumulate(db, row, n, total, beta)

    if trials:  # block z's of lane z: an inactive lane's blocks return at once, its gradients untouched
        @kernel_cache.jit
        def trial_weight_bias_kernel(x, dy, dw, db, beta, weight_rows, active):
            after_previous_grid()
            z = cuda.blockIdx.z
            if active[z] != 0:  # the whole block, uniformly: none of its barriers is left waiting
                weight_bias_block(x[z], dy[z], dw[z], db, beta, weight_rows, z)

        return trial_weight_bias_kernel

    @kernel_cache.jit
    def linear_backward_weight_bias_kernel(x, dy, dw, db, beta, weight_rows):
        after_previous_grid()
        weight_bias_block(x, dy, dw, db, beta, weight_rows, 0)

    return linear_backward_weight_bias_kernel


def lanes_weight_bias_plan(engine, rows, inputs, outputs, lanes, tiles_for=None):
    """weight_bias_plan's (tile, grid, threads, width, weight_rows) for a trial-axis launch of `lanes` lanes (the
    tile chosen for `tiles_for`, as linear_backward_weight's), or None where the two launch apart: each lane's
    bias sums its rows in one chunk, as reduce.bias_backward_lanes does."""
    if not GROUP_BIAS or engine == "narrow" or rows == 0 or inputs == 0 or outputs == 0 or lanes == 0:
        return None
    tile, grid, threads = gemm_engines.engine_launch(engine, inputs, outputs, lanes, (lanes,), tiles_for)
    width = column_width(outputs)
    if not isinstance(threads, int) or threads % width:
        return None
    bias_blocks = -(-outputs // width)
    return tile, (grid[0], grid[1] + -(-bias_blocks // grid[0]), grid[2]), threads, width, grid[1]


def weight_bias_plan(engine, rows, inputs, outputs, workspace=True):
    """(tile, grid, threads, width, weight_rows) of linear_backward_weight_bias's one launch, or None where the
    two passes launch apart: where GROUP_BIAS is off, on the narrow engine, where either pass would sum its rows
    in chunks (a workspace, and a batch long enough), or where the tile's block is not whole rows of bias
    columns."""
    if not GROUP_BIAS or engine == "narrow" or rows == 0 or inputs == 0 or outputs == 0:
        return None
    tile, grid, threads, _, chunks, _ = gemm_split.weight_chunks(engine, rows, inputs, outputs)
    width = column_width(outputs)
    if workspace and (chunks > 1 or bias_backward_workspace(rows, outputs)) or not isinstance(threads, int) \
            or threads % width:
        return None
    bias_blocks = -(-outputs // width)
    return tile, (grid[0], grid[1] + -(-bias_blocks // grid[0])), threads, width, grid[1]
