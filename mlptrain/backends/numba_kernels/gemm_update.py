"""A dense layer's weight and bias gradients with Adam's update in their epilogue, for packed lanes (CUDA backend).

The lanes' step writes every gradient, then Adam's update reads it back with the parameters and moments: 28 bytes an
element, ~90 µs of 16 adam_mnist lanes' ~294-µs step on an H200, where the update already streams as fast as any
variant measured (benchmarks/NOTES.md, issue 30 step 31). Here the blocks of gemm_weight's weight-and-bias launch
apply the update to the gradient they hold instead of writing it: nothing is written or read back, and the update's
launch goes for the layer's parameters.

Each element's update is optim.adam_value on the gradient the weight-gradient blocks would have written (a window of
one micro-batch: beta 0), so the parameters and moments get the bits of the two launches apart. The gradient's squares
are summed per block (a thread's elements in the tile's order, then the block's fixed tree) into `squares` (K, blocks),
another order than the update's own partition: the recorded norm rounds otherwise. No atomics.

The rules (lr, bias corrections, apply) must be in the lanes' step state before the launch (step_rules'
prepare, as finish_step_lanes writes them for a lane whose norm comes later), and the layer's weights must have
been read for the last time in the step: its input gradient comes first.
"""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import gemm_engines, streams
from mlptrain.backends.numba_kernels.block_sums import make_block_sum
from mlptrain.backends.numba_kernels.checks import require, require_lanes
from mlptrain.backends.numba_kernels.reduce import PARTIALS
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.gemm_weight import lanes_weight_bias_plan
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.optim import adam_scalars, adam_value
from mlptrain.backends.numba_kernels.reduce import make_column_sum
from mlptrain.backends.numba_kernels.tiles import dense_operand
from mlptrain.optim.step_state import APPLY


