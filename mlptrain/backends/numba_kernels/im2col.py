"""im2col addressing for the implicit-GEMM convolutions (CUDA backend): gemm `Operand`s that read a
convolution's column matrix straight from the image, for conv's CUDA-core tiles and conv_mma's
tensor-core tiles alike. No column buffer is ever written.

Pixel and column indices are split into (n, h, w) and (tap, channel) by
divisions by H, W and C, known only at run time: each thread derives
multiply-and-shift constants for them once, decodes the pixels it loads once
per tile and its columns once per K slice into packed codes, so the loaders
never divide and an element's fetch only unpacks fields.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import float32, uint64
from mlptrain.backends.numba_kernels import tiles
from mlptrain.backends.numba_kernels.tiles import Operand


@kernel_cache.device
def _divider(d):
    """(d, multiplier, shift) with n // d == (n * multiplier) >> shift for
    0 <= n < 2**31, 1 <= d < 2**31: multiplier = ceil(2**(31+l) / d) with
    2**l >= d, below 2**32, so the product fits int64 (division by invariant
    integers using multiplication: Granlund & Montgomery, PLDI 1994)."""
    l = 0
    while (1 << l) < d:
        l += 1
    return d, ((1 << (31 + l)) + d - 1) // d, 31 + l


@kernel_cache.device
def _divmod(n, divider):
    d, multiplier, shift = divider
    q = (n * multiplier) >> shift
    return q, n - q * d


@kernel_cache.device
def _image_geometry(x):
    """Dividers by W, H and C of an NHWC image."""
    return _divider(x.shape[2]), _divider(x.shape[1]), _divider(x.shape[3])


@kernel_cache.device
def _kernel_geometry(w):
    """The divider by Cout of a (KS*KS, Cin, Cout) kernel."""
    return _divider(w.shape[2])


# A pixel and a column of im2col are decoded once into int64 codes (a thread's pixels once per tile, its
# column once per K slice), so a fetch only unpacks fields: pixel (n, h, w) as n << 32 | h << 16 | w and
# column (tap, c) as dh << 48 | dw << 32 | c; -1 outside the matrix. Decoding both per element had
# made the convolutions' tile loads cost as much as their products (11-15 TFLOP/s against the dense
# products' 25-27 on an H100).
@kernel_cache.device
def pixel_code(x, geometry, pixel, pixels):
    by_width, by_height, _ = geometry
    if pixel >= pixels:
        return -1
    row, w = _divmod(pixel, by_width)
    n, h = _divmod(row, by_height)
    return (n << 32) | (h << 16) | w


def _make_tap_code(size):
    @kernel_cache.device
    def tap_code(x, geometry, column, columns):
        if column >= columns:
            return -1
        tap, c = _divmod(column, geometry[2])
        return ((tap // size) << 48) | ((tap % size) << 32) | c

    return tap_code


def _make_image_element(load, size, zero):
    """Device function: im2col(x)[pixel, column] for a size x size kernel from their codes, i.e.
    load(x[n, h + dh - P, w + dw - P, c]) for pixel (n, h, w) and column (dh, dw, c), zero() in the
    padding."""
    PAD = size // 2

    @kernel_cache.device
    def element(x, geometry, pixel, column):
        by_width, by_height, _ = geometry
        if (pixel | column) < 0:
            return zero()
        hh = ((pixel >> 16) & 0xFFFF) + (column >> 48) - PAD
        ww = (pixel & 0xFFFF) + ((column >> 32) & 0xFFFF) - PAD
        if 0 <= hh < by_height[0] and 0 <= ww < by_width[0]:
            return load(x[uint64(pixel >> 32), uint64(hh), uint64(ww), uint64(column & 0xFFFFFFFF)])
        return zero()

    return element


def image_rows_operand(load, size, zero=tiles.float_zero):
    """im2col(x) as the A operand of the pixel-row products (forward,
    backward input): rows are pixels, the summed index is (tap, channel),
    contiguous along the channel."""
    return Operand(_image_geometry, pixel_code, _make_tap_code(size), _make_image_element(load, size, zero), True)


def image_columns_operand(load, size, zero=tiles.float_zero):
    """im2col(x).T as the A operand of the weight gradient: rows are (tap, channel), contiguous along
    the channel; the summed index is the pixel."""
    element = _make_image_element(load, size, zero)

    @kernel_cache.device
    def fetch(x, geometry, column, pixel):
        return element(x, geometry, pixel, column)

    return Operand(_image_geometry, _make_tap_code(size), pixel_code, fetch, False)


def flipped_kernel_operand(load, size):
    """w' as the B operand of the input gradient: element ((tap, cout), cin)
    is w[T-1-tap, cin, cout] of w viewed (T, Cin, Cout), T = size * size
    (flipping dh and dw reverses the tap index); contiguous along cout. Column code: the flipped
    tap << 32 | cout."""
    LAST_TAP = size * size - 1

    @kernel_cache.device
    def column(w, by_outputs, k, K):
        if k >= K:
            return -1
        tap, cout = _divmod(k, by_outputs)
        return ((LAST_TAP - tap) << 32) | cout

    @kernel_cache.device
    def fetch(w, by_outputs, cin, k):
        if (cin | k) < 0:
            return float32(0)
        return load(w[uint64(k >> 32), uint64(cin), uint64(k & 0xFFFFFFFF)])

    return Operand(_kernel_geometry, tiles.index_code, column, fetch, True)
