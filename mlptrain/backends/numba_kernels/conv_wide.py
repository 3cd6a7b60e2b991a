"""Direct convolutions summing a few channels into many (CUDA backend): conv_narrow's mirror case.

A wide output summing K = KS * KS * 3 values each (the 3 -> 256 layer's
forward, the 256 -> 3 layer's input gradient) took 0.36-0.66 ms through the
GEMMs on an H100 for 1.8 G FMAs, the im2col fetches again the cost; these
kernels took 0.19 and 0.26 ms. conv.py dispatches here when `wide_fits(KS, C)` of
the summed side C (after conv_narrow.fits for the forward: a layer narrow on both
sides keeps conv_narrow's forward).

    forward          y  = act(conv(x, w) + b)           thread: one output channel over a row stretch
    backward input   dx = conv(dy, w flipped) * act'(h)  thread: one input channel over a row stretch

No atomics: every output has one owning thread summing in a fixed order, so results are bitwise
reproducible. The launchers are the second half of conv's, which have checked every argument.
"""

import functools
import math

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import streams, tiles
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.conv_narrow import LANES, even_segment
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

WIDE_IN = 4  # convolutions summing at most this many channels a tap...
MAX_TAP_INPUTS = 36  # ...when the KS * KS * C weights of a wide channel fit a thread's registers
WIDE_THREADS = 256  # wide channels per block
WIDE_STRETCH = 64  # pixels of a row a block covers at most (its narrow values staged at once)...
WIDE_SEGMENT = 8  # ...and a thread sums at once, in registers (the loops unroll; at 14+ pixels of a
# 3 x 3 x 4 kernel NVVM left them rolled, and 16 pixels with the input gradient's act'(h) spill)

# The mirror of conv_narrow's kernels: here the OUTPUT is wide (C_big channels) and each of its elements
# sums KS * KS taps of a narrow image (C_small <= WIDE_IN channels). Forward: y = act(conv(x, w) + b)
# from x of Cin <= 4 (the encoder's RGB input). Input gradient: dx = conv(dy, flipped w) * act'(h)
# from dy of Cout <= 4 (the decoder's RGB output). Both take the same kernel body: a thread owns one
# wide channel, keeps its KS * KS * C_small weights in registers and walks a stretch of one image
# row, reading the narrow image's values from a shared-memory window every thread of the block uses.

def wide_fits(size, summed):
    """Whether a size x size convolution that sums `summed` channels a tap takes the wide kernels
    (the forward's Cin, the input gradient's Cout)."""
    return summed <= WIDE_IN and size * size * summed <= MAX_TAP_INPUTS


def _make_wide_stage(load, size, summed, columns):
    """Device function: the block's threads copy the narrow image's rows row - P .. row + P, columns
    w0 - P .. w0 - P + columns - 1 (all C channels) into shared memory as float32 [dh, column, c],
    zero outside the image. Each staged row is contiguous in the image too (coalesced loads)."""
    PAD, ROW = size // 2, columns * summed

    @kernel_cache.device
    def stage(small, window, row, h, w0, height, width):
        for e in range(cuda.threadIdx.x, size * ROW, cuda.blockDim.x):
            dh, k = e // ROW, e % ROW  # k = column * C + c
            ww = w0 - PAD + k // summed
            inside = 0 <= h + dh - PAD < height and 0 <= ww < width
            first = ((row + dh - PAD) * width + w0 - PAD) * summed
            window[e] = load(small[uint64(first + k)]) if inside else float32(0)

    return stage


