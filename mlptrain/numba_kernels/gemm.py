"""Dense layers as tiled GEMMs with fused epilogues (CUDA backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N),
all C-contiguous. Activations and weights share one storage format (float32,
or float16 / bf16-in-uint16 for mixed precision); weight gradients are always
float32. Elements are converted to float32 as they are loaded, every product
is summed in float32, and outputs are rounded to the storage format once. The three products of a dense layer differ only
in which operand is read transposed:

    forward          y  = act(x @ w + b)       A = x  (M,K)      B = w   (K,N)
    backward input   dx = (dy @ w.T) * act'(h)  A = dy (M,N)      B = w.T (w is N-major)
    backward weight  dw = beta * dw + x.T @ dy  A = x.T (x is M-major) B = dy

One kernel factory builds the main loop for each case; a transposed operand
is loaded along its contiguous axis (so global loads stay coalesced) and
transposed on its way into shared memory, padded so the stores do not
conflict on banks. Each block owns a BM x BN tile of the output, each thread a
TM x TN register block of it in row and column pairs strided by the thread grid (conflict-free shared
reads). Every output is summed inside one block: its K-split groups each sum
a fixed share of K and group 0 adds their partials in group order; only a
weight gradient given a workspace splits its batch across blocks, into
partials a second launch adds in chunk order. No atomics: a fixed summation
order, bitwise-reproducible results.
"""

import functools
import math
from typing import NamedTuple

from numba import complex64, config, cuda, float32, int64, uint64

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.numba_kernels import kernel_cache, streams
from mlptrain.numba_kernels.checks import require, require_one_of
from mlptrain.numba_kernels.precision import STORAGE_DTYPES, codec

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
def _no_geometry(array):
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
    return Operand(_no_geometry, index_code, index_code, fetch, k_contiguous)


def _make_operand_stage(operand, ROWS, BK, GROUP):
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


def _make_tile_product(tile, a_operand, b_operand):
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
    rows_a, load_a, store_a, A_LOADS, A_PITCH = _make_operand_stage(a_operand, BM, BK, GROUP)
    rows_b, load_b, store_b, B_LOADS, B_PITCH = _make_operand_stage(b_operand, BN, BK, GROUP)
    prepare_a, prepare_b = a_operand.prepare, b_operand.prepare
    A_HALF, B_HALF = A_PITCH // 2, B_PITCH // 2
    A_SHARED, B_SHARED = KSPLIT * BK * A_HALF, KSPLIT * BK * B_HALF
    PARTIAL = (KSPLIT - 1, TM * TN, GROUP) if KSPLIT > 1 else (1, 1, 1)
    if TM % 2 or TN % 2:
        raise ValueError(f"tile {tile}: a thread's outputs must come in row and column pairs")

    # 8-byte alignment lets a complex64 read be one 8-byte load; the simulator takes no alignment (and
    # tells shared arrays apart by their source line: one a line)
    if config.ENABLE_CUDASIM:
        @kernel_cache.device
        def pair_slices():
            As = cuda.shared.array(A_SHARED, complex64)
            Bs = cuda.shared.array(B_SHARED, complex64)
            return As, Bs
    else:
        @kernel_cache.device
        def pair_slices():
            As = cuda.shared.array(A_SHARED, complex64, alignment=8)
            Bs = cuda.shared.array(B_SHARED, complex64, alignment=8)
            return As, Bs

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


def launch_grid(M, N, tile):
    BM, BN, _, TM, TN, KSPLIT = tile
    return (math.ceil(N / BN), math.ceil(M / BM)), (BM // TM) * (BN // TN) * KSPLIT


def _pick_tile(M, N):
    """The name of the first tile in TILES whose grid for an M x N output
    has at least that tile's minimum number of blocks."""
    for name, (tile, min_blocks) in TILES.items():
        grid, _ = launch_grid(M, N, tile)
        if grid[0] * grid[1] >= min_blocks:
            return name
    return name


@kernel_cache.device
def _squash(z, activation):
    """tanh or sigmoid (ReLU is applied where the sum is written)."""
    if activation == TANH:
        return math.tanh(z)
    return float32(1) / (float32(1) + math.exp(-z))


@kernel_cache.device
def _activation_grad(h, activation):
    """d act / d z expressed through the activation's output h."""
    if activation == RELU:
        return float32(1) if h > float32(0) else float32(0)
    if activation == TANH:
        return float32(1) - h * h
    if activation == SIGMOID:
        return h * (float32(1) - h)
    return float32(1)


def _tile_coords(tile):
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
    """The Layout of _make_tile_product's threads (group 0's, which hold the sums)."""
    _, _, TM, TN, TX, TY = _tile_coords(tile)

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
                    z = acc[i, j] + load(b[n])
                    if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                        z = float32(0)
                    y[m, n] = store(z)
        if activation == TANH or activation == SIGMOID:
            for i in range(TM):
                m = row_of(m0, i)
                for j in range(TN):
                    n = col_of(n0, j)
                    if m < M and n < N:
                        y[m, n] = store(_squash(load(y[m, n]), activation))

    @kernel_cache.device
    def activation_grad(acc, h, dx, m0, n0, M, N, activation):
        for i in range(TM):
            m = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if m < M and n < N:
                    dx[m, n] = store(acc[i, j])
        if activation != NONE:
            for i in range(TM):
                m = row_of(m0, i)
                for j in range(TN):
                    n = col_of(n0, j)
                    if m < M and n < N:
                        dx[m, n] = store(load(dx[m, n]) * _activation_grad(load(h[m, n]), activation))

    return bias_activation, activation_grad


# --- forward: y = act(x @ w + b) ------------------------------------------------

@functools.cache
def _make_linear_forward(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = _tile_coords(tile)
    load, store = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, True), dense_operand(load, False))
    bias_activation, _ = make_epilogues(tile_layout(tile), load, store)

    # Block (by, bx) owns y[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of K, group 0 adds them in order and each of its threads
    # writes its own TM x TN outputs with bias and activation. No atomics.
    @kernel_cache.jit(**jit_options)
    def linear_forward_kernel(x, w, b, y, activation):
        M, K = x.shape
        N = w.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(x, w, acc, m0, n0, M, N, 0, K):
            bias_activation(acc, b, y, m0, n0, M, N, activation)

    return linear_forward_kernel


