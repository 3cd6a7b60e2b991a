"""2x2 max pooling and nearest x2 upsampling, forward and backward (CUDA backend).

Layout NHWC, C-contiguous; every tensor of one call in one storage format
(float32, float16, or bf16 in uint16), argmax in uint8. Max pooling takes the
floor of odd sizes, as PyTorch does: the last row or column of an odd input
is never selected and gets a zero gradient.

All four kernels share one decomposition: a thread owns one element
(n, i, j, c) of the small tensor (pooled, or not yet upsampled) and the 2x2
cell (n, 2i:2i+2, 2j:2j+2, c) of the large one. It reads what it needs of
its cell and computes what it owns alone, so no element is written by two
threads and no kernel needs atomics or a zeroing launch; a thread per cell
rather than per large element does the index arithmetic and the small side's
loads once for four elements (the blocks: pool_grid). Where the channels fill
8-byte words, pool_words runs the same rules a word of channels a thread,
with the same bits. Selections and copies
(pool forward and backward, upsample forward) move stored bits unchanged, so
they are exact; upsample backward sums four values in float32 in a fixed
order and rounds once.
"""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint8
from mlptrain.backends.numba_kernels import pool_words, streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.pool_grid import advance, launch_shape, row_walk


def _nhwc(name, array):
    require_one_of(name, array, STORAGE_DTYPES, (None, None, None, None))
    return array.shape


# --- max pool 2x2, forward ---------------------------------------------------------