def _make_wide_sums(size, summed, segment, columns):
    """Device function: acc[p] = sum over (dh, c, dw) of window[dh, s0 + p + dw, c] * weights[(dh KS
    + dw) C + c] for the segment's pixels p (window [dh, column, c] flat): per (dh, c), SPAN window
    values (broadcasts: every thread of the warp reads the same word) feed KS * segment FMAs. The
    loops unroll (indices into acc, v and weights become constants), so all three stay in
    registers."""
    SPAN = segment + size - 1

    @kernel_cache.device
    def sums(window, weights, acc, s0):
        v = cuda.local.array(SPAN, float32)
        for p in range(segment):
            acc[p] = float32(0)
        for dh in range(size):
            for c in range(summed):
                first = (dh * columns + s0) * summed + c
                for j in range(SPAN):
                    v[j] = window[uint64(first + j * summed)]
                for dw in range(size):
                    weight = weights[(dh * size + dw) * summed + c]
                    for p in range(segment):
                        acc[p] += v[p + dw] * weight

    return sums


def _make_wide_body(load, size, summed, stretch, segment):
    """(shared window elements, stage, sums) of a wide kernel: a block covers `stretch` pixels of a
    row, summed `segment` at a time (the window rounded up to whole segments)."""
    columns = math.ceil(stretch / segment) * segment + size - 1
    return (size * columns * summed, _make_wide_stage(load, size, summed, columns),
            _make_wide_sums(size, summed, segment, columns))


def _wide_blocks(size, summed):
    """Blocks of WIDE_THREADS an SM holds: 3 (80 registers a thread) when the thread's weights leave
    ptxas room for a segment's sums, values and act'(h) without spilling, else 2."""
    return 3 if size * size * summed <= 27 else 2


@functools.cache
def _make_wide_forward(dtype, size, summed, stretch, segment):
    load, store = codec(dtype)
    TAPS = size * size * summed
    WINDOW, stage, sums = _make_wide_body(load, size, summed, stretch, segment)

    # Block (bx, by) owns pixels (row, w0:w0 + stretch) of output channels by * blockDim:+blockDim,
    # thread t one channel cout of them: a warp's 32 threads write 32 adjacent channels of a pixel
    # (coalesced). One writer per output: no atomics, and each sum runs in the fixed order of `sums`.
    @kernel_cache.jit(**kernel_cache.launch_bounds(WIDE_THREADS, _wide_blocks(size, summed)))
    def wide_forward_kernel(x, w, b, y, height, width, channels, activation):
        # x (N*H*W*Cin,), w (KS*KS*Cin*Cout,), b (Cout,), y (N*H*W*Cout,); channels = Cout
        after_previous_grid()
        per_row = (width + stretch - 1) // stretch
        row = cuda.blockIdx.x // per_row
        w0 = (cuda.blockIdx.x - row * per_row) * stretch
        cout = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        window = cuda.shared.array(WINDOW, float32)
        stage(x, window, row, row % height, w0, height, width)
        cuda.syncthreads()
        if cout >= channels:
            return
        weights = cuda.local.array(TAPS, float32)
        for k in range(TAPS):  # k = (dh KS + dw) Cin + cin
            weights[k] = load(w[uint64(k * channels + cout)])
        bias = load(b[cout])
        acc = cuda.local.array(segment, float32)
        count = min(stretch, width - w0)
        first = row * width + w0  # the stretch's first pixel
        for s0 in range(0, count, segment):
            sums(window, weights, acc, s0)
            for p in range(segment):
                if s0 + p < count:
                    z = acc[p] + bias
                    if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                        z = float32(0)
                    elif activation == TANH or activation == SIGMOID:
                        z = tiles.squash(z, activation)
                    y[uint64((first + s0 + p) * channels + cout)] = store(z)

    return wide_forward_kernel


