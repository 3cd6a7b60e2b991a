"""The tile engine of every CUDA-core GEMM (dense layers and convolutions): operands, the tile product,
tile choice and grids, and the epilogues that write a tile's sums.

A tile product sums A (M x K) @ B (K x N) for one BM x BN tile of the output: each thread holds a TM x TN
register block of it in row and column pairs strided by the thread grid (conflict-free shared reads);
KSPLIT groups of threads each sum a fixed share of K and group 0 adds their partials in group order, so
every output is summed inside one block in a fixed order (no atomics, bitwise-reproducible results).
An operand says how element (i, k) is fetched (a stored matrix either way round, or im2col addressing,
im2col.py); a transposed operand is loaded along its contiguous axis, so global loads stay coalesced,
and transposed on its way into shared memory, padded so the stores do not conflict on banks.
"""

import math
from typing import NamedTuple

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import complex64, config, cuda, float32, int64, uint64

# A tile is (BM, BN, BK, TM, TN, KSPLIT): a block computes a BM x BN tile of
# the output, each thread a TM x TN register block of it, and KSPLIT groups of
# (BM/TM)(BN/TN) threads split the K range between them (group g takes every
# KSPLIT-th BK-slice) and add their partial sums in shared memory in a fixed
# order. A launch takes the first tile whose grid has at least its minimum of
# blocks (about one wave of 132 SMs): LARGE (32 FMAs per 6 shared loads, two
# values a load) for big outputs; MEDIUM; SMALL (8-way K split) puts 8 warps on
# each 32 x 32 tile, for MLP-sized outputs with a long K (128 x 512, K = 784).
# Chosen from the candidates timed on an H100 by `python benchmarks/gemm.py
# --tiles`: at 4096^3, 128 x 64 x 8 ran at 26.8 / 25.4 / 27.1 TFLOP/s (forward,
# input and weight gradient) against 25.0 / 25.1 / 25.1 for 128 x 128 x 16.
LARGE_TILE = (128, 64, 8, 8, 4, 1)
MEDIUM_TILE = (64, 64, 8, 4, 4, 2)
SMALL_TILE = (32, 32, 8, 4, 4, 8)
TILES = {"large": (LARGE_TILE, 128), "medium": (MEDIUM_TILE, 96), "small": (SMALL_TILE, 0)}


class Operand(NamedTuple):
    """How a tile product reads one operand, element (i, k): i the output row (for A) or column (for
    B) it feeds, k the summed index. A thread's rows stay the same from one K slice to the next while
    its k move on, so what an index costs to decode is split by axis: `row(array, geometry, i, I)`
    runs once per tile and `column(array, geometry, k, K)` once per k a thread loads (shared by the
    row pair it loads there); each returns an int64 code, negative outside [0, I) or [0, K), and
    `fetch(array, geometry, row_code, column_code)` returns the element as float32, zero where either
    code is negative. `prepare(array)` computes, once per thread, the `geometry` constants they need.
    k_contiguous: adjacent k are adjacent in memory (else adjacent i), so a warp loads along that axis
    and global loads stay coalesced."""

    prepare: object
    row: object
    column: object
    fetch: object
    k_contiguous: bool


@kernel_cache.device
def no_geometry(array):
    return 0


@kernel_cache.device
def index_code(array, geometry, i, I):
    """i itself, or -1 at and past I."""
    return i if i < I else -1


@kernel_cache.device
def float_zero():
    return float32(0)


def dense_operand(load, k_contiguous, zero=float_zero):
    """A stored matrix: array[i, k] when k_contiguous, else array[k, i]; load(element), or zero()
    outside the matrix."""
    if k_contiguous:
        @kernel_cache.device
        def fetch(array, geometry, i, k):
            return load(array[uint64(i), uint64(k)]) if (i | k) >= 0 else zero()
    else:
        @kernel_cache.device
        def fetch(array, geometry, i, k):
            return load(array[uint64(k), uint64(i)]) if (i | k) >= 0 else zero()
    return Operand(no_geometry, index_code, index_code, fetch, k_contiguous)


