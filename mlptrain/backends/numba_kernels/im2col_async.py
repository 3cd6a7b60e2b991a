"""A convolution's column matrix copied by cp.async, straight from its NHWC image (CUDA backend, sm_80+).

im2col.py's operands fetch an element at a time through registers, each decoded from its (pixel, tap, channel)
code: the 16-bit convolutions' tiles spent more on that than on their products (benchmarks/NOTES.md, issue 32).
Here the same matrices are gemm_async `Copied` operands: where an image's channels are whole 16-byte pieces (8
bf16 / fp16 values), a piece of the column matrix is 8 channels of one tap at one pixel, i.e. 16 contiguous bytes
of the image, or zeros in the padding; one cp.async copies it into the ring of slices, and the tile's products
read it there as they read a stored matrix's. No column buffer is written; the bits are the register path's.

    image_rows(size)     im2col(x), rows the pixels and k (tap, channel): the forward's and input gradient's A
    image_columns(size)  im2col(x).T, rows (tap, channel) and k the pixels: the weight gradient's A

A piece never straddles two taps, as the channels are whole pieces. A copy decodes its pixel once a tile and its
k once a slice (one division by the channels, a thread's copies sharing it where they share their k); the weight
gradient's copies decode their pixel a slice (two divisions) and their (tap, channel) once a tile.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import int32, int64, uint32
from mlptrain.backends.numba_kernels import wide
from mlptrain.backends.numba_kernels.async_copy import copy16_to, shared_address
from mlptrain.backends.numba_kernels.gemm_async import COPY_BYTES, Copied, shared_layout


def copyable_image(array) -> bool:
    """Whether cp.async can copy an NHWC `array`'s column matrix in 16-byte pieces: its channels contiguous and a
    multiple of 16 bytes, every other stride a multiple of 16 bytes, its first element 16-byte aligned."""
    if len(array.shape) != 4:
        return False
    size, strides = array.dtype.itemsize, tuple(array.strides)
    if strides[-1] != size or (array.shape[3] * size) % COPY_BYTES or any(s % COPY_BYTES for s in strides[:-1]):
        return False
    return wide.address(array) % COPY_BYTES == 0


def copyable(image, matrix) -> bool:
    """Whether a pass over `image` (NHWC) and a stored `matrix` can copy its slices by cp.async: both in whole,
    16-byte aligned pieces (conv_mma's and conv_tf32's rings)."""
    return copyable_image(image) and wide.copyable_rows(matrix)


@kernel_cache.device
def _quotient(n, d):
    """n // d for 0 <= n, d < 2**31, as a 32-bit division (numba's integers are 64-bit, and a 64-bit division takes
    several times the instructions)."""
    return int32(uint32(n) // uint32(d))


def _pieces(operand, ROWS, BK, THREADS, size):
    """(PER, WORD, ROW, K, ELEMENTS, COPIES) of an operand's slice: elements a piece, elements a shared word, the
    shared layout's steps and elements (gemm_async.shared_layout) and copies a thread."""
    PER = COPY_BYTES // size
    ROW, K, ELEMENTS = shared_layout(operand, ROWS, BK, size)
    pieces = ROWS * BK // PER
    if pieces % THREADS or BK % PER or ROWS % PER:
        raise ValueError(f"{pieces} pieces of a {ROWS} x {BK} slice do not split over {THREADS} threads")
    return PER, 4 // size, ROW, K, ELEMENTS, pieces // THREADS


