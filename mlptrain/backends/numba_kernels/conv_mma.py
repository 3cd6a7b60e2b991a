"""The convolutions' implicit GEMMs on tensor cores, for bf16 / fp16 storage (CUDA backend).

conv.py's three passes with gemm_mma's tile product in place of gemm's: the
same im2col operands read as raw 16-bit bits, summed in float32 by mma
instructions, and the same epilogues and two-pass weight gradient. conv.py
dispatches here for 16-bit storage when `fits`: the pixel-row passes read
their im2col side in channel pairs (one uint32 load each), so the channels
summed must be even; the weight gradient sums pixels and takes any shape.

    forward          y  = act(im2col(x) @ w + b)        A: x viewed (N, H, W, Cin / 2) uint32    B: w (K, Cout)
    backward input   dx = (im2col(dy) @ w') * act'(h)    A: dy viewed as uint32 pairs             B: flipped w (K, Cin)
    backward weight  partials = im2col(x).T @ dy         A: x (16-bit)                             B: dy (pixels, Cout)

Where an image's channels are whole 16-byte pieces (a multiple of 8) and
the other operand's rows are too, a pass copies its slices by cp.async into a
ring (gemm_async, im2col_async) instead: the same mma sequence over the same
values, so the same bits, without an element-by-element decode and load.

No atomics: each output is summed by one warp in a fixed order, and the
weight gradient's chunks are added in chunk order, so results are bitwise
reproducible. The launchers are the second half of conv's, which have checked
every argument.
"""

import functools
import math

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32
from mlptrain.backends.numba_kernels import chunks, gemm_mma, im2col_async, streams, tiles
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.gemm_mma import bits, bits_zero
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.im2col import image_columns_operand, image_rows_operand
from mlptrain.backends.numba_kernels.tiles import dense_operand

KINDS = {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "fp16"}
TILE = (128, 128, 2, 4)  # 8 warps of 64 x 32 outputs
# The cp.async passes: the pixel-row passes' tile, and the ring's slices (0: every pass through registers). Two
# slices of a 128 x 128 tile's operands take 37,888 bytes of shared memory, under the 48 KiB a block's static arrays
# may hold. `early`: a slice's copies issued before the products of the one ahead (gemm_async). `benchmarks/conv.py
# --stagings`, bf16, batch 256, H200, ms of the 16 x 16 256 -> 128 forward / input gradient / weight gradient: the
# register staging 0.836 / 1.059 / 1.577; this ring 0.328 / 0.418 / 0.544 (TILE's 2 x 4 warps 0.334 / 0.427, not
# early 0.334 / 0.449 / 0.597; three slices of 128 x 64 or 64 x 128 tiles 0.456-0.516). benchmarks/NOTES.md, issue 32.
RING_TILE = (128, 128, 4, 2)
RING_STAGES = 2
RING_EARLY = True
# ... its fragments read from the ring by ldmatrix, four registers an instruction (gemm_mma), the same bits: the same
# passes 0.188 / 0.297 / 0.339 ms against the shared loads' 0.331 / 0.421 / 0.552 (benchmarks/NOTES.md, issue 32 1b)
RING_LDMATRIX = True
# The ring's tile for outputs of at most 8 channels (a kernel's Cout padded to 8 by conv_padded, the decoder's RGB):
# 16 columns, the fewest whose two fragments a warp ldmatrix loads at once; 64 threads, so that B's 32 x 16 slice
# is one piece a thread; a ring of four slices (6,656 bytes each): 0.344 ms against two slices' 0.434 for dec3's
# forward (32 x 16 tiles: 0.477).
NARROW_RING_TILE = (64, 16, 2, 1)
NARROW_RING_STAGES = 4


def grid(rows, columns, tile):
    BM, BN = tile[:2]
    return math.ceil(columns / BN), math.ceil(rows / BM)


