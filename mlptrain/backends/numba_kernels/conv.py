"""2-D convolutions as implicit GEMMs with fused epilogues (CUDA backend).

Layout NHWC: x (N, H, W, Cin), y (N, H, W, Cout), w (KS, KS, Cin, Cout) with
KS odd, b (Cout,); stride 1 and zero 'same' padding P = KS // 2, so y has x's
spatial size. Every pixel is a row and w reshaped (KS*KS*Cin, Cout) is a dense
layer's weight, so each pass is one of gemm's tile products with one operand
read through im2col addressing: the tile loader turns a (pixel, column) index
into an image element, or a zero of the padding, as it fetches it. No column
buffer is ever written.

    forward          y  = act(im2col(x) @ w + b)            rows: pixels          summed: (tap, cin)
    backward input   dx = (im2col(dy) @ w') * act'(h)        rows: pixels          summed: (tap, cout)
    backward weight  dw = beta * dw + im2col(x).T @ dy      rows: (tap, cin)      summed: pixels

With stride 1 the transposed convolution is a convolution of dy with the
kernel flipped in space and Cin/Cout swapped: w'[(tap, cout), cin] =
w[KS-1-dh, KS-1-dw, cin, cout], so the thread that owns dx[pixel, cin] sums
every contribution to it. The weight gradient sums over N*H*W pixels into a
small output, so one pass would leave most SMs idle: pass 1 gives each block
a chunk of the pixels and writes its partial tile to a float32 workspace,
pass 2 adds the chunks in chunk order. No atomics anywhere; every sum runs
in a fixed order, so results are bitwise reproducible.

The im2col operands live in im2col.py. In bf16 / fp16 the three passes run
on tensor cores (conv_mma) where the summed channels pair up, in float32 at
float32 accuracy (conv_tf32, 3xTF32) where the channels are multiples of 4 on
compute capability 8.0 and later; 16-bit layers with fewer than eight
channels on one side run there too, that side padded with zeros into a
scratch buffer first (conv_padded); other layers with at most four channels
on one side skip the GEMMs: conv_narrow computes outputs that narrow
directly, conv_wide sums inputs that narrow.
"""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32
from mlptrain.backends.numba_kernels import (chunks, conv_mma, conv_narrow, conv_padded, conv_tf32, conv_wide, current,
                                             streams, tiles)
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.conv_plan import PASSES, TILES, plan, tiled_weight_chunks
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.im2col import flipped_kernel_operand, image_columns_operand, image_rows_operand
from mlptrain.backends.numba_kernels.tiles import dense_operand

# Backward weight: pixels are cut into chunks summed by separate blocks (chunks.chunk_plan), a fixed
# plan not read off the GPU, so the summation order and hence the result are the same on every device.
MAX_PIXELS = 2**31 - 1  # the multiply-and-shift division holds below 2**31
MAX_SIDE = 2**16 - 1  # a pixel's code holds h and w in 16 bits each


# --- forward: y = act(conv(x, w) + b) --------------------------------------------

@functools.cache
def _make_conv2d_forward(tile, dtype, size, **jit_options):
    BM, BN, TM, TN, _, _ = tiles.tile_coords(tile)
    load, store = codec(dtype)
    tile_product = tiles.make_tile_product(tile, image_rows_operand(load, size), dense_operand(load, False))
    bias_activation, _ = tiles.make_epilogues(tiles.tile_layout(tile), load, store)

    # Block (by, bx) owns pixels by*BM:+BM and output channels bx*BN:+BN of
    # y: its K-split groups sum their shares of the taps x channels, group 0
    # adds them in order and each of its threads writes its own TM x TN
    # outputs with bias and activation. No atomics.
    @kernel_cache.jit(**_launch_options(tile, jit_options))
    def conv2d_forward_kernel(x, w, b, y, activation):
        after_previous_grid()
        pixels, outputs = y.shape  # y viewed (N*H*W, Cout), w (KS*KS*Cin, Cout)
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(x, w, acc, m0, n0, pixels, outputs, 0, w.shape[0]):
            bias_activation(acc, b, y, m0, n0, pixels, outputs, activation)

    return conv2d_forward_kernel