def make_operand_stage(operand, ROWS, BK, GROUP):
    """(rows, load, store, loads, pitch): a group's share of one BK x ROWS slice of an operand: the
    codes of the rows a thread loads (once per tile), its elements fetched into registers, then
    stored to shared memory as [g, k, row] of complex64 *pairs* of rows (flat, PITCH floats from one
    k to the next), so each later read fetches two rows' values in one 8-byte load.
    A thread handles pairs (row 2p and 2p + 1 at one k). Loaded along k, a
    slice is transposed on its way in: a warp writes 32 / BK pairs (256 / BK
    bytes) at each of BK k, and the pad of 64 / BK floats starts each k's run
    that many bytes on, so the runs tile the 32 banks (two wavefronts for 256
    bytes, the least)."""
    _, row, column, fetch, along_k = operand
    PAIRS = ROWS * BK // 2
    LOADS = -(-PAIRS // GROUP)
    PITCH = ROWS + (64 // BK if along_k else 0)
    HALF = PITCH // 2
    if ROWS % 2 or PITCH % 2:
        raise ValueError(f"a slice of {ROWS} rows (pitch {PITCH}) does not split into row pairs")

    @kernel_cache.device
    def rows(array, geometry, codes, i0, I, t):
        for l in range(LOADS):
            e = t + l * GROUP
            i = i0 + 2 * (e // BK) if along_k else i0 + 2 * (e % (ROWS // 2))
            codes[0, l] = row(array, geometry, i, I)
            codes[1, l] = row(array, geometry, i + 1, I)

    @kernel_cache.device
    def load(array, geometry, codes, regs, k0, K, t):
        for l in range(LOADS):
            e = t + l * GROUP
            if e < PAIRS:
                k = column(array, geometry, k0 + e % BK if along_k else k0 + e // (ROWS // 2), K)
                regs[0, l] = fetch(array, geometry, codes[0, l], k)
                regs[1, l] = fetch(array, geometry, codes[1, l], k)

    @kernel_cache.device
    def store(shared, regs, g, t):
        for l in range(LOADS):
            e = t + l * GROUP
            if e < PAIRS:
                if along_k:
                    shared[(g * BK + e % BK) * HALF + e // BK] = complex(regs[0, l], regs[1, l])
                else:
                    shared[(g * BK + e // (ROWS // 2)) * HALF + e % (ROWS // 2)] = complex(regs[0, l], regs[1, l])

    return rows, load, store, LOADS, PITCH


@kernel_cache.device
def owned(first, t, T, i):
    """The row (column) of a thread's i-th output row (column) in a tile: thread t of the T along that
    side owns rows first + 2 (t + T q) and the next, q = 0, 1, ...: pairs, read as one complex64."""
    return first + 2 * (t + T * (i >> 1)) + (i & 1)


def shared_slices(a_size, b_size, dtype, alignment):
    """Device function () -> (As, Bs): a tile product's two slices in shared memory, `a_size` and `b_size`
    elements of `dtype`, aligned to `alignment` bytes on the GPU (for wide shared loads). The simulator takes
    no alignment, and tells shared arrays apart by their source line: one a line."""
    if config.ENABLE_CUDASIM:
        @kernel_cache.device
        def slices():
            As = cuda.shared.array(a_size, dtype)
            Bs = cuda.shared.array(b_size, dtype)
            return As, Bs
    else:
        @kernel_cache.device
        def slices():
            As = cuda.shared.array(a_size, dtype, alignment=alignment)
            Bs = cuda.shared.array(b_size, dtype, alignment=alignment)
            return As, Bs
    return slices


def make_tile_product(tile, a_operand, b_operand):
    """Device function: acc = A[m0:m0+BM, k_begin:k_end] @ B[k_begin:k_end, n0:n0+BN]
    for this thread's TM x TN outputs (rows owned(m0, ty, TY, i), columns
    owned(n0, tx, TX, j)); returns True in the threads of group 0, which hold
    the complete sums.

    Each operand is an `Operand`: a stored matrix (`dense_operand`) or one
    computed on the fly (the convolutions' im2col, no buffer). Elements
    outside (M, N) and [k_begin, k_end) read as zero. Each group prefetches
    its next K slice into registers while it multiplies the current one.
    """
    BM, BN, BK, TM, TN, KSPLIT = tile
    TX, TY = BN // TN, BM // TM
    GROUP = TX * TY  # threads per K-split group
    rows_a, load_a, store_a, A_LOADS, A_PITCH = make_operand_stage(a_operand, BM, BK, GROUP)
    rows_b, load_b, store_b, B_LOADS, B_PITCH = make_operand_stage(b_operand, BN, BK, GROUP)
    prepare_a, prepare_b = a_operand.prepare, b_operand.prepare
    A_HALF, B_HALF = A_PITCH // 2, B_PITCH // 2
    A_SHARED, B_SHARED = KSPLIT * BK * A_HALF, KSPLIT * BK * B_HALF
    PARTIAL = (KSPLIT - 1, TM * TN, GROUP) if KSPLIT > 1 else (1, 1, 1)
    if TM % 2 or TN % 2:
        raise ValueError(f"tile {tile}: a thread's outputs must come in row and column pairs")

    pair_slices = shared_slices(A_SHARED, B_SHARED, complex64, 8)  # a complex64 read: one 8-byte load

    @kernel_cache.device
    def multiply_slice(As, Bs, a_first, b_first, acc):
        """acc += A slice outer B slice, from this thread's first reads in its group's slices. Each read
        is a complex64 pair of values, and every read of a k sits at a constant offset from that k's
        row, so the loads carry their offsets and the loop computes one address per operand and k
        (index arithmetic had cost more issue slots than the FMAs; two values per load halve the
        shared-memory traffic, which otherwise matched the FMA rate)."""
        a, b = cuda.local.array((2, TM), float32), cuda.local.array((2, TN), float32)
        for kk in range(0, BK, 2):  # two k per trip: their reads share one address per operand
            a_row, b_row = a_first + uint64(kk * A_HALF), b_first + uint64(kk * B_HALF)
            for h in range(2):
                for i in range(TM // 2):
                    v = As[a_row + uint64(h * A_HALF + TY * i)]
                    a[h, 2 * i], a[h, 2 * i + 1] = v.real, v.imag
                for j in range(TN // 2):
                    v = Bs[b_row + uint64(h * B_HALF + TX * j)]
                    b[h, 2 * j], b[h, 2 * j + 1] = v.real, v.imag
            for h in range(2):
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += a[h, i] * b[h, j]

    @kernel_cache.device
    def tile_product(a, b, acc, m0, n0, M, N, k_begin, k_end):
        As, Bs = pair_slices()
        partial = cuda.shared.array(PARTIAL, float32)
        a_regs = cuda.local.array((2, A_LOADS), float32)
        b_regs = cuda.local.array((2, B_LOADS), float32)
        a_codes = cuda.local.array((2, A_LOADS), int64)
        b_codes = cuda.local.array((2, B_LOADS), int64)
        ga, gb = prepare_a(a), prepare_b(b)
        g, t = cuda.threadIdx.x // GROUP, cuda.threadIdx.x % GROUP
        tx, ty = t % TX, t // TX
        a_first, b_first = uint64(g * BK * A_HALF + ty), uint64(g * BK * B_HALF + tx)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0)
        rows_a(a, ga, a_codes, m0, M, t)
        rows_b(b, gb, b_codes, n0, N, t)
        load_a(a, ga, a_codes, a_regs, k_begin + g * BK, k_end, t)
        load_b(b, gb, b_codes, b_regs, k_begin + g * BK, k_end, t)
        for k0 in range(k_begin, k_end, KSPLIT * BK):  # the same trip count in every group
            store_a(As, a_regs, g, t)
            store_b(Bs, b_regs, g, t)
            cuda.syncthreads()
            if k0 + KSPLIT * BK < k_end:
                load_a(a, ga, a_codes, a_regs, k0 + (KSPLIT + g) * BK, k_end, t)
                load_b(b, gb, b_codes, b_regs, k0 + (KSPLIT + g) * BK, k_end, t)
            multiply_slice(As, Bs, a_first, b_first, acc)
            cuda.syncthreads()
        if KSPLIT > 1:  # group 0 adds the other groups' sums, in group order
            if g > 0:
                for i in range(TM):
                    for j in range(TN):
                        partial[g - 1, i * TN + j, t] = acc[i, j]
            cuda.syncthreads()
            if g == 0:
                for h in range(KSPLIT - 1):
                    for i in range(TM):
                        for j in range(TN):
                            acc[i, j] += partial[h, i * TN + j, t]
        return g == 0

    return tile_product


def launch_grid(M, N, tile, trials=None):
    """(grid, threads) of an M x N output in tiles; with `trials`, a third grid axis of that many outputs (a
    trial-axis launch: block z computes trial z's)."""
    BM, BN, _, TM, TN, KSPLIT = tile
    grid = (math.ceil(N / BN), math.ceil(M / BM))
    return (grid if trials is None else (*grid, trials)), (BM // TM) * (BN // TN) * KSPLIT


def pick_tile(M, N, trials=1):
    """The name of the first tile in TILES whose grid for `trials` M x N outputs
    has at least that tile's minimum number of blocks."""
    for name, (tile, min_blocks) in TILES.items():
        grid, _ = launch_grid(M, N, tile)
        if grid[0] * grid[1] * trials >= min_blocks:
            return name
    return name


@kernel_cache.device
def squash(z, activation):
    """tanh or sigmoid (ReLU is applied where the sum is written)."""
    if activation == TANH:
        return math.tanh(z)
    return float32(1) / (float32(1) + math.exp(-z))


@kernel_cache.device
def activation_grad_of(h, activation):
    """d act / d z expressed through the activation's output h."""
    if activation == RELU:
        return float32(1) if h > float32(0) else float32(0)
    if activation == TANH:
        return float32(1) - h * h
    if activation == SIGMOID:
        return h * (float32(1) - h)
    return float32(1)


def tile_coords(tile):
    """Python-side constants a kernel factory closes over."""
    BM, BN, _, TM, TN, _ = tile
    return BM, BN, TM, TN, BN // TN, BM // TM


class Layout(NamedTuple):
    """Which outputs a thread of a tile product holds: acc (TM, TN), acc[i, j] the sum for output row
    row_of(m0, i) and column col_of(n0, j) of the tile at (m0, n0) (device functions of the thread)."""

    TM: int
    TN: int
    row_of: object
    col_of: object


def tile_layout(tile):
    """The Layout of make_tile_product's threads (group 0's, which hold the sums)."""
    _, _, TM, TN, TX, TY = tile_coords(tile)

    @kernel_cache.device
    def row_of(m0, i):
        return owned(m0, cuda.threadIdx.x // TX, TY, i)

    @kernel_cache.device
    def col_of(n0, j):
        return owned(n0, cuda.threadIdx.x % TX, TX, j)

    return Layout(TM, TN, row_of, col_of)


def make_epilogues(layout, load, store):
    """Device functions that write a thread's TM x TN block of sums (rows row_of(m0, i), columns
    col_of(n0, j) of the Layout, clipped to M x N), shared by the dense and the convolution kernels:

    bias_activation(acc, b, y, ...)   y = act(acc + b)        (the forward products)
    activation_grad(acc, h, dx, ...)  dx = acc * act'(h)       (the input-gradient products)

    tanh / sigmoid / act' run in a second, rolled pass over the thread's own outputs: inlined in the
    unrolled first loop they would stop it unrolling and push acc out of registers. In fp16 / bf16 the
    value is therefore rounded before that pass too: a second rounding of the same order as the first.
    """
    TM, TN, row_of, col_of = layout

    @kernel_cache.device
    def bias_activation(acc, b, y, m0, n0, M, N, activation):
        for i in range(TM):
            m = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if m < M and n < N:
                    r, c = uint64(m), uint64(n)  # unsigned: numba adds no negative-index fix-up
                    z = acc[i, j] + load(b[c])
                    if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                        z = float32(0)
                    y[r, c] = store(z)
        if activation == TANH or activation == SIGMOID:
            for i in range(TM):
                m = row_of(m0, i)
                for j in range(TN):
                    n = col_of(n0, j)
                    if m < M and n < N:
                        r, c = uint64(m), uint64(n)
                        y[r, c] = store(squash(load(y[r, c]), activation))

    @kernel_cache.device
    def activation_grad(acc, h, dx, m0, n0, M, N, activation):
        for i in range(TM):
            m = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if m < M and n < N:
                    dx[uint64(m), uint64(n)] = store(acc[i, j])
        if activation != NONE:
            for i in range(TM):
                m = row_of(m0, i)
                for j in range(TN):
                    n = col_of(n0, j)
                    if m < M and n < N:
                        r, c = uint64(m), uint64(n)
                        dx[r, c] = store(load(dx[r, c]) * activation_grad_of(load(h[r, c]), activation))

    return bias_activation, activation_grad


def check_activation(activation):
    if activation not in (NONE, RELU, TANH, SIGMOID):
        raise ValueError(f"unknown activation code {activation!r} (expected one of {NONE}, {RELU}, {TANH}, {SIGMOID})")