@functools.cache
def _make_wide_backward_input(dtype, size, summed, stretch, segment):
    load, store = codec(dtype)
    TAPS, LAST_TAP = size * size * summed, size * size - 1
    WINDOW, stage, sums = _make_wide_body(load, size, summed, stretch, segment)

    # As the forward, with dy for x and the flipped kernel w'[dh, dw, cout, cin] = w[KS-1-dh,
    # KS-1-dw, cin, cout] for w: thread t owns input channel cin, a gather of every (tap, cout)
    # contribution to dx[pixel, cin], so again one writer per output and no atomics.
    @kernel_cache.jit(**kernel_cache.launch_bounds(WIDE_THREADS, _wide_blocks(size, summed)))
    def wide_backward_input_kernel(dy, w, h, dx, height, width, channels, activation):
        # dy (N*H*W*Cout,), w (KS*KS*Cin*Cout,), h and dx (N*H*W*Cin,); channels = Cin
        after_previous_grid()
        per_row = (width + stretch - 1) // stretch
        row = cuda.blockIdx.x // per_row
        w0 = (cuda.blockIdx.x - row * per_row) * stretch
        cin = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        window = cuda.shared.array(WINDOW, float32)
        stage(dy, window, row, row % height, w0, height, width)
        cuda.syncthreads()
        if cin >= channels:
            return
        weights = cuda.local.array(TAPS, float32)
        for k in range(TAPS):  # k = (dh KS + dw) Cout + cout, read from the mirrored tap
            weights[k] = load(w[uint64(((LAST_TAP - k // summed) * channels + cin) * summed + k % summed)])
        acc, grad = cuda.local.array(segment, float32), cuda.local.array(segment, float32)
        count = min(stretch, width - w0)
        first = row * width + w0  # the stretch's first pixel
        for s0 in range(0, count, segment):
            if activation != NONE:  # act'(h) loaded before the sums, whose FMAs hide the latency
                for p in range(segment):
                    q = first + min(s0 + p, count - 1)  # past the stretch: a pixel in it, not used
                    grad[p] = tiles.activation_grad_of(load(h[uint64(q * channels + cin)]), activation)
            sums(window, weights, acc, s0)
            for p in range(segment):
                if s0 + p < count:
                    d = load(store(acc[p]))  # rounded before the product, as gemm's activation_grad
                    if activation != NONE:
                        d *= grad[p]
                    dx[uint64((first + s0 + p) * channels + cin)] = store(d)

    return wide_backward_input_kernel


def wide_plan(width, channels):
    """(pixels a block covers, pixels a thread sums at once, threads a block, channel groups): each
    image row cut into even stretches of at most WIDE_STRETCH pixels, those into even segments of
    at most WIDE_SEGMENT; a thread a wide channel, blocks of whole warps."""
    stretch = even_segment(width, WIDE_STRETCH)
    segment = even_segment(stretch, WIDE_SEGMENT)
    threads = min(WIDE_THREADS, math.ceil(channels / LANES) * LANES)
    return stretch, segment, threads, math.ceil(channels / threads)


def _wide_launch(make, small, w, other, out, activation):
    """Launch a wide kernel: `small` the narrow image (N, H, W, C_small), `out` the wide one."""
    N, H, W, summed = small.shape
    channels = out.shape[3]
    stretch, segment, threads, groups = wide_plan(W, channels)
    kernel = make(small.dtype, w.shape[0], summed, stretch, segment)
    kernel[(N * H * math.ceil(W / stretch), groups), threads, streams.current()](
        small.reshape(small.size), w.reshape(w.size), other, out.reshape(out.size), H, W, channels, activation)


def wide_forward(x, w, b, y, activation):
    """y = act(conv(x, w) + b) for x (N, H, W, Cin), w (KS, KS, Cin, Cout), b (Cout,), y (N, H, W,
    Cout) with wide_fits(KS, Cin); a thread per output channel and row stretch."""
    _wide_launch(_make_wide_forward, x, w, b, y, activation)


def wide_backward_input(dy, w, h, dx, activation):
    """dx = conv_transpose(dy, w) * act'(h) for dy (N, H, W, Cout), w (KS, KS, Cin, Cout), h and dx
    (N, H, W, Cin) with wide_fits(KS, Cout); a thread per input channel and row stretch. With
    activation NONE, h is not read."""
    _wide_launch(_make_wide_backward_input, dy, w, h.reshape(h.size), dx, activation)