def _options(tile):
    return {} if config.ENABLE_CUDASIM else {"launch_bounds": (gemm_mma.threads(tile),)}


def _pairs(array):
    """A C-contiguous 16-bit array viewed as uint32 pairs along its last axis."""
    return array.view(np.uint32)


# --- the pixel-row passes: forward and backward input ---------------------------------

def ring(image, matrix) -> bool:
    """Whether a pass over `image` (NHWC) and a stored `matrix` copies its slices by cp.async (RING_STAGES on, both
    in whole 16-byte pieces), or stages them through registers."""
    return RING_STAGES > 0 and im2col_async.copyable(image, matrix)


def make_pixel_rows_kernel(tile_product, layout, block, dtype, backward, **options):
    """The forward's kernel (x, w, b, y, activation): y = act(im2col(x) @ w + b); with `backward`,
    the input gradient's (dy, flipped, h, dx, activation): dx = (im2col(dy) @ flipped) * act'(h), around a tensor-core
    tile product of BM x BN = `block` whose threads hold their outputs as `layout` says (this module's, conv_tf32's).
    The two differ only in their epilogue, which takes the same arguments."""
    BM, BN = block
    TM, TN = layout.TM, layout.TN
    load, store = codec(dtype)
    bias_activation, activation_grad = tiles.make_epilogues(layout, load, store)
    epilogue = activation_grad if backward else bias_activation

    # Block (by, bx) owns pixels by*BM:+BM and channels bx*BN:+BN of the output; each warp sums its
    # part over every (tap, summed channel) and writes it through the epilogue. The input gradient
    # is a gather over the flipped kernel: each dx[pixel, cin] summed by one warp. No atomics.
    @kernel_cache.jit(**options)
    def conv2d_pixel_rows_kernel(a, w, c, out, activation):
        after_previous_grid()
        pixels, columns = out.shape  # out viewed (N*H*W, C); w (KS*KS*C_summed, C)
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(a, w, acc, m0, n0, pixels, columns, 0, w.shape[0]):
            epilogue(acc, c, out, m0, n0, pixels, columns, activation)

    return conv2d_pixel_rows_kernel


def _product(tile, dtype, size, ring, columns):
    """This module's tile product of im2col(x) (`columns`: of im2col(x).T, the weight gradient's) and a stored
    matrix of `dtype` read row-contiguous. `ring`: (stages, early, ldmatrix) of the cp.async ring, its image taken
    as uint16 bits, else None: through registers (the pixel-row passes' image viewed as uint32 pairs)."""
    matrix = dense_operand(bits, False, bits_zero)
    if ring:
        image = (im2col_async.image_columns if columns else im2col_async.image_rows)(size)
        return gemm_mma.make_async_tile_product(tile, image, matrix, KINDS[dtype], *ring)
    image = (image_columns_operand if columns else image_rows_operand)(bits, size, bits_zero)
    return gemm_mma.make_tile_product(tile, image, matrix, KINDS[dtype])


@functools.cache
def _make_pixel_rows(tile, dtype, size, backward, ring=None):
    """make_pixel_rows_kernel on this module's tile product."""
    return make_pixel_rows_kernel(_product(tile, dtype, size, ring, False), gemm_mma.layout(tile), tile[:2], dtype,
                                  backward, **_options(tile))


def pixel_rows(image, matrix, size, c, out, activation, backward, tile=None, stages=None):
    """Launch a pixel-row pass: out (pixels, columns) from im2col(image) @ matrix, c its bias or h; the matrix may
    have more columns than out (zeros: conv_padded's), which are not written. `tile` and `stages`: the ring's
    (RING_TILE, RING_STAGES)."""
    pixels, columns = out.shape
    if ring(image, matrix):
        staging = (stages or RING_STAGES, RING_EARLY, RING_LDMATRIX)
        tile, a = tile or RING_TILE, image.view(np.uint16)
    else:
        tile, staging, a = TILE, None, _pairs(image)
    _make_pixel_rows(tile, image.dtype, size, backward, staging)[
        grid(pixels, columns, tile), gemm_mma.threads(tile), streams.current()](
        a, matrix.view(np.uint16), c, out, activation)


