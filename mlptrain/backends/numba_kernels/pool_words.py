"""The kernels of pool.py's max pools and upsamples, on words of channels (CUDA backend).

A thread owns a word of LANES channels and runs the rules on each lane in turn: the first maximum of a window in
row-major order, a NaN winning; the four gradients added in float32 in (0,0) (0,1) (1,0) (1,1) order and rounded
once. argmax keeps a byte a channel, LANES bytes a word's. A word is 8 bytes (4 channels of 16 bits, 2 of 32) where
the channels fill whole words and the arrays are aligned to them (`fits`), else one element (LANES 1): the same
bits either way. One element a thread of a 16-bit tensor is a 64-byte request a warp, too few bytes in flight to
keep HBM busy: the autoencoder's pools and upsamples took 0.79 ms of a 4.48 ms bf16 step at ~1 TB/s, 0.25 ms on
8-byte words (benchmarks/NOTES.md, issue 32 step 2b).

    fits(*arrays)            whether every NHWC array's channels fill whole 8-byte words, 8-byte aligned
    word_bytes(dtype, arrays, argmax=None)   the word the kernels take: 8 where they fit, else one element
    words(array, word)       an array viewed as its words
    max_pool2x2_forward(x, y, argmax)   max_pool2x2_backward(dy, argmax, dx)   upsample2x_backward(dy, dx)
                                        pool.py's launchers' second halves: their arguments checked there
"""

import functools

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint32, uint64
from mlptrain.backends.numba_kernels import streams, wide
from mlptrain.backends.numba_kernels.codecs import bits_float, bits_half, codec, float_bits, half_bits
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.pool_grid import advance, launch_shape, row_walk

WORD = 8  # bytes


def fits(*arrays) -> bool:
    """Whether each C-contiguous NHWC array's rows of channels are whole 8-byte words, its start 8-byte aligned."""
    return all((a.shape[3] * a.dtype.itemsize) % WORD == 0 and wide.address(a) % WORD == 0 for a in arrays)