def image_rows(size):
    """im2col(x) of a size x size kernel, x (N, H, W, C) with C a multiple of 16 bytes' elements, as the
    k-contiguous A of the pixel-row passes: row `pixel`, k = tap * C + channel. Copy c of a thread keeps its
    pixel's byte offset, -1 past the pixels (`offsets`), its (h, w) as the bits h << 16 | w (`ks`), and the k of
    its piece in the first slice (`extra`)."""
    PAD = size // 2

    def make_copy(ROWS, BK, THREADS, elements):
        PER, WORD, ROW, _, ELEMENTS, COPIES = _pieces(Copied(True, None), ROWS, BK, THREADS, elements)
        ACROSS = BK // PER  # pieces a row of the slice
        SHARED_K = THREADS % ACROSS == 0  # every copy of a thread at one k: its tap decoded once a slice

        @kernel_cache.device
        def plan(x, shared, i0, I, k_begin, K, t, offsets, ks, addresses, extra):
            H, W = x.shape[1], x.shape[2]
            for c in range(COPIES):
                e = t + c * THREADS
                r, k = e // ACROSS, (e % ACROSS) * PER
                addresses[c] = shared_address(shared, (r * ROW + k) // WORD)
                extra[c] = k_begin + k
                pixel = i0 + r
                offsets[c], ks[c] = int64(-1), int32(0)
                if pixel < I:
                    n = _quotient(pixel, H * W)
                    h = _quotient(pixel - n * H * W, W)
                    w = pixel - n * H * W - h * W
                    offsets[c] = n * x.strides[0] + h * x.strides[1] + w * x.strides[2]
                    ks[c] = int32(uint32((h << 16) | w))  # h and w below 2**16 (conv.MAX_SIDE)

        @kernel_cache.device
        def decode(k, C):
            """(tap's dh, dw, channel) of k."""
            tap = _quotient(k, C)
            dh = tap // size
            return dh, tap - dh * size, k - tap * C

        @kernel_cache.device
        def copy(shared, buffer, x, offsets, ks, addresses, extra, s, K):
            H, W, C = int32(x.shape[1]), int32(x.shape[2]), int32(x.shape[3])
            there = uint32(buffer * (ELEMENTS * elements))
            k = int32(extra[0] + s * BK)
            dh, dw, channel = decode(k, C)
            for c in range(COPIES):
                if not SHARED_K:  # (a constant of the closure)
                    k = int32(extra[c] + s * BK)
                    dh, dw, channel = decode(k, C)
                code = uint32(ks[c])
                hh, ww = int32(code >> uint32(16)) + dh - PAD, int32(code & uint32(0xFFFF)) + dw - PAD
                valid = k < K and offsets[c] >= 0 and 0 <= hh < H and 0 <= ww < W
                offset = offsets[c] + (dh - PAD) * x.strides[1] + (dw - PAD) * x.strides[2] + channel * elements
                # a piece in the padding reads nothing: the image's first bytes stand in (async_copy's rule)
                copy16_to(uint32(addresses[c] + there), shared, x, offset if valid else int64(0), valid)

        return plan, copy, COPIES

    return Copied(True, make_copy)


def image_columns(size):
    """im2col(x).T of a size x size kernel, x (N, H, W, C) as image_rows takes it, as the row-contiguous A of the
    weight gradient: row tap * C + channel, k the pixel. Copy c of a thread keeps the byte offset of its rows'
    tap and channel from a pixel (`offsets`), the pixel of its piece in the first slice (`ks`), and its tap as
    dh << 16 | dw, -1 past the rows (`extra`)."""
    PAD = size // 2

    def make_copy(ROWS, BK, THREADS, elements):
        PER, WORD, _, K_STEP, ELEMENTS, COPIES = _pieces(Copied(False, None), ROWS, BK, THREADS, elements)
        ACROSS = ROWS // PER  # pieces a k of the slice

        @kernel_cache.device
        def plan(x, shared, i0, I, k_begin, K, t, offsets, ks, addresses, extra):
            C = x.shape[3]
            for c in range(COPIES):
                e = t + c * THREADS
                r, k = (e % ACROSS) * PER, e // ACROSS
                addresses[c] = shared_address(shared, (k * K_STEP + r) // WORD)
                ks[c] = k_begin + k
                row = i0 + r
                offsets[c], extra[c] = int64(0), int32(-1)
                if row < I:
                    tap = _quotient(row, C)
                    dh = tap // size
                    dw = tap - dh * size
                    offsets[c] = (dh - PAD) * x.strides[1] + (dw - PAD) * x.strides[2] + (row - tap * C) * elements
                    extra[c] = int32((dh << 16) | dw)

        @kernel_cache.device
        def copy(shared, buffer, x, offsets, ks, addresses, extra, s, K):
            H, W = int32(x.shape[1]), int32(x.shape[2])
            there = uint32(buffer * (ELEMENTS * elements))
            for c in range(COPIES):
                pixel = int32(ks[c] + s * BK)
                n = _quotient(pixel, H * W)
                h = _quotient(pixel - n * H * W, W)
                w = pixel - n * H * W - h * W
                code = extra[c]
                hh, ww = h + (code >> 16) - PAD, w + (code & 0xFFFF) - PAD
                valid = pixel < K and code >= 0 and 0 <= hh < H and 0 <= ww < W
                offset = n * x.strides[0] + h * x.strides[1] + w * x.strides[2] + offsets[c]
                copy16_to(uint32(addresses[c] + there), shared, x, offset if valid else int64(0), valid)

        return plan, copy, COPIES

    return Copied(False, make_copy)
