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
TM x TN register block of it strided by the thread grid (conflict-free shared
reads). Every output is summed inside one block: its K-split groups each sum
a fixed share of K and group 0 adds their partials in group order. No
cross-block split-K, no atomics: a fixed summation order, bitwise-reproducible
results.
"""

import functools
import math
from typing import NamedTuple

from numba import cuda, float32

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.numba_kernels.checks import require, require_one_of
from mlptrain.numba_kernels.precision import STORAGE_DTYPES, codec

# A tile is (BM, BN, BK, TM, TN, KSPLIT): a block computes a BM x BN tile of
# the output, each thread a TM x TN register block of it, and KSPLIT groups of
# (BM/TM)(BN/TN) threads split the K range between them (group g takes every
# KSPLIT-th BK-slice) and add their partial sums in shared memory in a fixed
# order. A launch takes the first tile whose grid has at least its minimum of
# blocks (about one wave of 132 SMs): LARGE (64 FMAs per 16 shared loads) for
# big outputs; MEDIUM; SMALL (8-way K split) puts 8 warps on each 32 x 32
# tile, for MLP-sized outputs with a long K (128 x 512, K = 784). Chosen from
# the candidates timed on an H100 by `python benchmarks/gemm.py --tiles`.
LARGE_TILE = (128, 128, 8, 8, 8, 1)
MEDIUM_TILE = (64, 64, 8, 4, 4, 2)
SMALL_TILE = (32, 32, 8, 4, 4, 8)
TILES = {"large": (LARGE_TILE, 128), "medium": (MEDIUM_TILE, 96), "small": (SMALL_TILE, 0)}


class Operand(NamedTuple):
    """How a tile product reads one operand. `fetch(array, geometry, i, k, I, K)`
    returns element (i, k) as float32, zero outside [0, I) x [0, K); i is the
    output row (for A) or column (for B) the element feeds, k the summed index.
    `prepare(array)` computes, once per thread, the `geometry` constants fetch
    needs. k_contiguous: adjacent k are adjacent in memory (else adjacent i),
    so a warp loads along that axis and global loads stay coalesced."""

    prepare: object
    fetch: object
    k_contiguous: bool


@cuda.jit(device=True, inline="always")
def _no_geometry(array):
    return 0


def dense_operand(load, k_contiguous):
    """A stored matrix: array[i, k] when k_contiguous, else array[k, i]."""
    if k_contiguous:
        @cuda.jit(device=True, inline="always")
        def fetch(array, geometry, i, k, I, K):
            return load(array[i, k]) if k < K and i < I else float32(0)
    else:
        @cuda.jit(device=True, inline="always")
        def fetch(array, geometry, i, k, I, K):
            return load(array[k, i]) if k < K and i < I else float32(0)
    return Operand(_no_geometry, fetch, k_contiguous)


def _make_operand_stage(operand, ROWS, BK, GROUP):
    """(load, store, loads, slice shape): a group's share of one BK x ROWS
    slice of an operand, fetched into `loads` registers per thread, then
    stored to shared memory as [k, row]. Loaded along k, a slice is
    transposed on its way in: the pad of 32 / BK floats puts the BK rows a
    warp writes on distinct banks."""
    _, fetch, along_k = operand
    LOADS = ROWS * BK // GROUP

    @cuda.jit(device=True, inline="always")
    def load(array, geometry, regs, i0, k0, I, K, t):
        for l in range(LOADS):
            e = t + l * GROUP
            if along_k:
                i, k = i0 + e // BK, k0 + e % BK
            else:
                k, i = k0 + e // ROWS, i0 + e % ROWS
            regs[l] = fetch(array, geometry, i, k, I, K)

    @cuda.jit(device=True, inline="always")
    def store(shared, regs, g, t):
        for l in range(LOADS):
            e = t + l * GROUP
            if along_k:
                shared[g, e % BK, e // BK] = regs[l]
            else:
                shared[g, e // ROWS, e % ROWS] = regs[l]

    return load, store, LOADS, (BK, ROWS + (32 // BK if along_k else 0))


def _make_tile_product(tile, a_operand, b_operand):
    """Device function: acc = A[m0:m0+BM, k_begin:k_end] @ B[k_begin:k_end, n0:n0+BN]
    for this thread's TM x TN outputs (rows m0 + ty + TY*i, columns
    n0 + tx + TX*j); returns True in the threads of group 0, which hold the
    complete sums.

    Each operand is an `Operand`: a stored matrix (`dense_operand`) or one
    computed on the fly (the convolutions' im2col, no buffer). Elements
    outside (M, N) and [k_begin, k_end) read as zero. Each group prefetches
    its next K slice into registers while it multiplies the current one.
    """
    BM, BN, BK, TM, TN, KSPLIT = tile
    TX, TY = BN // TN, BM // TM
    GROUP = TX * TY  # threads per K-split group
    load_a, store_a, A_LOADS, a_slice = _make_operand_stage(a_operand, BM, BK, GROUP)
    load_b, store_b, B_LOADS, b_slice = _make_operand_stage(b_operand, BN, BK, GROUP)
    prepare_a, prepare_b = a_operand.prepare, b_operand.prepare
    A_SHARED, B_SHARED = (KSPLIT, *a_slice), (KSPLIT, *b_slice)
    PARTIAL = (KSPLIT - 1, TM * TN, GROUP) if KSPLIT > 1 else (1, 1, 1)

    @cuda.jit(device=True, inline="always")
    def multiply_slice(As, Bs, acc, g, tx, ty):
        """acc += As[g] outer Bs[g], two k at a time: loads of k+1 are issued
        before the FMAs of k, so shared-memory latency overlaps arithmetic."""
        a0, b0 = cuda.local.array(TM, float32), cuda.local.array(TN, float32)
        a1, b1 = cuda.local.array(TM, float32), cuda.local.array(TN, float32)
        for kk in range(0, BK, 2):
            for i in range(TM):
                a0[i] = As[g, kk, ty + TY * i]
                a1[i] = As[g, kk + 1, ty + TY * i]
            for j in range(TN):
                b0[j] = Bs[g, kk, tx + TX * j]
                b1[j] = Bs[g, kk + 1, tx + TX * j]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a0[i] * b0[j]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a1[i] * b1[j]

    @cuda.jit(device=True, inline="always")
    def tile_product(a, b, acc, m0, n0, M, N, k_begin, k_end):
        As = cuda.shared.array(A_SHARED, float32)
        Bs = cuda.shared.array(B_SHARED, float32)
        partial = cuda.shared.array(PARTIAL, float32)
        a_regs = cuda.local.array(A_LOADS, float32)
        b_regs = cuda.local.array(B_LOADS, float32)
        ga, gb = prepare_a(a), prepare_b(b)
        g, t = cuda.threadIdx.x // GROUP, cuda.threadIdx.x % GROUP
        tx, ty = t % TX, t // TX
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0)
        load_a(a, ga, a_regs, m0, k_begin + g * BK, M, k_end, t)
        load_b(b, gb, b_regs, n0, k_begin + g * BK, N, k_end, t)
        for k0 in range(k_begin, k_end, KSPLIT * BK):  # the same trip count in every group
            store_a(As, a_regs, g, t)
            store_b(Bs, b_regs, g, t)
            cuda.syncthreads()
            if k0 + KSPLIT * BK < k_end:
                load_a(a, ga, a_regs, m0, k0 + (KSPLIT + g) * BK, M, k_end, t)
                load_b(b, gb, b_regs, n0, k0 + (KSPLIT + g) * BK, N, k_end, t)
            multiply_slice(As, Bs, acc, g, tx, ty)
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


def _grid(M, N, tile):
    BM, BN, _, TM, TN, KSPLIT = tile
    return (math.ceil(N / BN), math.ceil(M / BM)), (BM // TM) * (BN // TN) * KSPLIT


def _pick_tile(M, N):
    """The name of the first tile in TILES whose grid for an M x N output
    has at least that tile's minimum number of blocks."""
    for name, (tile, min_blocks) in TILES.items():
        grid, _ = _grid(M, N, tile)
        if grid[0] * grid[1] >= min_blocks:
            return name
    return name


@cuda.jit(device=True, inline="always")
def _squash(z, activation):
    """tanh or sigmoid (ReLU is applied where the sum is written)."""
    if activation == TANH:
        return math.tanh(z)
    return float32(1) / (float32(1) + math.exp(-z))


@cuda.jit(device=True, inline="always")
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


def make_epilogues(tile, load, store):
    """Device functions that write a thread's TM x TN block of sums (rows m0 + ty + TY*i, columns
    n0 + tx + TX*j, clipped to M x N), shared by the dense and the convolution kernels:

    bias_activation(acc, b, y, ...)   y = act(acc + b)        (the forward products)
    activation_grad(acc, h, dx, ...)  dx = acc * act'(h)       (the input-gradient products)

    tanh / sigmoid / act' run in a second, rolled pass over the thread's own outputs: inlined in the
    unrolled first loop they would stop it unrolling and push acc out of registers. In fp16 / bf16 the
    value is therefore rounded before that pass too: a second rounding of the same order as the first.
    """
    _, _, TM, TN, TX, TY = _tile_coords(tile)

    @cuda.jit(device=True, inline="always")
    def bias_activation(acc, b, y, m0, n0, M, N, activation):
        tx, ty = cuda.threadIdx.x % TX, cuda.threadIdx.x // TX
        for i in range(TM):
            m = m0 + ty + TY * i
            for j in range(TN):
                n = n0 + tx + TX * j
                if m < M and n < N:
                    z = acc[i, j] + load(b[n])
                    if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                        z = float32(0)
                    y[m, n] = store(z)
        if activation == TANH or activation == SIGMOID:
            for i in range(TM):
                m = m0 + ty + TY * i
                for j in range(TN):
                    n = n0 + tx + TX * j
                    if m < M and n < N:
                        y[m, n] = store(_squash(load(y[m, n]), activation))

    @cuda.jit(device=True, inline="always")
    def activation_grad(acc, h, dx, m0, n0, M, N, activation):
        tx, ty = cuda.threadIdx.x % TX, cuda.threadIdx.x // TX
        for i in range(TM):
            m = m0 + ty + TY * i
            for j in range(TN):
                n = n0 + tx + TX * j
                if m < M and n < N:
                    dx[m, n] = store(acc[i, j])
        if activation != NONE:
            for i in range(TM):
                m = m0 + ty + TY * i
                for j in range(TN):
                    n = n0 + tx + TX * j
                    if m < M and n < N:
                        dx[m, n] = store(load(dx[m, n]) * _activation_grad(load(h[m, n]), activation))

    return bias_activation, activation_grad


# --- forward: y = act(x @ w + b) ------------------------------------------------

@functools.cache
def _make_linear_forward(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = _tile_coords(tile)
    load, store = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, True), dense_operand(load, False))
    bias_activation, _ = make_epilogues(tile, load, store)

    # Block (by, bx) owns y[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of K, group 0 adds them in order and each of its threads
    # writes its own TM x TN outputs with bias and activation. No atomics.
    @cuda.jit(**jit_options)
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
    grid, threads = _grid(M, N, TILES[size][0])
    _make_linear_forward(TILES[size][0], x.dtype)[grid, threads](x, w, b, y, activation)


