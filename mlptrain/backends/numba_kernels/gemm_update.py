"""A dense layer's weight and bias gradients with Adam's update in their epilogue, for packed lanes (CUDA backend).

The lanes' step writes every gradient, then Adam's update reads it back with the parameters and moments: 28 bytes an
element, ~90 µs of 16 adam_mnist lanes' ~294-µs step on an H200, where the update already streams as fast as any
variant measured (benchmarks/NOTES.md, issue 30 step 31). Here the blocks of gemm_weight's weight-and-bias launch
apply the update to the gradient they hold instead of writing it: nothing is written or read back, and the update's
launch goes for the layer's parameters.

Each element's update is update_math.adam_value on the gradient the weight-gradient blocks would have written (a
window of one micro-batch: beta 0), so the parameters and moments get the bits of the two launches apart. The
gradient's squares are summed per block (each thread's quads of the staged rows, then the block's fixed tree) into
`squares` (K, blocks), another order than the update's own partition: the recorded norm rounds otherwise. No
atomics.

The rules (lr, bias corrections, apply) must be in the lanes' step state before the launch (step_rules'
prepare, as finish_step_lanes writes them for a lane whose norm comes later), and the layer's weights must have
been read for the last time in the step: its input gradient comes first.
"""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import gemm_engines, streams, wide
from mlptrain.backends.numba_kernels.block_sums import make_block_sum
from mlptrain.backends.numba_kernels.checks import require, require_lanes
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.gemm_weight import lanes_weight_bias_plan
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.update_math import adam_scalars, adam_value
from mlptrain.backends.numba_kernels.reduce import PARTIALS, make_column_sum
from mlptrain.backends.numba_kernels.tiles import dense_operand
from mlptrain.backends.numba_kernels.wide import load_quad, store_quad
from mlptrain.optim.step_state import APPLY


# The floats a weight block stages its gradient's rows through: what a block's 48 KB of static shared arrays leaves
# beside tf32x3's ring of slices (37 KB); beside the other engines' (the CUDA-core tiles' split sums take ~46 KB), a
# row or two: there the fused update is for the simulator's checks (lane_step fuses tf32x3 layers alone)
STAGE_FLOATS = {"tf32x3": 2176}
OTHER_STAGE_FLOATS = 64
# quads of four elements a thread of the epilogue loads at once (their params and moments), before it updates any
EPILOGUE_QUADS = 4


