"""Direct convolutions to a few output channels (CUDA backend).

conv.py's implicit GEMMs tile the output by channels; at Cout = 3 (an
autoencoder's RGB output) even the narrowest tile pads most of its columns
and spends its time on im2col addressing: on an H100 the 256 -> 3 channel
layer at 256 x 32 x 32 took 4.6 ms forward and 5.5 ms for its weight
gradient, 0.7-0.8 TFLOP/s. These kernels read the image directly instead,
along its contiguous channel axis, each thread keeping every output channel
of its pixels in registers. Same layouts, storage formats and semantics as
conv.py (stride 1, zero 'same' padding P = KS // 2, float32 sums, outputs
rounded once), which dispatches here when `fits(KS, Cout)`.

    forward          y  = act(conv(x, w) + b)     warp: 32 channel slices of a row segment, then a
                                                  butterfly across lanes
    backward weight  dw = beta * dw + sum(x dy)   thread: one input channel over a chunk of rows;
                                                  chunks added in order by chunks.add_chunks

No atomics; every sum runs in a fixed order (lanes, rows and chunks fixed by
the shapes alone), so results are bitwise reproducible. The launchers are the
second half of conv's, which have checked every argument.
"""

import functools
import math

from mlptrain.activation import RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32, uint64
from mlptrain.backends.numba_kernels import chunks, streams, tiles
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

NARROW_OUT = 4  # outputs of at most this many channels take these kernels...
MAX_TAP_OUTPUTS = 36  # ...when KS * KS * Cout weight-gradient sums fit a thread's registers
LANES = 32
WARPS = 8  # forward: row segments (warps) per block
STAGE_FLOATS = 8192  # forward: weights staged in shared memory at a time (32 KB)
WEIGHT_THREADS = 256  # weight gradient: input channels per block
WEIGHT_SEGMENT = 8  # weight gradient: pixels of a row segment at most...
WEIGHT_VALUES = 24  # ...and dy values a thread holds for one


def fits(size, outputs):
    """Whether a size x size convolution to `outputs` channels takes the narrow kernels."""
    return outputs <= NARROW_OUT and size * size * outputs <= MAX_TAP_OUTPUTS


def even_segment(width, most):
    """Pixels per row segment: the row cut into the fewest segments of at most `most` pixels, as
    even as they come (32 = 4 x 8, not 3 x 10 + 2)."""
    return math.ceil(width / math.ceil(width / most))


# --- the butterfly: 32 lanes' sums of 32 values, lane l ends with value l's total --------------

def _make_exchange(COUNT):
    """Device function: values[:COUNT] = lane (lane ^ mask)'s values[:COUNT]."""
    if config.ENABLE_CUDASIM:  # the simulator has no shuffles: the same exchange through shared memory
        @cuda.jit(device=True)
        def exchange(values, mask):
            lanes = cuda.shared.array((1024, 16), float32)
            t = cuda.threadIdx.x
            for j in range(COUNT):
                lanes[t, j] = values[j]
            cuda.syncthreads()  # every thread of the block reaches each exchange (see the forward kernel)
            for j in range(COUNT):
                values[j] = lanes[t ^ mask, j]
            cuda.syncthreads()
    else:
        @kernel_cache.device
        def exchange(values, mask):
            for j in range(COUNT):
                values[j] = cuda.shfl_xor_sync(0xFFFFFFFF, values[j], mask)

    return exchange


def _make_halving(HALF):
    """Device function: one step of the reduce-scatter over lanes l and l ^ HALF, which hold the
    same 2 HALF values in acc[:2 HALF]: the lane without bit HALF keeps the first half, its partner
    the second, each adding the other's copy to its own; acc[:HALF] then holds the pair's sums of
    the kept half. Indices stay constants (a select picks the half), so acc stays in registers."""
    exchange = _make_exchange(HALF)

    @kernel_cache.device
    def halve(acc, lane):
        upper = (lane & HALF) != 0
        sent = cuda.local.array(HALF, float32)
        for j in range(HALF):
            low, high = acc[j], acc[j + HALF]
            acc[j] = high if upper else low
            sent[j] = low if upper else high
        exchange(sent, HALF)
        for j in range(HALF):
            acc[j] += sent[j]

    return halve