# --- backward input: dx = (dy @ w.T) * act'(h) ----------------------------------

@functools.cache
def _make_linear_backward_input(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = _tile_coords(tile)
    load, store = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, True), dense_operand(load, True))
    _, activation_grad = make_epilogues(tile, load, store)

    # Block (by, bx) owns dx[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the N outputs, group 0 adds them in order and each of
    # its threads writes its own TM x TN input gradients. No atomics.
    @cuda.jit(**jit_options)
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
    grid, threads = _grid(M, K, TILES[size][0])
    _make_linear_backward_input(TILES[size][0], dy.dtype)[grid, threads](dy, w, h, dx, activation)


# --- backward weight: dw = beta * dw + x.T @ dy ----------------------------------

@functools.cache
def _make_linear_backward_weight(tile, dtype, **jit_options):
    BM, BN, TM, TN, TX, TY = _tile_coords(tile)
    load, _ = codec(dtype)
    tile_product = _make_tile_product(tile, dense_operand(load, False), dense_operand(load, False))

    # Block (by, bx) owns dw[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the batch, group 0 adds them in order and each of its
    # threads writes its own TM x TN weights. No atomics; beta == 0 never
    # reads dw (it may hold garbage).
    @cuda.jit(**jit_options)
    def linear_backward_weight_kernel(x, dy, dw, beta):
        B, K = x.shape
        N = dy.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(x, dy, acc, m0, n0, K, N, 0, B):
            return
        tx, ty = cuda.threadIdx.x % TX, cuda.threadIdx.x // TX
        for i in range(TM):
            k = m0 + ty + TY * i
            for j in range(TN):
                n = n0 + tx + TX * j
                if k < K and n < N:
                    if beta == float32(0):
                        dw[k, n] = acc[i, j]
                    else:
                        dw[k, n] = beta * dw[k, n] + acc[i, j]

    return linear_backward_weight_kernel


def linear_backward_weight(x, dy, dw, beta):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates); x and dy in one storage
    format, dw float32 (gradients are accumulated in float32 whatever the precision)."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    B, K = x.shape
    require("dy", dy, x.dtype, (B, None))
    N = dy.shape[1]
    require("dw", dw, "float32", (K, N))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if K == 0 or N == 0:
        return
    size = _pick_tile(K, N)
    grid, threads = _grid(K, N, TILES[size][0])
    _make_linear_backward_weight(TILES[size][0], x.dtype)[grid, threads](x, dy, dw, float32(beta))


def _check_activation(activation):
    if activation not in (NONE, RELU, TANH, SIGMOID):
        raise ValueError(f"unknown activation code {activation!r} (expected one of {NONE}, {RELU}, {TANH}, {SIGMOID})")
