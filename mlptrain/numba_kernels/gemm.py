"""Dense layers as tiled GEMMs with fused epilogues (CUDA backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N),
all float32 and C-contiguous. The three products of a dense layer differ only
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

import math

from numba import cuda, float32

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.numba_kernels.checks import require

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


def _make_tile_product(a_transposed, b_transposed, tile):
    """Device function: acc = A[m0:m0+BM, :] @ B[:, n0:n0+BN] for this
    thread's TM x TN outputs (rows m0 + ty + TY*i, columns n0 + tx + TX*j);
    returns True in the threads of group 0, which hold the complete sums.

    A is a[m, k], or a[k, m] when a_transposed; B is b[k, n], or b[n, k] when
    b_transposed. Elements outside (M, N, K) read as zero. Each group
    prefetches its next K slice into registers while it multiplies the
    current one.
    """
    BM, BN, BK, TM, TN, KSPLIT = tile
    TX, TY = BN // TN, BM // TM
    GROUP = TX * TY  # threads per K-split group
    A_LOADS, B_LOADS = BM * BK // GROUP, BK * BN // GROUP
    # A transposed store writes As[k, m] with k fastest across threads: a pad
    # of 32 / BK floats puts the BK rows a warp touches on distinct banks.
    A_SHARED = (KSPLIT, BK, BM + (0 if a_transposed else 32 // BK))
    B_SHARED = (KSPLIT, BK, BN + (32 // BK if b_transposed else 0))
    PARTIAL = (KSPLIT - 1, TM * TN, GROUP) if KSPLIT > 1 else (1, 1, 1)

    @cuda.jit(device=True, inline="always")
    def load_a(a, regs, m0, k0, M, K, t):
        for l in range(A_LOADS):
            e = t + l * GROUP
            if a_transposed:  # contiguous along m
                k, m = k0 + e // BM, m0 + e % BM
                regs[l] = a[k, m] if k < K and m < M else float32(0)
            else:  # contiguous along k
                m, k = m0 + e // BK, k0 + e % BK
                regs[l] = a[m, k] if k < K and m < M else float32(0)

    @cuda.jit(device=True, inline="always")
    def load_b(b, regs, n0, k0, N, K, t):
        for l in range(B_LOADS):
            e = t + l * GROUP
            if b_transposed:  # contiguous along k
                n, k = n0 + e // BK, k0 + e % BK
                regs[l] = b[n, k] if k < K and n < N else float32(0)
            else:  # contiguous along n
                k, n = k0 + e // BN, n0 + e % BN
                regs[l] = b[k, n] if k < K and n < N else float32(0)

    @cuda.jit(device=True, inline="always")
    def store_tiles(As, Bs, a_regs, b_regs, g, t):
        for l in range(A_LOADS):
            e = t + l * GROUP
            if a_transposed:
                As[g, e // BM, e % BM] = a_regs[l]
            else:
                As[g, e % BK, e // BK] = a_regs[l]
        for l in range(B_LOADS):
            e = t + l * GROUP
            if b_transposed:
                Bs[g, e % BK, e // BK] = b_regs[l]
            else:
                Bs[g, e // BN, e % BN] = b_regs[l]

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
    def tile_product(a, b, acc, m0, n0, M, N, K):
        As = cuda.shared.array(A_SHARED, float32)
        Bs = cuda.shared.array(B_SHARED, float32)
        partial = cuda.shared.array(PARTIAL, float32)
        a_regs = cuda.local.array(A_LOADS, float32)
        b_regs = cuda.local.array(B_LOADS, float32)
        g, t = cuda.threadIdx.x // GROUP, cuda.threadIdx.x % GROUP
        tx, ty = t % TX, t // TX
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0)
        load_a(a, a_regs, m0, g * BK, M, K, t)
        load_b(b, b_regs, n0, g * BK, N, K, t)
        for k0 in range(0, K, KSPLIT * BK):  # the same trip count in every group
            store_tiles(As, Bs, a_regs, b_regs, g, t)
            cuda.syncthreads()
            if k0 + KSPLIT * BK < K:
                load_a(a, a_regs, m0, k0 + (KSPLIT + g) * BK, M, K, t)
                load_b(b, b_regs, n0, k0 + (KSPLIT + g) * BK, N, K, t)
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


# --- forward: y = act(x @ w + b) ------------------------------------------------

def _make_linear_forward(tile, **jit_options):
    BM, BN, TM, TN, TX, TY = _tile_coords(tile)
    tile_product = _make_tile_product(False, False, tile)

    # Block (by, bx) owns y[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of K, group 0 adds them in order and each of its threads
    # writes its own TM x TN outputs with bias and activation. No atomics.
    @cuda.jit(**jit_options)
    def linear_forward_kernel(x, w, b, y, activation):
        M, K = x.shape
        N = w.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(x, w, acc, m0, n0, M, N, K):
            return
        tx, ty = cuda.threadIdx.x % TX, cuda.threadIdx.x // TX
        for i in range(TM):
            m = m0 + ty + TY * i
            for j in range(TN):
                n = n0 + tx + TX * j
                if m < M and n < N:
                    z = acc[i, j] + b[n]
                    if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                        z = float32(0)
                    y[m, n] = z
        # tanh and sigmoid in a second, rolled pass over this thread's own
        # outputs: inlined 64 times they would stop the loop above from
        # unrolling, and acc would leave registers for local memory.
        if activation == TANH or activation == SIGMOID:
            for i in range(TM):
                m = m0 + ty + TY * i
                for j in range(TN):
                    n = n0 + tx + TX * j
                    if m < M and n < N:
                        y[m, n] = _squash(y[m, n], activation)

    return linear_forward_kernel


_FORWARD = {name: _make_linear_forward(tile) for name, (tile, _) in TILES.items()}


def linear_forward(x, w, b, y, activation):
    """y = act(x @ w + b)."""
    require("x", x, "float32", (None, None))
    M, K = x.shape
    require("w", w, "float32", (K, None))
    N = w.shape[1]
    require("b", b, "float32", (N,))
    require("y", y, "float32", (M, N))
    _check_activation(activation)
    if M == 0 or N == 0:
        return
    size = _pick_tile(M, N)
    grid, threads = _grid(M, N, TILES[size][0])
    _FORWARD[size][grid, threads](x, w, b, y, activation)


# --- backward input: dx = (dy @ w.T) * act'(h) ----------------------------------

def _make_linear_backward_input(tile, **jit_options):
    BM, BN, TM, TN, TX, TY = _tile_coords(tile)
    tile_product = _make_tile_product(False, True, tile)

    # Block (by, bx) owns dx[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the N outputs, group 0 adds them in order and each of
    # its threads writes its own TM x TN input gradients. No atomics.
    @cuda.jit(**jit_options)
    def linear_backward_input_kernel(dy, w, h, dx, activation):
        M, N = dy.shape
        K = w.shape[0]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(dy, w, acc, m0, n0, M, K, N):
            return
        tx, ty = cuda.threadIdx.x % TX, cuda.threadIdx.x // TX
        for i in range(TM):
            m = m0 + ty + TY * i
            for j in range(TN):
                k = n0 + tx + TX * j
                if m < M and k < K:
                    dx[m, k] = acc[i, j]
        # act'(h) in a second, rolled pass over this thread's own outputs, so
        # the loop above unrolls and acc stays in registers.
        if activation != NONE:
            for i in range(TM):
                m = m0 + ty + TY * i
                for j in range(TN):
                    k = n0 + tx + TX * j
                    if m < M and k < K:
                        dx[m, k] *= _activation_grad(h[m, k], activation)

    return linear_backward_input_kernel


_BACKWARD_INPUT = {name: _make_linear_backward_input(tile) for name, (tile, _) in TILES.items()}


def linear_backward_input(dy, w, h, dx, activation):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input.

    With activation NONE, h is not read (pass dx or any (M, K) float32 array).
    """
    require("dy", dy, "float32", (None, None))
    M, N = dy.shape
    require("w", w, "float32", (None, N))
    K = w.shape[0]
    require("h", h, "float32", (M, K))
    require("dx", dx, "float32", (M, K))
    _check_activation(activation)
    if M == 0 or K == 0:
        return
    size = _pick_tile(M, K)
    grid, threads = _grid(M, K, TILES[size][0])
    _BACKWARD_INPUT[size][grid, threads](dy, w, h, dx, activation)


# --- backward weight: dw = beta * dw + x.T @ dy ----------------------------------

def _make_linear_backward_weight(tile, **jit_options):
    BM, BN, TM, TN, TX, TY = _tile_coords(tile)
    tile_product = _make_tile_product(True, False, tile)

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
        if not tile_product(x, dy, acc, m0, n0, K, N, B):
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


_BACKWARD_WEIGHT = {name: _make_linear_backward_weight(tile) for name, (tile, _) in TILES.items()}


def linear_backward_weight(x, dy, dw, beta):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates)."""
    require("x", x, "float32", (None, None))
    B, K = x.shape
    require("dy", dy, "float32", (B, None))
    N = dy.shape[1]
    require("dw", dw, "float32", (K, N))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if K == 0 or N == 0:
        return
    size = _pick_tile(K, N)
    grid, threads = _grid(K, N, TILES[size][0])
    _BACKWARD_WEIGHT[size][grid, threads](x, dy, dw, float32(beta))


def _check_activation(activation):
    if activation not in (NONE, RELU, TANH, SIGMOID):
        raise ValueError(f"unknown activation code {activation!r} (expected one of {NONE}, {RELU}, {TANH}, {SIGMOID})")