_halve16, _halve8, _halve4, _halve2, _halve1 = (_make_halving(half) for half in (16, 8, 4, 2, 1))


@kernel_cache.device
def _reduce_scatter(acc, lane):
    """acc[0] = value `lane` of acc (32 values) summed over the warp's 32 lanes, in a fixed tree:
    31 shuffles where a butterfly of every value would take 160."""
    _halve16(acc, lane)
    _halve8(acc, lane)
    _halve4(acc, lane)
    _halve2(acc, lane)
    _halve1(acc, lane)


# --- forward: y = act(conv(x, w) + b) ----------------------------------------------------------

def _make_row_product(load, size, outputs, segment, channels, block):
    """Device function: acc[p * Cout + o] += sum over dw of x[row, w0 + p + dw - P, c] *
    w[dh, dw, c, o] over the segment's pixels p, for one image row and channel c (x flat, `first`
    the index of x[row, w0 - P, c]; w[dh, 0, c, 0] at `staged` in the shared stage, o-major so a
    warp's channels read 32 banks): SPAN loads of x feed KS * SPAN * Cout FMAs. Cin is a constant,
    so the loads' offsets from `first` are too (one address a row, not one a load)."""
    PAD, SPAN = size // 2, segment + size - 1

    @kernel_cache.device
    def row_product(x, weights, acc, first, w0, width, staged):
        v = cuda.local.array(SPAN, float32)
        for j in range(SPAN):
            inside = 0 <= w0 + j - PAD < width
            v[j] = load(x[uint64(first + j * channels)]) if inside else float32(0)
        for dw in range(size):
            for o in range(outputs):
                weight = weights[staged + (dw * outputs + o) * block]
                for p in range(segment):
                    acc[p * outputs + o] += v[p + dw] * weight

    return row_product