def conv2d_forward(x, w, b, y, activation, scratch=None):
    """y = act(conv(x, w) + b), stride 1, zero 'same' padding; x (N, H, W, Cin),
    w (KS, KS, Cin, Cout) with KS odd, b (Cout,), y (N, H, W, Cout), all four
    in one storage format. scratch: an optional 1-D buffer in that format, of
    conv2d_scratch(x.shape, w.shape, x.dtype) elements: given, a layer of fewer
    than eight channels on one side pads that side into it first (conv_padded)."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None, None, None))
    N, H, W, Cin = _image_shape("x", x)
    size = _kernel_size(w, x.dtype, Cin)
    Cout = w.shape[3]
    require("b", b, x.dtype, (Cout,))
    require("y", y, x.dtype, (N, H, W, Cout))
    tiles.check_activation(activation)
    pixels = N * H * W
    if scratch is not None:
        require("scratch", scratch, x.dtype, (None,))
    if pixels == 0 or Cout == 0:
        return
    chosen = plan("forward", x.shape, w.shape, x.dtype, current.kernel_capability(),
                  scratch=0 if scratch is None else scratch.shape[0])
    if chosen.padded:
        _padded_forward(x, w, b, y, activation, scratch, chosen.padded)
    elif chosen.variant == "narrow":
        conv_narrow.narrow_forward(x, w, b, y, activation)
    elif chosen.variant == "wide":
        conv_wide.wide_forward(x, w, b, y, activation)
    elif chosen.variant == "tensor_cores":
        conv_mma.forward(x, w, b, y, activation)
    elif chosen.variant == "tf32x3":
        conv_tf32.forward(x, w, b, y, activation)
    else:
        tile = TILES[chosen.tile][0]
        grid, threads = tiles.launch_grid(pixels, Cout, tile)
        _make_conv2d_forward(tile, x.dtype, size)[grid, threads, streams.current()](
            x, w.reshape(size * size * Cin, Cout), b, y.reshape(pixels, Cout), activation)


# --- backward input: dx = conv(dy, flipped w) * act'(h) ----------------------------

@functools.cache
def _make_conv2d_backward_input(tile, dtype, size, dense=False, **jit_options):
    """dense: w comes rearranged by flip_kernel as a (KS*KS*Cout, Cin) matrix, read like the forward
    reads its w; else as (KS*KS, Cin, Cout), flipped as it is fetched."""
    BM, BN, TM, TN, _, _ = tiles.tile_coords(tile)
    load, store = codec(dtype)
    kernel = dense_operand(load, False) if dense else flipped_kernel_operand(load, size)
    tile_product = tiles.make_tile_product(tile, image_rows_operand(load, size), kernel)
    _, activation_grad = tiles.make_epilogues(tiles.tile_layout(tile), load, store)

    # Block (by, bx) owns pixels by*BM:+BM and input channels bx*BN:+BN of
    # dx: as a gather over the flipped kernel, each dx[pixel, cin] collects
    # every (tap, cout) contribution itself, so no two threads write one
    # element and no atomics are needed.
    @kernel_cache.jit(**_launch_options(tile, jit_options))
    def conv2d_backward_input_kernel(dy, w, h, dx, activation, K):
        after_previous_grid()
        pixels, inputs = dx.shape  # dx, h viewed (N*H*W, Cin); K = KS*KS*Cout summed values
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(dy, w, acc, m0, n0, pixels, inputs, 0, K):
            activation_grad(acc, h, dx, m0, n0, pixels, inputs, activation)

    return conv2d_backward_input_kernel


# Thread t copies elements t, t + stride, ... of the flipped kernel: one writer per element.
@kernel_cache.jit
def flip_kernel_kernel(w, flipped):
    after_previous_grid()
    taps, inputs, outputs = w.shape
    for e in range(cuda.grid(1), taps * inputs * outputs, cuda.gridsize(1)):
        row, cin = e // inputs, e % inputs
        tap, cout = row // outputs, row % outputs
        flipped[row, cin] = w[taps - 1 - tap, cin, cout]


def flip_kernel(w, flipped):
    """flipped[(tap, cout), cin] = w[KS-1-dh, KS-1-dw, cin, cout] for tap = (dh, dw): the kernel of
    the transposed convolution as a dense (KS*KS*Cout, Cin) matrix; w (KS, KS, Cin, Cout), flipped
    (KS*KS*Cout, Cin) in w's format."""
    size, _, Cin, Cout = w.shape
    require("flipped", flipped, w.dtype, (size * size * Cout, Cin))
    elements = w.size
    if elements:
        blocks = chunks.sum_blocks(elements)
        flip_kernel_kernel[blocks, chunks.SUM_THREADS, streams.current()](w.reshape(size * size, Cin, Cout), flipped)