def forward_rows(x, w, b, y):
    """(image, matrix, size, bias, out) of a forward pass's pixel-row launch."""
    N, H, W, Cin = x.shape
    size, _, _, Cout = w.shape
    return x, w.reshape(size * size * Cin, Cout), size, b, y.reshape(N * H * W, Cout)


def backward_input_rows(dy, flipped, h, dx):
    """(image, matrix, size, h, out) of an input gradient's pixel-row launch, from the kernel rearranged by
    conv.flip_kernel into a (KS*KS*Cout, Cin) matrix."""
    N, H, W, Cin = dx.shape
    pixels = N * H * W
    return dy, flipped, math.isqrt(flipped.shape[0] // dy.shape[3]), h.reshape(pixels, Cin), dx.reshape(pixels, Cin)


def forward(x, w, b, y, activation):
    """conv.conv2d_forward on tensor cores; x's Cin even."""
    pixel_rows(*forward_rows(x, w, b, y), activation, False)


def backward_input(dy, flipped, h, dx, activation):
    """conv.conv2d_backward_input on tensor cores, from the flipped kernel (backward_input_rows); dy's Cout even."""
    pixel_rows(*backward_input_rows(dy, flipped, h, dx), activation, True)


# --- backward weight: chunk partials of im2col(x).T @ dy ------------------------------

def weight_plan(x_shape, w_shape, tile=None):
    """(chunk, chunks, most chunks) of the pixel chunks (chunks.blocks_chunk_plan) on `tile` (default TILE)."""
    N, H, W, Cin = x_shape
    size, _, _, Cout = w_shape
    return chunks.blocks_chunk_plan(N * H * W, math.prod(grid(size * size * Cin, Cout, tile or TILE)))


@functools.cache
def _make_weight_partials(tile, dtype, size, ring=None):
    """`ring` as _product's (the image taken as uint16 bits either way)."""
    return chunks.make_weight_partials(_product(tile, dtype, size, ring, True), gemm_mma.layout(tile), tile[:2],
                                       **_options(tile))


def weight_partials(x, dy, size, workspace):
    """The (chunks, KS*KS*Cin * Cout) partial sums of the weight gradient in `workspace`, each over one
    pixel chunk of weight_plan, for chunks.add_chunks to add."""
    # TILE either way: weight_plan's chunks, and the workspace, are TILE's
    outputs = dy.reshape(math.prod(dy.shape[:3]), dy.shape[3])
    staging = (RING_STAGES, RING_EARLY, RING_LDMATRIX) if ring(x, outputs) else None
    return launch_weight_partials(_make_weight_partials(TILE, x.dtype, size, staging), TILE, weight_plan,
                                  x.view(np.uint16), dy.view(np.uint16), size, workspace)


def launch_weight_partials(kernel, tile, plan, x, dy, size, workspace):
    """Launch a tensor-core weight-partials `kernel` (chunks.make_weight_partials') of `tile` over the pixel chunks
    of `plan` (this module's weight_plan, conv_tf32's); the (chunks, KS*KS*Cin * Cout) partials it wrote."""
    N, H, W, Cin = x.shape
    Cout = dy.shape[3]
    pixels, rows = N * H * W, size * size * Cin
    chunk, count, _ = plan(x.shape, (size, size, Cin, Cout))
    partials = workspace[:count * rows * Cout].reshape(count, rows, Cout)
    gx, gy = grid(rows, Cout, tile)
    kernel[(gx, gy, count), gemm_mma.threads(tile[:4]), streams.current()](
        x, dy.reshape(pixels, Cout), partials, chunk)
    return partials.reshape(count, rows * Cout)
