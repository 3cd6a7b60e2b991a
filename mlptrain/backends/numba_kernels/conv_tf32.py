"""The float32 convolutions' implicit GEMMs on tensor cores at float32 accuracy: 3xTF32 (CUDA backend).

conv.py's three passes with gemm_tf32's tile product in place of the CUDA-core tiles: each float32 value split
into a tf32 big part and its small remainder, three products a k step (gemm_tf32's docstring), so each output
is within float32's error bounds but not the CUDA-core tiles' bits. conv_plan sends a float32 pass here on a GPU
of compute capability 8.0 or later where the channels on both sides are whole 16-byte pieces (a multiple of 4).

    forward          y  = act(im2col(x) @ w + b)        A: x (N, H, W, Cin)       B: w (K, Cout)
    backward input   dx = (im2col(dy) @ w') * act'(h)    A: dy                     B: flipped w (K, Cin)
    backward weight  partials = im2col(x).T @ dy         A: x                      B: dy (pixels, Cout)

Where the image and the matrix are 16-byte aligned, a pass copies its slices by cp.async into a ring
(im2col_async, gemm_async); otherwise it stages them through registers an element at a time (im2col's operands).
Both feed the same values to the same products in the same order: the same bits. No atomics: each output is one
warp's mma sequence, the weight gradient's chunks added in chunk order, so results are bitwise reproducible on
one GPU model. The launchers are the second half of conv's, which have checked every argument.
"""

import functools
import math

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import config
from mlptrain.backends.numba_kernels import chunks, conv_mma, gemm_tf32, im2col_async, streams
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.conv_mma import launch_weight_partials, make_pixel_rows_kernel
from mlptrain.backends.numba_kernels.im2col import image_columns_operand, image_rows_operand
from mlptrain.backends.numba_kernels.tiles import dense_operand

# 8 warps of 32 x 64 outputs (conv_mma's RING_TILE), 16-deep slices: two slices of float32 operands take 37,888
# bytes of shared memory, under a block's 48 KiB of static arrays (32-deep ones would leave room for one)
TILE = (128, 128, 4, 2, 16)
STAGES = 2  # the ring's slices (0: every pass through registers)
EARLY = True  # a slice's copies issued before the products of the one ahead (gemm_async)
FLOAT32 = np.dtype(np.float32)


def _options(tile):
    return {} if config.ENABLE_CUDASIM else {"launch_bounds": (gemm_tf32.tile_shape(tile)[6],)}


def ring(image, matrix) -> bool:
    """Whether a pass over `image` (NHWC) and a stored `matrix` copies its slices by cp.async (STAGES on, both in
    whole 16-byte pieces and aligned), or stages them through registers."""
    return STAGES > 0 and im2col_async.copyable(image, matrix)


def _staging(image, matrix):
    return (STAGES, EARLY) if ring(image, matrix) else None


# --- the pixel-row passes: forward and backward input ---------------------------------

def _product(tile, size, staging, columns):
    """gemm_tf32's tile product of im2col(x) (`columns`: of im2col(x).T, the weight gradient's) and a stored float32
    matrix read row-contiguous, by the ring (`staging`: its stages and early) or through registers (None)."""
    load, _ = codec(FLOAT32)
    matrix = dense_operand(load, False)
    if staging:
        image = (im2col_async.image_columns if columns else im2col_async.image_rows)(size)
        return gemm_tf32.make_async_tile_product(tile, image, matrix, *staging)
    return gemm_tf32.make_tile_product(tile, (image_columns_operand if columns else image_rows_operand)(load, size),
                                       matrix)


@functools.cache
def _make_pixel_rows(tile, size, backward, staging):
    return make_pixel_rows_kernel(_product(tile, size, staging, False), gemm_tf32.layout(tile), tile[:2], FLOAT32,
                                  backward, **_options(tile))


def _pixel_rows(image, matrix, size, c, out, activation, backward):
    pixels, columns = out.shape
    kernel = _make_pixel_rows(TILE, size, backward, _staging(image, matrix))
    kernel[conv_mma.grid(pixels, columns, TILE), gemm_tf32.tile_shape(TILE)[6], streams.current()](
        image, matrix, c, out, activation)


def forward(x, w, b, y, activation):
    """conv.conv2d_forward on tensor cores, 3xTF32."""
    _pixel_rows(*conv_mma.forward_rows(x, w, b, y), activation, False)


def backward_input(dy, flipped, h, dx, activation):
    """conv.conv2d_backward_input on tensor cores, 3xTF32, from the flipped kernel (conv_mma.backward_input_rows)."""
    _pixel_rows(*conv_mma.backward_input_rows(dy, flipped, h, dx), activation, True)


# --- backward weight: chunk partials of im2col(x).T @ dy ------------------------------

def weight_plan(x_shape, w_shape):
    """(chunk, chunks, most chunks) of the pixel chunks on this module's TILE (conv_mma.weight_plan)."""
    return conv_mma.weight_plan(x_shape, w_shape, TILE)


@functools.cache
def _make_weight_partials(tile, size, staging):
    return chunks.make_weight_partials(_product(tile, size, staging, True), gemm_tf32.layout(tile), tile[:2],
                                       **_options(tile))


def weight_partials(x, dy, size, workspace):
    """The (chunks, KS*KS*Cin * Cout) partial sums of the weight gradient in `workspace`, each over one pixel chunk
    of weight_plan, for chunks.add_chunks to add."""
    staging = _staging(x, dy.reshape(math.prod(dy.shape[:3]), dy.shape[3]))
    return launch_weight_partials(_make_weight_partials(TILE, size, staging), TILE, weight_plan, x, dy, size,
                                  workspace)