def linear_forward(x, w, b, y, activation):
    """y = act(x @ w + b), all four in one storage format."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    M, K = x.shape
    require("w", w, x.dtype, (K, None))
    N = w.shape[1]
    require("b", b, x.dtype, (N,))
    require("y", y, x.dtype, (M, N))
    _check_activation(activation)
    if M == 0 or N == 0:
        return
    size = _pick_tile(M, N)
    grid, threads = launch_grid(M, N, TILES[size][0])
    _make_linear_forward(TILES[size][0], x.dtype)[grid, threads, streams.current()](x, w, b, y, activation)


# --- backward input: dx = (dy @ w.T) * act'(h) ----------------------------------

@functools.cache
def _make_linear_backward_input(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = _tile_coords(tile)
    load, store = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, True), dense_operand(load, True))
    _, activation_grad = make_epilogues(tile_layout(tile), load, store)

    # Block (by, bx) owns dx[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the N outputs, group 0 adds them in order and each of
    # its threads writes its own TM x TN input gradients. No atomics.
    @kernel_cache.jit(**jit_options)
    def linear_backward_input_kernel(dy, w, h, dx, activation):
        M, N = dy.shape
        K = w.shape[0]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(dy, w, acc, m0, n0, M, K, 0, N):
            activation_grad(acc, h, dx, m0, n0, M, K, activation)

    return linear_backward_input_kernel


def linear_backward_input(dy, w, h, dx, activation):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input.

    All four share one storage format. With activation NONE, h is not read
    (pass dx or any (M, K) array of that format).
    """
    require_one_of("dy", dy, STORAGE_DTYPES, (None, None))
    M, N = dy.shape
    require("w", w, dy.dtype, (None, N))
    K = w.shape[0]
    require("h", h, dy.dtype, (M, K))
    require("dx", dx, dy.dtype, (M, K))
    _check_activation(activation)
    if M == 0 or K == 0:
        return
    size = _pick_tile(M, K)
    grid, threads = launch_grid(M, K, TILES[size][0])
    _make_linear_backward_input(TILES[size][0], dy.dtype)[grid, threads, streams.current()](dy, w, h, dx, activation)


# --- backward weight: dw = beta * dw + x.T @ dy ----------------------------------

@functools.cache
def _make_linear_backward_weight(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = _tile_coords(tile)
    load, _ = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, False), dense_operand(load, False))
    _, _, row_of, col_of = tile_layout(tile)

    # Block (by, bx) owns dw[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the batch, group 0 adds them in order and each of its
    # threads writes its own TM x TN weights. No atomics; beta == 0 never
    # reads dw (it may hold garbage).
    @kernel_cache.jit(**jit_options)
    def linear_backward_weight_kernel(x, dy, dw, beta):
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
                    if beta == float32(0):
                        dw[k, n] = acc[i, j]
                    else:
                        dw[k, n] = beta * dw[k, n] + acc[i, j]

    return linear_backward_weight_kernel


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