def word_bytes(dtype, arrays, argmax=None) -> int:
    """The bytes of the word the kernels take for `arrays` in `dtype` (and an argmax beside them): WORD where they fit
    and argmax starts on a boundary of a word's LANES bytes, else one element."""
    size = np.dtype(dtype).itemsize
    if fits(*arrays) and (argmax is None or wide.address(argmax) % (WORD // size) == 0):
        return WORD
    return size


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def words(array, word=WORD):
    """An array viewed as its words of `word` bytes (unsigned integers)."""
    return array.view(_UNSIGNED[word])


@kernel_cache.device
def _bf16_value(u):
    return bits_float(uint32(u) << uint32(16))


@kernel_cache.device
def _bf16_bits(v):
    return uint64(v)


@kernel_cache.device
def _fp16_value(u):
    return float32(bits_half(uint32(u)))


@kernel_cache.device
def _fp16_bits(v):
    return uint64(half_bits(v))


@kernel_cache.device
def _fp32_value(u):
    return bits_float(uint32(u))


@kernel_cache.device
def _fp32_bits(v):
    return uint64(float_bits(v))


_BITS = {  # a lane's bits as the float32 value codec's load gives, and a stored element's (store's) bits
    np.dtype(np.uint16): (_bf16_value, _bf16_bits),
    np.dtype(np.float16): (_fp16_value, _fp16_bits),
    np.dtype(np.float32): (_fp32_value, _fp32_bits),
}


def _lanes(dtype, word):
    """(LANES, BITS, MASK) of a storage format's words of `word` bytes."""
    bits = 8 * np.dtype(dtype).itemsize
    return word * 8 // bits, bits, (1 << bits) - 1


@functools.cache
def _make_max_pool2x2_forward(dtype, word):
    value, _ = _BITS[np.dtype(dtype)]
    LANES, BITS, MASK = _lanes(dtype, word)

    # Thread (c, ow) of block row n*OH + oh owns word c of y[n, oh, ow] and its argmax bytes: it reads the window's
    # four words, and for each lane keeps the first maximum in row-major order; the first NaN beats any number and
    # is never replaced (np.argmax's rule). y gets the winner's stored bits.
    @kernel_cache.jit
    def max_pool2x2_forward_words_kernel(x, y, argmax):
        after_previous_grid()
        N, OH, OW, C = y.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        window = cuda.local.array(4, uint64)
        n, oh, step_n, step_oh = row_walk(OH)
        while n < N:
            for ow in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, OW,
                            cuda.gridDim.y * cuda.blockDim.y):
                for k in range(4):
                    window[k] = x[n, 2 * oh + k // 2, 2 * ow + k % 2, c]
                out, winners = uint64(0), uint32(0)
                for lane in range(LANES):
                    shift = uint64(BITS * lane)
                    chosen = (window[0] >> shift) & uint64(MASK)
                    best, winner = value(chosen), 0
                    for k in range(1, 4):
                        candidate = (window[k] >> shift) & uint64(MASK)
                        v = value(candidate)
                        if v > best or (v != v and best == best):
                            chosen, best, winner = candidate, v, k
                    out |= chosen << shift
                    winners |= uint32(winner) << uint32(8 * lane)
                y[n, oh, ow, c] = out
                argmax[n, oh, ow, c] = winners
            n, oh = advance(n, oh, step_n, step_oh, OH)

    return max_pool2x2_forward_words_kernel


def max_pool2x2_forward(x, y, argmax):
    N, OH, OW, C = y.shape
    word = word_bytes(x.dtype, (x, y), argmax)
    lanes = _lanes(x.dtype, word)[0]
    grid, block = launch_shape(N * OH, OW, C // lanes)
    _make_max_pool2x2_forward(x.dtype, word)[grid, block, streams.current()](
        words(x, word), words(y, word), words(argmax, lanes))


@functools.cache
def _make_max_pool2x2_backward(lanes_bits):
    LANES, BITS, MASK = lanes_bits
    NONE = 0x04040404  # every lane's winner 4: none (a trailing cell)

    # Thread (c, j) of block row n*CH + i owns word c of the 2x2 cell dx[n, 2i:2i+2, 2j:2j+2]: each lane of dy's word
    # goes to its winner, zeros (all bits clear in every format) to the other three. Cells are ceil(H/2) x ceil(W/2):
    # the odd trailing row and column are cells of their own, with no window, all zero. Every dx word has one owner,
    # so no zeroing launch and no atomics.
    @kernel_cache.jit
    def max_pool2x2_backward_words_kernel(dy, argmax, dx):
        after_previous_grid()
        N, H, W, C = dx.shape
        OH, OW = dy.shape[1], dy.shape[2]
        CH, CW = (H + 1) // 2, (W + 1) // 2
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        n, i, step_n, step_i = row_walk(CH)
        while n < N:
            for j in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, CW,
                           cuda.gridDim.y * cuda.blockDim.y):
                winners, grad = uint32(NONE), uint64(0)
                if i < OH and j < OW:
                    winners, grad = uint32(argmax[n, i, j, c]), uint64(dy[n, i, j, c])
                for k in range(4):
                    h, w = 2 * i + k // 2, 2 * j + k % 2
                    if h < H and w < W:
                        out = uint64(0)
                        for lane in range(LANES):
                            if (winners >> uint32(8 * lane)) & uint32(0xFF) == uint32(k):
                                out |= grad & (uint64(MASK) << uint64(BITS * lane))
                        dx[n, h, w, c] = out
            n, i = advance(n, i, step_n, step_i, CH)

    return max_pool2x2_backward_words_kernel


def max_pool2x2_backward(dy, argmax, dx):
    N, H, W, C = dx.shape
    word = word_bytes(dx.dtype, (dy, dx), argmax)
    lanes_bits = _lanes(dx.dtype, word)
    grid, block = launch_shape(N * ((H + 1) // 2), (W + 1) // 2, C // lanes_bits[0])
    _make_max_pool2x2_backward(lanes_bits)[grid, block, streams.current()](
        words(dy, word), words(argmax, lanes_bits[0]), words(dx, word))


@functools.cache
def _make_upsample2x_backward(dtype, word):
    _, store = codec(dtype)
    value, to_bits = _BITS[np.dtype(dtype)]
    LANES, BITS, MASK = _lanes(dtype, word)

    # Thread (c, w) of block row n*H + h owns word c of dx[n, h, w]: it gathers the four dy words it was copied to,
    # and adds each lane's four in float32, always in the order (0,0) (0,1) (1,0) (1,1), rounding once. A gather,
    # not a scatter: no atomics.
    @kernel_cache.jit
    def upsample2x_backward_words_kernel(dy, dx):
        after_previous_grid()
        N, H, W, C = dx.shape
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if c >= C:
            return
        n, h, step_n, step_h = row_walk(H)
        while n < N:
            for w in range(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y, W,
                           cuda.gridDim.y * cuda.blockDim.y):
                a, b = uint64(dy[n, 2 * h, 2 * w, c]), uint64(dy[n, 2 * h, 2 * w + 1, c])
                d, e = uint64(dy[n, 2 * h + 1, 2 * w, c]), uint64(dy[n, 2 * h + 1, 2 * w + 1, c])
                out = uint64(0)
                for lane in range(LANES):
                    shift, mask = uint64(BITS * lane), uint64(MASK)
                    total = value((a >> shift) & mask) + value((b >> shift) & mask)
                    total += value((d >> shift) & mask)
                    total += value((e >> shift) & mask)
                    out |= (to_bits(store(total)) & mask) << shift
                dx[n, h, w, c] = out
            n, h = advance(n, h, step_n, step_h, H)

    return upsample2x_backward_words_kernel


def upsample2x_backward(dy, dx):
    N, H, W, C = dx.shape
    word = word_bytes(dx.dtype, (dy, dx))
    grid, block = launch_shape(N * H, W, C // _lanes(dx.dtype, word)[0])
    _make_upsample2x_backward(dx.dtype, word)[grid, block, streams.current()](words(dy, word), words(dx, word))