def conv2d_backward_input(dy, w, h, dx, activation, flipped=None):
    """dx = conv_transpose(dy, w) * act'(h), where h = act(z) is this layer's
    input (the previous layer's output). dy (N, H, W, Cout), w (KS, KS, Cin,
    Cout), h and dx (N, H, W, Cin), all in one storage format. With activation
    NONE, h is not read (pass dx or any array of its shape and format).

    flipped: an optional 1-D buffer of at least KS*KS*Cin*Cout elements in that format. Given, w is
    first rearranged into it (flip_kernel) and the product reads it as a dense matrix instead of
    flipping each element it fetches: on an H100, 2.06-2.09 ms -> 1.80-1.83 for the 256 <-> 128
    layers at batch 256 x 16 x 16. Of conv2d_scratch(dx.shape, w.shape, dy.dtype) elements, a 16-bit
    dy of fewer than eight channels is padded into it too (conv_padded). Where conv_wide takes the
    pass (Cout <= its WIDE_IN), the buffer is checked but not used."""
    require_one_of("dy", dy, STORAGE_DTYPES, (None, None, None, None))
    N, H, W, Cout = _image_shape("dy", dy)
    require("w", w, dy.dtype, (None, None, None, Cout))
    Cin = w.shape[2]
    size = _kernel_size(w, dy.dtype, Cin)
    require("h", h, dy.dtype, (N, H, W, Cin))
    require("dx", dx, dy.dtype, (N, H, W, Cin))
    tiles.check_activation(activation)
    K = size * size * Cout
    if flipped is not None:
        require("flipped", flipped, dy.dtype, (None,))
        if flipped.shape[0] < K * Cin:
            raise ValueError(f"flipped has {flipped.shape[0]} elements, needs {K * Cin} (KS * KS * Cin * Cout)")
    pixels = N * H * W
    if pixels == 0 or Cin == 0:
        return
    chosen = plan("backward_input", dy.shape[:3] + (Cin,), w.shape, dy.dtype, current.kernel_capability(),
                  flipped is not None, 0 if flipped is None else flipped.shape[0])
    if chosen.padded:
        _padded_backward_input(dy, w, h, dx, activation, flipped)
        return
    if chosen.variant == "wide":
        conv_wide.wide_backward_input(dy, w, h, dx, activation)
        return
    if flipped is not None:
        kernel = flipped[:K * Cin].reshape(K, Cin)
        flip_kernel(w, kernel)
    else:
        kernel = w.reshape(size * size, Cin, Cout)
    if chosen.variant in ("tensor_cores", "tf32x3"):
        (conv_mma if chosen.variant == "tensor_cores" else conv_tf32).backward_input(dy, kernel, h, dx, activation)
        return
    tile = TILES[chosen.tile][0]
    grid, threads = tiles.launch_grid(pixels, Cin, tile)
    _make_conv2d_backward_input(tile, dy.dtype, size, flipped is not None)[grid, threads, streams.current()](
        dy, kernel, h.reshape(pixels, Cin), dx.reshape(pixels, Cin), activation, K)


# --- backward weight: dw = beta * dw + im2col(x).T @ dy, in two passes -------------

@functools.cache
def _make_conv2d_weight_partials(tile, dtype, size, **jit_options):
    load, _ = codec(dtype)
    product = tiles.make_tile_product(tile, image_columns_operand(load, size), dense_operand(load, False))
    return chunks.make_weight_partials(product, tiles.tile_layout(tile), tile[:2], **_launch_options(tile, jit_options))


def conv2d_variants(x_shape, w_shape, dtype, flipped=True):
    """The variant each pass of this convolution runs on this GPU (conv_plan's labels: narrow, wide,
    tensor_cores, tensor_cores/cin_padded or cout_padded, tiled/<tile>), for the run's record, with
    buffers of conv2d_scratch's size."""
    return {p: plan(p, x_shape, w_shape, dtype, current.kernel_capability(), flipped).label() for p in PASSES}


