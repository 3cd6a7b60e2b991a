"""Padding for 16-bit convolutions whose one side has fewer channels than a 16-byte piece (an RGB image, the
decoder's RGB output), so that conv_mma's cp.async ring can run them (CUDA backend).

conv_mma's ring copies its column matrices 16 bytes at a time, eight channels of one tap at one pixel: three
channels are no such piece, so those passes ran on CUDA cores (conv_wide, conv_narrow) or staged through registers
with 27 of a tile's 128 rows in use, 1.66 ms of a 4.48 ms bf16 step (benchmarks/NOTES.md, issue 32 step 2). Here
conv.py first copies the narrow side into a scratch buffer with its channels padded to PIECE by zeros, and runs
conv_mma's pass on the padded arrays (which passes: conv_plan.PADDED). The zeros add exact zeros to every sum, so
each output is its channels' sum in the ring's fixed order: reproducible bits, within the tensor-core passes'
bounds.

    pad(source, padded)               padded[a, c, b] = source[a, c, b] for c < C, else 0; source (A, C, B)
    add_chunks(partials, dw, beta)    dw = beta * dw + the chunks' partials of a weight gradient with Cin padded,
                                      added in chunk order (chunks.add_chunks' order), the padding's rows dropped
    pieces(buffer, *sizes)            consecutive 16-byte aligned parts of a 1-D buffer (pieces_elements: its size)

No atomics: every element has one writer.
"""

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint16
from mlptrain.backends.numba_kernels import chunks, streams
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

PIECE = 8  # 16-bit channels a 16-byte piece: what a side is padded to


def pieces(buffer, *sizes):
    """Consecutive parts of a 1-D `buffer` of `sizes` of its elements, each starting a multiple of 16 bytes after
    the buffer's start."""
    step = 16 // buffer.dtype.itemsize
    parts, start = [], 0
    for size in sizes:
        parts.append(buffer[start:start + size])
        start += -(-size // step) * step
    return parts


def pieces_elements(itemsize, *sizes) -> int:
    """The elements of `itemsize` bytes that `pieces` takes from a buffer for `sizes`."""
    step = 16 // itemsize
    return sum(-(-size // step) * step for size in sizes)


# Thread t writes padded elements t, t + stride, ... as raw 16-bit bits: one writer each.
@kernel_cache.jit
def pad_kernel(source, padded):
    after_previous_grid()
    A, CP, B = padded.shape
    C = source.shape[1]
    for e in range(cuda.grid(1), A * CP * B, cuda.gridsize(1)):
        a, rest = e // (CP * B), e % (CP * B)
        c, b = rest // B, rest % B
        padded[a, c, b] = source[a, c, b] if c < C else uint16(0)


def pad(source, padded):
    """padded (A, CP, B) = source (A, C, B) with zeros for channels C..CP-1, both C-contiguous 16-bit arrays."""
    elements = padded.size
    if elements:
        blocks = chunks.sum_blocks(elements)
        pad_kernel[blocks, chunks.SUM_THREADS, streams.current()](source.view(np.uint16), padded.view(np.uint16))


# Thread t owns dw[t], dw[t + stride], ...: it adds the chunks' partials in chunk order, as chunks.chunk_sum_kernel
# does, so the sums are the same bits; beta == 0 never reads dw.
@kernel_cache.jit
def padded_chunk_sum_kernel(partials, dw, beta):
    after_previous_grid()
    taps, C, Cout = dw.shape
    for e in range(cuda.grid(1), taps * C * Cout, cuda.gridsize(1)):
        tap, rest = e // (C * Cout), e % (C * Cout)
        c, o = rest // Cout, rest % Cout
        total = float32(0)
        for z in range(partials.shape[0]):
            total += partials[z, tap, c, o]
        if beta == float32(0):
            dw[tap, c, o] = total
        else:
            dw[tap, c, o] = beta * dw[tap, c, o] + total


def add_chunks(partials, dw, beta):
    """dw (KS, KS, Cin, Cout) = beta * dw + partials (chunks, KS * KS * PIECE * Cout), the chunks' partials of a
    weight gradient whose Cin was padded to PIECE, summed over axis 0 in order: the real rows; float32."""
    size, _, Cin, Cout = dw.shape
    taps = size * size
    blocks = chunks.sum_blocks(dw.size)
    padded_chunk_sum_kernel[blocks, chunks.SUM_THREADS, streams.current()](
        partials.reshape(partials.shape[0], taps, PIECE, Cout), dw.reshape(taps, Cin, Cout), float32(beta))