def blocks_chunk_plan(samples, blocks):
    """chunk_plan for an output of `blocks` tiles."""
    most = max(1, min(math.ceil(CHUNK_BLOCKS / max(1, blocks)), samples // MIN_CHUNK))
    chunk = max(1, math.ceil(samples / most / CHUNK_STEP)) * CHUNK_STEP
    return chunk, max(1, math.ceil(samples / chunk)), most


def make_weight_partials(tile_product, layout, block, **jit_options):
    """Kernel (a, dy, partials, chunk): partials[z] = A[:, chunk z] @ dy[chunk z] for the
    (chunks, rows, columns) partials, A the (rows, samples) operand (x.T, or a convolution's
    im2col(x).T) and dy (samples, columns), by a tile product of that Layout over BM x BN blocks."""
    BM, BN = block
    TM, TN, row_of, col_of = layout

    # Block (by, bx, bz) owns rows by*BM:+BM, columns bx*BN:+BN of chunk bz's
    # partial sum (over samples bz*chunk:+chunk); it alone writes that tile of
    # partials[bz], so no atomics are needed.
    @kernel_cache.jit(**jit_options)
    def weight_partials_kernel(a, dy, partials, chunk):
        samples, columns = dy.shape
        rows = partials.shape[1]
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
    for e in range(cuda.grid(1), dw.shape[0], cuda.gridsize(1)):
        total = float32(0)
        for z in range(partials.shape[0]):
            total += partials[z, e]
        if beta == float32(0):
            dw[e] = total
        else:
            dw[e] = beta * dw[e] + total


def add_chunks(partials, dw, beta):
    """dw = beta * dw + partials summed over axis 0 in order; partials (chunks, E), dw (E,) float32."""
    blocks = max(1, min(SUM_MAX_BLOCKS, math.ceil(dw.shape[0] / SUM_THREADS)))
    chunk_sum_kernel[blocks, SUM_THREADS, streams.current()](partials, dw, float32(beta))


@functools.cache
def _make_linear_weight_partials(tile, dtype):
    load, _ = codec(dtype)
    product = _make_tile_product(tile, dense_operand(load, False), dense_operand(load, False))
    return make_weight_partials(product, tile_layout(tile), tile[:2])


def linear_backward_weight_workspace(batch, inputs, outputs):
    """float32 elements of workspace linear_backward_weight can use for x (batch, inputs) and dy
    (batch, outputs): 0 where one block per output tile already fills the GPU. Never smaller for a
    smaller batch, so one workspace sized for the largest batch serves all."""
    tile = TILES[_pick_tile(inputs, outputs)][0]
    grid, _ = launch_grid(inputs, outputs, tile)
    _, _, most = chunk_plan(batch, inputs, outputs, tile)
    return most * inputs * outputs if most > 1 and grid[0] * grid[1] < SPLIT_BELOW else 0


def linear_variants(rows, inputs, outputs, workspace=True):
    """The kernel each pass of an (inputs -> outputs) dense layer over `rows` samples runs, for the run's
    record: the tile of the forward, input gradient and weight gradient (`+chunks` where the weight
    gradient sums the batch in chunks, given a workspace)."""
    tile = TILES[_pick_tile(inputs, outputs)][0]
    grid, _ = launch_grid(inputs, outputs, tile)
    chunked = workspace and grid[0] * grid[1] < SPLIT_BELOW and chunk_plan(rows, inputs, outputs, tile)[1] > 1
    return {"forward": f"tiled/{_pick_tile(rows, outputs)}", "backward_input": f"tiled/{_pick_tile(rows, inputs)}",
            "backward_weight": f"tiled/{_pick_tile(inputs, outputs)}{'+chunks' if chunked else ''}"}


def linear_backward_weight(x, dy, dw, beta, workspace=None):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates); x and dy in one storage
    format, dw float32 (gradients are accumulated in float32 whatever the precision). With a float32
    workspace of `linear_backward_weight_workspace(...)` elements, a long batch is summed in chunks
    by more blocks (see CHUNK_BLOCKS)."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    B, K = x.shape
    require("dy", dy, x.dtype, (B, None))
    N = dy.shape[1]
    require("dw", dw, "float32", (K, N))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if K == 0 or N == 0:
        return
    tile = TILES[_pick_tile(K, N)][0]
    grid, threads = launch_grid(K, N, tile)
    if workspace is not None and grid[0] * grid[1] < SPLIT_BELOW:
        require("workspace", workspace, "float32", (None,))
        chunk, chunks, most = chunk_plan(B, K, N, tile)
        if chunks > 1 and workspace.shape[0] < chunks * K * N:  # as conv and reduce do: never a silent slower path
            raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * K * N} "
                             "(linear_backward_weight_workspace(batch, inputs, outputs))")
        if chunks > 1:
            partials = workspace[:chunks * K * N]
            _make_linear_weight_partials(tile, x.dtype)[(*grid, chunks), threads, streams.current()](
                x, dy, partials.reshape(chunks, K, N), chunk)
            add_chunks(partials.reshape(chunks, K * N), dw.reshape(K * N), beta)
            return
    _make_linear_backward_weight(tile, x.dtype)[grid, threads, streams.current()](x, dy, dw, float32(beta))


def _check_activation(activation):
    if activation not in (NONE, RELU, TANH, SIGMOID):
        raise ValueError(f"unknown activation code {activation!r} (expected one of {NONE}, {RELU}, {TANH}, {SIGMOID})")