def conv2d_scratch(x_shape, w_shape, dtype):
    """Elements in `dtype` storage of the scratch buffer conv2d_forward and conv2d_backward_input (as
    `flipped`) take for x (N, H, W, Cin), w (KS, KS, Cin, Cout) on this GPU: the flipped kernel's,
    or more where a side is padded; never smaller for a smaller batch."""
    capability = current.kernel_capability()
    return max(math.prod(w_shape), *(plan(p, x_shape, w_shape, dtype, capability).scratch for p in PASSES))


def conv2d_backward_weight_workspace(x_shape, w_shape, dtype):
    """float32 elements of workspace conv2d_backward_weight needs for x (N, H, W, Cin), w (KS, KS,
    Cin, Cout) in `dtype` storage on this GPU (conv_plan.plan's); never smaller for a smaller batch,
    so one workspace sized for the largest batch serves all."""
    return plan("backward_weight", x_shape, w_shape, dtype, current.kernel_capability()).workspace


def conv2d_backward_weight(x, dy, dw, beta, workspace):
    """dw = beta * dw + sum over pixels of im2col(x).T @ dy (beta 0 overwrites,
    1 accumulates). x (N, H, W, Cin) and dy (N, H, W, Cout) in one storage
    format; dw (KS, KS, Cin, Cout) and workspace (1-D, at least
    `conv2d_backward_weight_workspace(x.shape, dw.shape)` elements) float32."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None, None, None))
    N, H, W, Cin = _image_shape("x", x)
    require("dy", dy, x.dtype, (N, H, W, None))
    Cout = dy.shape[3]
    size = _kernel_size(dw, "float32", Cin, name="dw")
    require("dw", dw, "float32", (size, size, Cin, Cout))
    require("workspace", workspace, "float32", (None,))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    chosen = plan("backward_weight", x.shape, dw.shape, x.dtype, current.kernel_capability())
    if workspace.shape[0] < chosen.workspace:
        raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chosen.workspace} "
                         "(conv2d_backward_weight_workspace(x.shape, dw.shape, x.dtype))")
    pixels, rows = N * H * W, size * size * Cin
    if pixels == 0 or rows * Cout == 0:
        return
    if chosen.padded:
        _padded_backward_weight(x, dy, dw, beta, workspace)
        return
    if chosen.variant == "narrow":
        partials = conv_narrow.narrow_weight_partials(x, dy, size, workspace)
    elif chosen.variant == "tensor_cores":
        partials = conv_mma.weight_partials(x, dy, size, workspace)
    elif chosen.variant == "tf32x3":
        partials = conv_tf32.weight_partials(x, dy, size, workspace)
    else:
        _, chunk, count, _ = tiled_weight_chunks(x.shape, dw.shape)
        tile = TILES[chosen.tile][0]
        (gx, gy), threads = tiles.launch_grid(rows, Cout, tile)
        partials = workspace[:count * rows * Cout].reshape(count, rows, Cout)
        _make_conv2d_weight_partials(tile, x.dtype, size)[(gx, gy, count), threads, streams.current()](
            x, dy.reshape(pixels, Cout), partials, chunk)
        partials = partials.reshape(count, rows * Cout)
    chunks.add_chunks(partials, dw.reshape(rows * Cout), beta)


# --- a side of fewer than conv_padded.PIECE channels, padded first ----------------------

def _padded_forward(x, w, b, y, activation, scratch, side):
    """conv2d_forward on conv_mma, Cin ("cin": with the kernel's rows) or the kernel's Cout ("cout": a narrow
    tile) padded into `scratch`."""
    N, H, W, Cin = x.shape
    size, _, _, Cout = w.shape
    pixels, taps, piece = N * H * W, size * size, conv_padded.PIECE
    if side == "cin":
        image, kernel = conv_padded.pieces(scratch, pixels * piece, taps * piece * Cout)
        conv_padded.pad(x.reshape(pixels, Cin, 1), image.reshape(pixels, piece, 1))
        conv_padded.pad(w.reshape(taps, Cin, Cout), kernel.reshape(taps, piece, Cout))
        conv_mma.forward(image.reshape(N, H, W, piece), kernel.reshape(size, size, piece, Cout), b, y, activation)
        return
    kernel, = conv_padded.pieces(scratch, taps * Cin * piece)
    conv_padded.pad(w.reshape(taps * Cin, Cout, 1), kernel.reshape(taps * Cin, piece, 1))
    conv_mma.pixel_rows(x, kernel.reshape(taps * Cin, piece), size, b, y.reshape(pixels, Cout), activation, False,
                        conv_mma.NARROW_RING_TILE, conv_mma.NARROW_RING_STAGES)


def _padded_backward_input(dy, w, h, dx, activation, scratch):
    """conv2d_backward_input on conv_mma, dy's Cout padded into `scratch` with the kernel's, then flipped."""
    N, H, W, Cout = dy.shape
    size, _, Cin, _ = w.shape
    pixels, taps, piece = N * H * W, size * size, conv_padded.PIECE
    image, kernel, flipped = conv_padded.pieces(scratch, pixels * piece, taps * Cin * piece, taps * piece * Cin)
    conv_padded.pad(dy.reshape(pixels, Cout, 1), image.reshape(pixels, piece, 1))
    conv_padded.pad(w.reshape(taps * Cin, Cout, 1), kernel.reshape(taps * Cin, piece, 1))
    flip_kernel(kernel.reshape(size, size, Cin, piece), flipped.reshape(taps * piece, Cin))
    conv_mma.backward_input(image.reshape(N, H, W, piece), flipped.reshape(taps * piece, Cin), h, dx, activation)


def _padded_backward_weight(x, dy, dw, beta, workspace):
    """conv2d_backward_weight on conv_mma, x's Cin padded into the workspace after the chunks' partials."""
    N, H, W, Cin = x.shape
    size, _, _, Cout = dw.shape
    pixels, taps, piece = N * H * W, size * size, conv_padded.PIECE
    most = conv_mma.weight_plan((N, H, W, piece), (size, size, piece, Cout))[2]
    image_floats = math.ceil(pixels * piece * x.dtype.itemsize / 4)
    _, image = conv_padded.pieces(workspace, most * taps * piece * Cout, image_floats)
    image = image.view(x.dtype)[:pixels * piece]
    conv_padded.pad(x.reshape(pixels, Cin, 1), image.reshape(pixels, piece, 1))
    partials = conv_mma.weight_partials(image.reshape(N, H, W, piece), dy, size, workspace)
    conv_padded.add_chunks(partials, dw, beta)


# --- launch helpers ---------------------------------------------------------------

def _launch_options(tile, jit_options):
    """cuda.jit options for a tile's kernel: launch bounds of its block size,
    so that ptxas keeps a 512-thread block within an SM's 65536 registers
    (128 a thread; the im2col addressing would otherwise take 131 and the
    launch would fail). The simulator takes no such option."""
    if config.ENABLE_CUDASIM:
        return jit_options
    BM, BN, _, TM, TN, KSPLIT = tile
    return {"launch_bounds": ((BM // TM) * (BN // TN) * KSPLIT,), **jit_options}


def _image_shape(name, array):
    N, H, W, C = array.shape
    if H < 1 or W < 1 or C < 1:
        raise ValueError(f"{name} has shape {tuple(array.shape)}: height, width and channels must be at least 1")
    if H > MAX_SIDE or W > MAX_SIDE:
        raise ValueError(f"{name} has shape {tuple(array.shape)}: height and width must be at most {MAX_SIDE}")
    if N * H * W > MAX_PIXELS:
        raise ValueError(f"{name} has {N * H * W} pixels, more than {MAX_PIXELS}: split the batch")
    return N, H, W, C


def _kernel_size(w, dtype, inputs, name="w"):
    """KS of a (KS, KS, inputs, *) kernel, after checking it is square and odd."""
    require(name, w, dtype, (None, None, inputs, None))
    size = w.shape[0]
    if w.shape[1] != size or size % 2 == 0:
        raise ValueError(f"{name} has shape {tuple(w.shape)}: "
                         "the kernel must be square with an odd size (1, 3, 5, ...)")
    return size
