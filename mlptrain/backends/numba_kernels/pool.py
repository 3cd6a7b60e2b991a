"""2x2 max pooling and nearest x2 upsampling, forward and backward (CUDA backend).

Layout NHWC, C-contiguous; every tensor of one call in one storage format
(float32, float16, or bf16 in uint16), argmax in uint8. Max pooling takes the
floor of odd sizes, as PyTorch does: the last row or column of an odd input
is never selected and gets a zero gradient.

All four kernels share one decomposition: a thread owns one word of channels
(n, i, j, c) of the small tensor (pooled, or not yet upsampled) and the 2x2
cell (n, 2i:2i+2, 2j:2j+2, c) of the large one: 8 bytes of channels where
they fill such words, else one element (pool_words, which holds the pools'
and the upsample gradient's kernels; the blocks: pool_grid). It reads what it
needs of its cell and computes what it owns alone, so no element is written by
two threads and no kernel needs atomics or a zeroing launch; a thread per cell
rather than per large element does the index arithmetic and the small side's
loads once for four elements. Selections and copies (pool forward and
backward, upsample forward) move stored bits unchanged, so they are exact;
upsample backward sums four values in float32 in a fixed order and rounds
once.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda
from mlptrain.backends.numba_kernels import pool_words, streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.pool_grid import advance, launch_shape, row_walk


def _nhwc(name, array):
    require_one_of(name, array, STORAGE_DTYPES, (None, None, None, None))
    return array.shape


# --- max pool 2x2, forward ---------------------------------------------------------

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
    pool_words.max_pool2x2_forward(x, y, argmax)


# --- max pool 2x2, backward --------------------------------------------------------

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
    pool_words.max_pool2x2_backward(dy, argmax, dx)


# --- nearest upsample x2, forward ----------------------------------------------------

# Thread (c, w) of block row n*H + h reads word c of x[n, h, w] once and owns
# its 2x2 cell of y, writing the stored bits to all four: no word of y has two
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
    word = pool_words.word_bytes(x.dtype, (x, y))  # it copies bits: 8-byte words of them where they fill words
    x, y, C = pool_words.words(x, word), pool_words.words(y, word), C * x.dtype.itemsize // word
    grid, block = launch_shape(N * H, W, C)
    upsample2x_forward_kernel[grid, block, streams.current()](x, y)


# --- nearest upsample x2, backward ---------------------------------------------------

def upsample2x_backward(dy, dx):
    """dx[n, h, w, c] = the sum of dy[n, 2h:2h+2, 2w:2w+2, c], added in float32 in row-major
    order and rounded once to dx's format; dy (N, 2H, 2W, C)."""
    N, H, W, C = _nhwc("dx", dx)
    require("dy", dy, dx.dtype, (N, 2 * H, 2 * W, C))
    if dx.size == 0:
        return
    pool_words.upsample2x_backward(dy, dx)