@functools.cache
def make_weight_bias_update(tile, dtype, engine, staging, width, threads, quads_ahead=EPILOGUE_QUADS):
    """The kernel (x, dy, weight, bias, state, hypers, squares, weight_rows, active, quads) of lanes'
    weight-and-bias blocks (gemm_weight.make_linear_backward_weight_bias's, trial axis z = blockIdx.z) whose
    epilogue applies Adam: weight a (param, m, v) triple of flat (K, inputs * outputs) lane views, bias one of (K,
    outputs); hypers (K, 7) optim.adam_update_lanes' rows, squares (K, >= gridDim.x * gridDim.y) float32: block
    (bx, by) of lane z writes squares[z, by * gridDim.x + bx]; quads: the weight views' rows 16-byte aligned and
    outputs a multiple of 4 (wide.aligned_quads)."""
    BM, BN = tile[:2]
    load, _ = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    TM, TN, row_of, col_of = layout
    tile_product = make_product(dense_operand(load, False), dense_operand(load, False))
    column_sum, block_sum = make_column_sum(dtype, width), make_block_sum(threads)
    SPAN = threads // width
    if BN % 4:
        raise ValueError(f"tile {tile}: its columns in quads of four")
    # The tile's gradient goes through shared memory STAGE_ROWS rows at a time (the tensor-core tile's ring of
    # slices takes 37 of the 48 KB a block's static arrays may hold), and every thread of the block then updates
    # whole quads of those rows: a warp's loads and stores 16 bytes a thread along a row. Updated from the
    # accumulators' own layout, a warp's accesses spread over eight rows in 8-byte pieces, and the kernel ran at a
    # third of the update's bandwidth (benchmarks/NOTES.md, issue 30 step 32).
    ROW, QUADS_ROW = BN + 4, BN // 4  # ROW: a fragment's 8 rows a store on other banks, each row 16-byte aligned
    STAGE_ROWS = math.gcd(BM, 32)
    while STAGE_ROWS > 1 and STAGE_ROWS * ROW > STAGE_FLOATS.get(engine, OTHER_STAGE_FLOATS):
        STAGE_ROWS //= 2
    ROUNDS = BM // STAGE_ROWS
    STAGE_QUADS, STAGE = STAGE_ROWS * QUADS_ROW, STAGE_ROWS * ROW  # STAGE: an array's size numba takes as a constant
    CHUNK = quads_ahead  # a thread's quads loaded before any of them is updated

    @kernel_cache.device
    def stage_rows(acc, stage, owner, r0):
        """The thread's accumulators of the tile's rows [r0, r0 + STAGE_ROWS) into `stage` (owners alone)."""
        if owner:
            for i in range(TM):
                r = row_of(0, i) - r0
                if 0 <= r < STAGE_ROWS:
                    for j in range(TN):
                        stage[r * ROW + col_of(0, j)] = acc[i, j]

    @kernel_cache.device
    def update_rows(stage, weight, k0, n0, K, N, scalars, rules, apply, quads):
        """Adam on the staged rows' quads q = t, t + threads, ... (row k0 + q // QUADS_ROW of the layer, columns
        n0 + 4 (q % QUADS_ROW) + 0..3), CHUNK quads' loads before their updates; returns their squares' sum."""
        param, m, v = weight
        squares = float32(0)
        ps = cuda.local.array((CHUNK, 4), float32)
        ms = cuda.local.array((CHUNK, 4), float32)
        vs = cuda.local.array((CHUNK, 4), float32)
        for q0 in range(cuda.threadIdx.x, STAGE_QUADS, threads * CHUNK):
            for a in range(CHUNK):
                q = q0 + a * threads
                k, n = k0 + q // QUADS_ROW, n0 + 4 * (q % QUADS_ROW)
                if apply and q < STAGE_QUADS and k < K:
                    e = uint64(k) * uint64(N) + uint64(n)
                    if quads and n < N:
                        ps[a, 0], ps[a, 1], ps[a, 2], ps[a, 3] = load_quad(param, e, True)
                        ms[a, 0], ms[a, 1], ms[a, 2], ms[a, 3] = load_quad(m, e, True)
                        vs[a, 0], vs[a, 1], vs[a, 2], vs[a, 3] = load_quad(v, e, True)
                    else:
                        for b in range(4):
                            if n + b < N:
                                ps[a, b], ms[a, b], vs[a, b] = param[e + b], m[e + b], v[e + b]
            for a in range(CHUNK):
                q = q0 + a * threads
                k, n = k0 + q // QUADS_ROW, n0 + 4 * (q % QUADS_ROW)
                if q < STAGE_QUADS and k < K:
                    for b in range(4):
                        if n + b < N:
                            g = stage[(q // QUADS_ROW) * ROW + 4 * (q % QUADS_ROW) + b]
                            squares += g * g
                            if apply:
                                ps[a, b], ms[a, b], vs[a, b] = adam_value(
                                    ps[a, b], g, ms[a, b], vs[a, b], scalars, rules[0], rules[1], rules[2], rules[3],
                                    rules[4])
                    if apply:
                        e = uint64(k) * uint64(N) + uint64(n)
                        if quads and n < N:
                            store_quad(m, e, ms[a, 0], ms[a, 1], ms[a, 2], ms[a, 3], True)
                            store_quad(v, e, vs[a, 0], vs[a, 1], vs[a, 2], vs[a, 3], True)
                            store_quad(param, e, ps[a, 0], ps[a, 1], ps[a, 2], ps[a, 3], True)
                        else:
                            for b in range(4):
                                if n + b < N:
                                    param[e + b], m[e + b], v[e + b] = ps[a, b], ms[a, b], vs[a, b]
        return squares

    # A weight block's tile of gradients goes through `stage` ROUNDS times; every thread of the block then updates
    # its quads of the staged rows, summing their squares; a bias block's thread (c, 0) updates its column's. Then
    # the block's tree adds the squares.
    @kernel_cache.device
    def weight_bias_update_block(x, dy, weight, bias, scalars, rules, apply, weight_rows, quads):
        squares = float32(0)
        if cuda.blockIdx.y < weight_rows:
            B, K = x.shape
            N = dy.shape[1]
            m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
            acc = cuda.local.array((TM, TN), float32)
            stage = cuda.shared.array(STAGE, float32)
            owner = tile_product(x, dy, acc, m0, n0, K, N, 0, B)
            for h in range(ROUNDS):
                if h:
                    cuda.syncthreads()  # every thread is done with the last round's rows
                stage_rows(acc, stage, owner, h * STAGE_ROWS)
                cuda.syncthreads()
                squares += update_rows(stage, weight, m0 + h * STAGE_ROWS, n0, K, N, scalars, rules, apply, quads)
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
                                  squares, weight_rows, active, quads):
        after_previous_grid()
        z = cuda.blockIdx.z
        if active[z] == 0:  # the whole block, uniformly: none of its barriers is left waiting
            return
        rules = hypers[z]
        total = weight_bias_update_block(
            x[z], dy[z], (weight_param[z], weight_m[z], weight_v[z]), (bias_param[z], bias_m[z], bias_v[z]),
            adam_scalars(state[z], rules[5], rules[6] != float32(0)), rules, state[z, APPLY] != 0, weight_rows, quads)
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
    updated by Adam into its (param, m, v) of `weight` (flat (K, inputs * outputs) lane views each, row-major)
    and `bias` ((K, outputs)), as optim.adam_update_lanes would from them, without writing dw or db. state (K,
    step_state.SIZE) holds each lane's rules already; hypers (K, 7) float32; squares (K, n) float32 with n >=
    update_blocks(...): lane z's columns hold its blocks' sums of the gradient's squares."""
    lead = tuple(x.shape)[:1]
    require_lanes("x", x, "float32", (*lead, None, None))
    lanes, rows, inputs = tuple(x.shape)
    require_lanes("dy", dy, "float32", (lanes, rows, None))
    outputs = tuple(dy.shape)[2]
    for name, array in zip(("weight", "weight m", "weight v"), weight):
        require_lanes(name, array, "float32", (lanes, inputs * outputs))
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
    quads = outputs % 4 == 0 and all(wide.aligned_quads(array) for array in weight)
    kernel[grid, threads, streams.current()](x, dy, *weight, *bias, state, hypers, squares, weight_rows, active, quads)


SQUARES_WARP = 32
_warp_sum = make_block_sum(SQUARES_WARP)


# Block z adds lane z's squares into partials[z, 0]: thread t sums columns t, t + 32, ... in order, then a fixed
# tree adds the 32 sums, after the update that wrote the partials. One thread summing a lane's 120 columns in a row
# took 11 µs of the step (ncu, issue 30 step 32). No atomics.
@kernel_cache.jit
def add_squares_kernel(squares, count, partials, active):
    after_previous_grid()
    z = cuda.blockIdx.x
    if active[z] == 0:  # the whole block, uniformly
        return
    total = float32(0)
    for b in range(cuda.threadIdx.x, count, SQUARES_WARP):
        total += squares[z, b]
    total = _warp_sum(total)
    if cuda.threadIdx.x == 0:
        partials[z, 0] += total


def add_squares(squares, count, partials, active):
    """partials[z, 0] += the sum of squares[z, :count] (column t, t + 32, ... summed by thread t, then the 32
    sums by a fixed tree), for every active lane z: the fused layers' squares (linear_backward_weight_bias_update's)
    into the partials the rest of the update wrote (optim.adam_update_lanes), which step_rules.record_norm_lanes
    then adds up."""
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes("squares", squares, "float32", (lanes, None))
    require_lanes("partials", partials, "float32", (lanes, PARTIALS))
    if not 0 <= count <= tuple(squares.shape)[1]:
        raise ValueError(f"squares: {count} columns asked of {tuple(squares.shape)[1]}")
    if lanes:
        add_squares_kernel[lanes, SQUARES_WARP, streams.current()](squares, count, partials, active)