@functools.cache
def make_weight_bias_update(tile, dtype, engine, staging, width, threads):
    """The kernel (x, dy, weight, bias, state, hypers, squares, weight_rows, active) of lanes' weight-and-bias blocks
    (gemm_weight.make_linear_backward_weight_bias's, trial axis z = blockIdx.z) whose epilogue applies Adam: weight
    and bias are (param, m, v) triples of lane views, hypers (K, 7) optim.adam_update_lanes' rows, squares (K, >=
    gridDim.x * gridDim.y) float32: block (bx, by) of lane z writes squares[z, by * gridDim.x + bx]."""
    BM, BN = tile[:2]
    load, _ = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    TM, TN, row_of, col_of = layout
    tile_product = make_product(dense_operand(load, False), dense_operand(load, False))
    column_sum, block_sum = make_column_sum(dtype, width), make_block_sum(threads)
    SPAN = threads // width

    # Thread t of a weight block updates its TM x TN elements of the block's tile, in the tile's order, summing
    # their gradients' squares; a bias block's thread (c, 0) its column's. Then the block's tree adds the squares.
    @kernel_cache.device
    def weight_bias_update_block(x, dy, weight, bias, scalars, rules, apply, weight_rows):
        squares = float32(0)
        if cuda.blockIdx.y < weight_rows:
            param, m, v = weight
            B, K = x.shape
            N = dy.shape[1]
            m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
            acc = cuda.local.array((TM, TN), float32)
            if tile_product(x, dy, acc, m0, n0, K, N, 0, B):
                for i in range(TM):
                    k = row_of(m0, i)
                    for j in range(TN):
                        n = col_of(n0, j)
                        if k < K and n < N:
                            r, c = uint64(k), uint64(n)
                            g = acc[i, j]
                            squares += g * g
                            if apply:
                                param[r, c], m[r, c], v[r, c] = adam_value(
                                    param[r, c], g, m[r, c], v[r, c], scalars, rules[0], rules[1], rules[2], rules[3],
                                    rules[4])
        else:
            param, m, v = bias
            t = cuda.threadIdx.x
            c = t % width
            n = ((cuda.blockIdx.y - weight_rows) * cuda.gridDim.x + cuda.blockIdx.x) * width + c
            g = column_sum(dy, n, 0, dy.shape[0], c, t // width, SPAN)
            if t < width and n < dy.shape[1]:
                squares = g * g
                if apply:
                    param[n], m[n], v[n] = adam_value(param[n], g, m[n], v[n], scalars, rules[0], rules[1], rules[2],
                                                      rules[3], rules[4])
        return block_sum(squares)

    @kernel_cache.jit
    def weight_bias_update_kernel(x, dy, weight_param, weight_m, weight_v, bias_param, bias_m, bias_v, state, hypers,
                                  squares, weight_rows, active):
        after_previous_grid()
        z = cuda.blockIdx.z
        if active[z] == 0:  # the whole block, uniformly: none of its barriers is left waiting
            return
        rules = hypers[z]
        total = weight_bias_update_block(
            x[z], dy[z], (weight_param[z], weight_m[z], weight_v[z]), (bias_param[z], bias_m[z], bias_v[z]),
            adam_scalars(state[z], rules[5], rules[6] != float32(0)), rules, state[z, APPLY] != 0, weight_rows)
        if cuda.threadIdx.x == 0:
            squares[z, cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x] = total

    return weight_bias_update_kernel


def update_blocks(engine, rows, inputs, outputs, lanes, tiles_for=None) -> int | None:
    """The squares' columns a lane of `linear_backward_weight_bias_update` writes (its blocks a lane), or None where
    the layer's weight and bias gradients do not run as one launch (gemm_weight.lanes_weight_bias_plan)."""
    plan = lanes_weight_bias_plan(engine, rows, inputs, outputs, lanes, tiles_for)
    return None if plan is None else plan[1][0] * plan[1][1]


def linear_backward_weight_bias_update(x, dy, weight, bias, state, hypers, squares, active, engine, tiles_for=None):
    """For every active lane z: dw = x[z].T @ dy[z] and db = the column sums of dy[z], as
    gemm.linear_backward_weight_bias(x, dy, dw, db, 0.0, engine=engine, ...) computes them, each element then
    updated by Adam into its (param, m, v) of `weight` ((K, inputs, outputs) lane views each) and `bias` ((K,
    outputs)), as optim.adam_update_lanes would from them, without writing dw or db. state (K, step_state.SIZE)
    holds each lane's rules already; hypers (K, 7) float32; squares (K, n) float32 with n >= update_blocks(...):
    lane z's columns hold its blocks' sums of the gradient's squares."""
    lead = tuple(x.shape)[:1]
    require_lanes("x", x, "float32", (*lead, None, None))
    lanes, rows, inputs = tuple(x.shape)
    require_lanes("dy", dy, "float32", (lanes, rows, None))
    outputs = tuple(dy.shape)[2]
    for name, array in zip(("weight", "weight m", "weight v"), weight):
        require_lanes(name, array, "float32", (lanes, inputs, outputs))
    for name, array in zip(("bias", "bias m", "bias v"), bias):
        require_lanes(name, array, "float32", (lanes, outputs))
    require_lanes("state", state, "float64", (lanes, None))
    require_lanes("hypers", hypers, "float32", (lanes, 7))
    require("active", active, "int32", (lanes,))
    plan = lanes_weight_bias_plan(engine, rows, inputs, outputs, lanes, tiles_for)
    if plan is None:
        raise ValueError(f"{engine}: no weight-and-bias launch for a {inputs} x {outputs} layer of {rows} rows")
    tile, grid, threads, width, weight_rows = plan
    if threads & (threads - 1):
        raise ValueError(f"{engine}: blocks of {threads} threads, not a power of two (the squares' tree halves them)")
    require_lanes("squares", squares, "float32", (lanes, None))
    if tuple(squares.shape)[1] < grid[0] * grid[1]:
        raise ValueError(f"squares: {tuple(squares.shape)[1]} columns, the launch writes {grid[0] * grid[1]}")
    kernel = make_weight_bias_update(tile, x.dtype, engine, gemm_engines.engine_staging(engine, x, dy), width, threads)
    kernel[grid, threads, streams.current()](x, dy, *weight, *bias, state, hypers, squares, weight_rows, active)


# Thread z owns partials[z, 0]: it adds lane z's squares in order, after the update that wrote the partials. No atomics.
@kernel_cache.jit
def add_squares_kernel(squares, count, partials, active):
    after_previous_grid()
    z = cuda.grid(1)
    if z < partials.shape[0] and active[z] != 0:
        total = float32(0)
        for b in range(count):
            total += squares[z, b]
        partials[z, 0] += total


def add_squares(squares, count, partials, active):
    """partials[z, 0] += the sum of squares[z, :count] in order, for every active lane z: the first layer's squares
    (linear_backward_weight_bias_update's) into the partials the rest of the update wrote (optim.adam_update_lanes),
    which step_rules.record_norm_lanes then adds up."""
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes("squares", squares, "float32", (lanes, None))
    require_lanes("partials", partials, "float32", (lanes, PARTIALS))
    if not 0 <= count <= tuple(squares.shape)[1]:
        raise ValueError(f"squares: {count} columns asked of {tuple(squares.shape)[1]}")
    if lanes:
        add_squares_kernel[-(-lanes // 32), 32, streams.current()](squares, count, partials, active)