@functools.cache
def _make_max_pool2x2_forward(dtype):
    load, _ = codec(dtype)

    # Thread (c, ow) of block row n*OH + oh owns y[n, oh, ow, c] and
    # argmax[n, oh, ow, c]: it reads the window's four inputs in row-major
    # order and keeps the first maximum; the first NaN beats any number and
    # is never replaced (np.argmax's rule). y gets the winner's stored bits.
    @kernel_cache.jit
    def max_pool2x2_forward_kernel(x, y, argmax):
        after_previous_grid()
        N, OH, OW, C = y.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        n, oh, step_n, step_oh = row_walk(OH)
        while n < N:
            for ow in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, OW,
                            cuda.gridDim.y * cuda.blockDim.y):
                h, w = 2 * oh, 2 * ow
                stored = x[n, h, w, c]
                best, winner = load(stored), 0
                for k in range(1, 4):
                    candidate = x[n, h + k // 2, w + k % 2, c]
                    v = load(candidate)
                    if v > best or (v != v and best == best):
                        stored, best, winner = candidate, v, k
                y[n, oh, ow, c] = stored
                argmax[n, oh, ow, c] = uint8(winner)
            n, oh = advance(n, oh, step_n, step_oh, OH)

    return max_pool2x2_forward_kernel


def max_pool2x2_forward(x, y, argmax):
    """y[n, i, j, c] = max of x[n, 2i:2i+2, 2j:2j+2, c]; argmax[n, i, j, c] = the winner's
    position k = 2 * row + column in its window (0..3).

    Ties go to the first position in row-major order, as np.argmax; a NaN in a
    window wins (the first NaN if several), so NaN propagates to y. Odd H or W:
    floor, the last row or column is ignored.
    """
    N, H, W, C = _nhwc("x", x)
    out = (N, H // 2, W // 2, C)
    require("y", y, x.dtype, out)
    require("argmax", argmax, "uint8", out)
    if y.size == 0:
        return
    if pool_words.fits(x, y) and pool_words.argmax_fits(argmax, x.dtype):
        pool_words.max_pool2x2_forward(x, y, argmax)
        return
    grid, block = launch_shape(N * out[1], out[2], C)
    _make_max_pool2x2_forward(x.dtype)[grid, block, streams.current()](x, y, argmax)


# --- max pool 2x2, backward --------------------------------------------------------

@functools.cache
def _make_max_pool2x2_backward(dtype):
    _, store = codec(dtype)

    # Thread (c, j) of block row n*CH + i owns the 2x2 cell dx[n, 2i:2i+2,
    # 2j:2j+2, c]: it reads its window's argmax and dy once and writes dy to the
    # winner, zero to the other three. Cells are ceil(H/2) x ceil(W/2): the odd
    # trailing row and column are cells of their own, with no window, all zero.
    # Every dx element has one owner, so no zeroing launch and no atomics.
    @kernel_cache.jit
    def max_pool2x2_backward_kernel(dy, argmax, dx):
        after_previous_grid()
        N, H, W, C = dx.shape
        OH, OW = dy.shape[1], dy.shape[2]
        CH, CW = (H + 1) // 2, (W + 1) // 2
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        zero = store(float32(0))
        n, i, step_n, step_i = row_walk(CH)
        while n < N:
            for j in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, CW,
                           cuda.gridDim.y * cuda.blockDim.y):
                winner, grad = 4, zero  # 4: no position wins in a trailing cell
                if i < OH and j < OW:
                    winner, grad = argmax[n, i, j, c], dy[n, i, j, c]
                for k in range(4):
                    h, w = 2 * i + k // 2, 2 * j + k % 2
                    if h < H and w < W:
                        dx[n, h, w, c] = grad if k == winner else zero
            n, i = advance(n, i, step_n, step_i, CH)

    return max_pool2x2_backward_kernel


def max_pool2x2_backward(dy, argmax, dx):
    """dx[n, h, w, c] = dy[n, h//2, w//2, c] where (h, w) was its window's argmax, else 0.

    dx (N, H, W, C) is written completely; dy and argmax are (N, H//2, W//2, C).
    """
    N, H, W, C = _nhwc("dx", dx)
    out = (N, H // 2, W // 2, C)
    require("dy", dy, dx.dtype, out)
    require("argmax", argmax, "uint8", out)
    if dx.size == 0:
        return
    if pool_words.fits(dy, dx) and pool_words.argmax_fits(argmax, dx.dtype):
        pool_words.max_pool2x2_backward(dy, argmax, dx)
        return
    grid, block = launch_shape(N * ((H + 1) // 2), (W + 1) // 2, C)
    _make_max_pool2x2_backward(dx.dtype)[grid, block, streams.current()](dy, argmax, dx)


# --- nearest upsample x2, forward ----------------------------------------------------

# Thread (c, w) of block row n*H + h reads x[n, h, w, c] once and owns its 2x2
# cell of y, writing the stored bits to all four: no element of y has two
# writers. One kernel serves every storage format: it only copies.
@kernel_cache.jit
def upsample2x_forward_kernel(x, y):
    after_previous_grid()
    N, H, W, C = x.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c >= C:
        return
    n, h, step_n, step_h = row_walk(H)
    while n < N:
        for w in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, W, cuda.gridDim.y * cuda.blockDim.y):
            value = x[n, h, w, c]
            y[n, 2 * h, 2 * w, c] = value
            y[n, 2 * h, 2 * w + 1, c] = value
            y[n, 2 * h + 1, 2 * w, c] = value
            y[n, 2 * h + 1, 2 * w + 1, c] = value
        n, h = advance(n, h, step_n, step_h, H)


def upsample2x_forward(x, y):
    """y[n, h, w, c] = x[n, h // 2, w // 2, c]: nearest neighbour, y (N, 2H, 2W, C)."""
    N, H, W, C = _nhwc("x", x)
    require("y", y, x.dtype, (N, 2 * H, 2 * W, C))
    if y.size == 0:
        return
    if pool_words.fits(x, y):  # it copies bits: 8-byte words of them, where the channels fill words
        x, y, C = pool_words.words(x), pool_words.words(y), C * x.dtype.itemsize // pool_words.WORD
    grid, block = launch_shape(N * H, W, C)
    upsample2x_forward_kernel[grid, block, streams.current()](x, y)


# --- nearest upsample x2, backward ---------------------------------------------------

@functools.cache
def _make_upsample2x_backward(dtype):
    load, store = codec(dtype)

    # Thread (c, w) of block row n*H + h owns dx[n, h, w, c]: it gathers the
    # four dy it was copied to and adds them in float32, always in the order
    # (0,0) (0,1) (1,0) (1,1), rounding once. A gather, not a scatter: no atomics.
    @kernel_cache.jit
    def upsample2x_backward_kernel(dy, dx):
        after_previous_grid()
        N, H, W, C = dx.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        n, h, step_n, step_h = row_walk(H)
        while n < N:
            for w in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, W,
                           cuda.gridDim.y * cuda.blockDim.y):
                total = load(dy[n, 2 * h, 2 * w, c]) + load(dy[n, 2 * h, 2 * w + 1, c])
                total += load(dy[n, 2 * h + 1, 2 * w, c])
                total += load(dy[n, 2 * h + 1, 2 * w + 1, c])
                dx[n, h, w, c] = store(total)
            n, h = advance(n, h, step_n, step_h, H)

    return upsample2x_backward_kernel


def upsample2x_backward(dy, dx):
    """dx[n, h, w, c] = the sum of dy[n, 2h:2h+2, 2w:2w+2, c], added in float32 in row-major
    order and rounded once to dx's format; dy (N, 2H, 2W, C)."""
    N, H, W, C = _nhwc("dx", dx)
    require("dy", dy, dx.dtype, (N, 2 * H, 2 * W, C))
    if dx.size == 0:
        return
    if pool_words.fits(dy, dx):
        pool_words.upsample2x_backward(dy, dx)
        return
    grid, block = launch_shape(N * H, W, C)
    _make_upsample2x_backward(dx.dtype)[grid, block, streams.current()](dy, dx)