def _make_stage(load, size, outputs, channels, block):
    """Device function: the block's threads copy w[:, :, c0:c0 + block, :] (fewer at the end) into
    shared memory as float32 [tap, o, channel], the channel contiguous."""
    TAP_OUTPUTS = size * size * outputs

    @kernel_cache.device
    def stage(w, weights, c0):
        count = min(block, channels - c0)
        for e in range(cuda.threadIdx.x, TAP_OUTPUTS * count, cuda.blockDim.x):
            k, cl = e // count, e % count  # k = tap * Cout + o
            weights[k * block + cl] = load(w[uint64(((k // outputs) * channels + c0 + cl) * outputs + k % outputs)])

    return stage


@functools.cache
def _make_narrow_forward(dtype, size, outputs, segment, channels):
    load, store = codec(dtype)
    PAD, VALUES, TAP_OUTPUTS = size // 2, segment * outputs, size * size * outputs
    # channels staged at a time: all of them if they fit STAGE_FLOATS
    BLOCK = min(max(LANES, STAGE_FLOATS // TAP_OUTPUTS // LANES * LANES), math.ceil(channels / LANES) * LANES)
    STAGE = TAP_OUTPUTS * BLOCK
    row_product = _make_row_product(load, size, outputs, segment, channels, BLOCK)
    stage = _make_stage(load, size, outputs, channels, BLOCK)
    # ptxas takes ~100 registers a thread unbounded (2 blocks an SM); the sums, one image row's loads
    # and the addressing fit 80 without spilling (3 blocks) when they are few enough
    blocks = 3 if VALUES + segment + size - 1 <= 48 else 2

    # Warp s owns row segment s, pixels (row, w0:w0 + segment), and all their outputs: lane l sums
    # channels l, l + 32, ... and the butterfly leaves lane l the total of the segment's l-th output,
    # y viewed (pixels, Cout) being contiguous along it. Every thread of the block reaches every
    # barrier and exchange (warps past the end compute zeros), as the simulator's exchange needs.
    @kernel_cache.jit(**kernel_cache.launch_bounds(WARPS * LANES, blocks))
    def narrow_forward_kernel(x, w, b, y, rows, height, width, activation):
        # x (N*H*W*Cin,), w (KS*KS*Cin*Cout,), b (Cout,), y (N*H*W*Cout,); rows = N*H
        after_previous_grid()
        lane = cuda.threadIdx.x % LANES
        per_row = (width + segment - 1) // segment
        index = cuda.blockIdx.x * (cuda.blockDim.x // LANES) + cuda.threadIdx.x // LANES
        row = index // per_row
        w0 = (index - row * per_row) * segment
        h = row % height
        weights = cuda.shared.array(STAGE, float32)
        acc = cuda.local.array(LANES, float32)
        for i in range(LANES):
            acc[i] = float32(0)
        for c0 in range(0, channels, BLOCK):
            cuda.syncthreads()  # the previous stage is used up
            stage(w, weights, c0)
            cuda.syncthreads()
            if row < rows:
                for dh in range(size):
                    if 0 <= h + dh - PAD < height:
                        first = ((row + dh - PAD) * width + w0 - PAD) * channels
                        for c in range(c0 + lane, min(c0 + BLOCK, channels), LANES):
                            row_product(x, weights, acc, first + c, w0, width, dh * size * outputs * BLOCK + c - c0)
        _reduce_scatter(acc, lane)
        if row < rows and lane < VALUES and w0 + lane // outputs < width:
            z = acc[0] + load(b[lane % outputs])
            if activation == RELU and z < float32(0):  # NaN stays NaN, as in np.maximum
                z = float32(0)
            elif activation == TANH or activation == SIGMOID:
                z = tiles.squash(z, activation)
            y[uint64((row * width + w0) * outputs + lane)] = store(z)

    return narrow_forward_kernel


def narrow_forward(x, w, b, y, activation):
    """y = act(conv(x, w) + b) for x (N, H, W, Cin), w (KS, KS, Cin, Cout), b (Cout,), y (N, H, W,
    Cout), Cout <= NARROW_OUT; one warp per row segment of up to 32 // Cout pixels."""
    N, H, W, Cin = x.shape
    size, Cout = w.shape[0], w.shape[3]
    segment = even_segment(W, LANES // Cout)
    segments = N * H * math.ceil(W / segment)
    warps = min(WARPS, segments)
    kernel = _make_narrow_forward(x.dtype, size, Cout, segment, Cin)
    kernel[math.ceil(segments / warps), warps * LANES, streams.current()](
        x.reshape(x.size), w.reshape(w.size), b, y.reshape(y.size), N * H, H, W, activation)


# --- backward weight: dw = beta * dw + sum over pixels of x dy, in two passes -------------------

def _make_tap_products(load, size, outputs, segment, channels):
    """Device function: acc[(dh KS + dw) Cout + o] += sum over the segment's pixels p of
    x[row + dh - P, w0 + p + dw - P, c] * d[p, o] for every tap (x flat, `first` the index of
    x[row - P, w0 - P, c]), rows outside the image (h + dh - P outside [0, H)) skipped: KS * SPAN
    loads of x feed KS^2 * segment * Cout FMAs. The loops unroll, so acc stays in registers."""
    PAD, SPAN = size // 2, segment + size - 1

    @kernel_cache.device
    def tap_products(x, acc, d, first, h, w0, height, width):
        v = cuda.local.array(SPAN, float32)
        for dh in range(size):
            if 0 <= h + dh - PAD < height:
                for j in range(SPAN):
                    inside = 0 <= w0 + j - PAD < width
                    v[j] = load(x[uint64(first + (dh * width + j) * channels)]) if inside else float32(0)
                for dw in range(size):
                    for o in range(outputs):
                        total = acc[(dh * size + dw) * outputs + o]
                        for p in range(segment):
                            total += v[p + dw] * d[p * outputs + o]
                        acc[(dh * size + dw) * outputs + o] = total

    return tap_products


@functools.cache
def _make_narrow_weight_partials(dtype, size, outputs, segment, channels):
    load, _ = codec(dtype)
    PAD, TAP_OUTPUTS, VALUES = size // 2, size * size * outputs, segment * outputs
    tap_products = _make_tap_products(load, size, outputs, segment, channels)

    # Thread (by, t) owns input channel c = by * blockDim + t of chunk bx's partial sum (over image
    # rows bx * chunk:+chunk): it walks those rows a segment at a time, all threads loading the same
    # dy values (a broadcast) and adjacent channels of x (coalesced), and writes its KS^2 * Cout sums
    # to partials[bx] alone. No atomics.
    @kernel_cache.jit
    def narrow_weight_partials_kernel(x, dy, partials, rows, height, width, chunk):
        # x (N*H*W*Cin,), dy (N*H*W*Cout,), partials (chunks, KS*KS*Cin*Cout); rows = N*H
        after_previous_grid()
        c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        if c >= channels:
            return
        acc = cuda.local.array(TAP_OUTPUTS, float32)
        d = cuda.local.array(VALUES, float32)
        for k in range(TAP_OUTPUTS):
            acc[k] = float32(0)
        start = cuda.blockIdx.x * chunk
        h = start % height  # then walked row by row: no division per row
        for row in range(start, min(start + chunk, rows)):
            for w0 in range(0, width, segment):
                for e in range(VALUES):
                    inside = w0 + e // outputs < width
                    d[e] = load(dy[uint64((row * width + w0) * outputs + e)]) if inside else float32(0)
                first = ((row - PAD) * width + w0 - PAD) * channels + c
                tap_products(x, acc, d, first, h, w0, height, width)
            h = h + 1 if h + 1 < height else 0
        for k in range(TAP_OUTPUTS):
            partials[cuda.blockIdx.x, uint64((k // outputs * channels + c) * outputs + k % outputs)] = acc[k]

    return narrow_weight_partials_kernel


def _weight_threads(channels):
    """(threads a block, channel groups): a thread per input channel, blocks of whole warps."""
    threads = min(WEIGHT_THREADS, math.ceil(channels / LANES) * LANES)
    return threads, math.ceil(channels / threads)


def weight_plan(x_shape, w_shape):
    """(rows a chunk, chunks, most chunks) of the weight gradient: image rows (n, h) cut into at
    most enough chunks for about chunks.CHUNK_BLOCKS blocks, each of at least chunks.MIN_CHUNK pixels;
    a plan of the shapes alone, so the summation order is the same on every device. `most chunks`
    grows with the batch; an even split may leave fewer in use."""
    N, H, W, Cin = x_shape
    rows, (_, groups) = N * H, _weight_threads(Cin)
    most = max(1, min(math.ceil(chunks.CHUNK_BLOCKS / groups), rows // math.ceil(chunks.MIN_CHUNK / W)))
    chunk = max(1, math.ceil(rows / most))
    return chunk, max(1, math.ceil(rows / chunk)), most


def weight_workspace(x_shape, w_shape):
    """float32 elements of workspace narrow_weight_partials needs (see weight_plan); never smaller
    for a smaller batch."""
    return weight_plan(x_shape, w_shape)[2] * math.prod(w_shape)


def narrow_weight_partials(x, dy, size, workspace):
    """Pass 1 of dw = beta * dw + sum over pixels of x dy for x (N, H, W, Cin), dy (N, H, W, Cout),
    a size x size kernel and a float32 workspace of at least weight_workspace(...) elements:
    returns the (chunks, KS*KS*Cin*Cout) view of the workspace holding each chunk's sum, for
    chunks.add_chunks to add in chunk order."""
    N, H, W, Cin = x.shape
    Cout = dy.shape[3]
    chunk, chunks, _ = weight_plan(x.shape, (size, size, Cin, Cout))
    threads, groups = _weight_threads(Cin)
    elements = size * size * Cin * Cout
    partials = workspace[:chunks * elements].reshape(chunks, elements)
    segment = even_segment(W, min(WEIGHT_SEGMENT, WEIGHT_VALUES // Cout))
    kernel = _make_narrow_weight_partials(x.dtype, size, Cout, segment, Cin)
    kernel[(chunks, groups), threads, streams.current()](
        x.reshape(x.size), dy.reshape(dy.size), partials, N * H, H, W, chunk)
    return partials
