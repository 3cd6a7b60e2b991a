"""Which kernel runs each pass of a convolution: one pure function of the shapes, the storage format
and the GPU's compute capability.

    plan(pass_, x_shape, w_shape, dtype, capability, flipped=True) -> Plan(variant, tile, workspace)

The launchers in conv.py, the workspace the model allocates, the tests and the run's summary all
ask this one function, so what is chosen, what is sized and what is recorded cannot drift apart.
Variants, in the order they are tried:

    narrow        outputs of at most conv_narrow.NARROW_OUT channels (the decoder's RGB): direct
                  kernels (forward and weight gradient)
    wide          at most conv_wide.WIDE_IN channels summed a tap (the encoder's RGB input): direct
                  kernels (forward and input gradient)
    tensor_cores  bf16 / fp16 storage with an even channel count summed, on compute capability 8.0
                  and later (the input gradient also needs the pre-flipped kernel buffer)
    tf32x3        float32 with the channels on both sides a multiple of 4, on compute capability 8.0
                  and later: tensor cores at float32 accuracy (conv_tf32; the input gradient also
                  needs the pre-flipped kernel buffer), where TF32X3 is on
    tiled         the CUDA-core implicit GEMM, with the tile named in `tile`

`workspace` is the float32 elements the weight gradient's chunk partials need (0 for the pixel-row
passes); it never shrinks for a smaller batch, so a workspace planned for the largest batch serves
all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import config
from mlptrain.backends.numba_kernels import chunks, conv_mma, conv_narrow, conv_tf32, conv_wide, tensor_core, tiles

PASSES = ("forward", "backward_input", "backward_weight")

# gemm's tiles, plus NARROW for outputs a few channels wide, which SMALL pads
# to 32 columns. Of seven narrow candidates timed on an H100 (fp32, 256 x 32 x
# 32 images, 256 -> 3 and 512 -> 8 channels, forward and weight gradient), this
# one was within 12% of the fastest in all four: at 256 -> 3, 4.7 and 6.1 ms
# against SMALL's 6.5 and 8.2 (in bf16 its weight gradient was slower than
# SMALL's: 12.6 against 10.7 ms). Less than 4x less padding promises: at 8
# columns a block, each im2col element fetched feeds few FMAs and its
# addressing rules. Outputs of up to conv_narrow.NARROW_OUT channels (the
# decoder's 3) now take conv_narrow's direct kernels instead; NARROW still
# serves 5-8 output channels, and input gradients of inputs that narrow.
NARROW_TILE = (128, 8, 8, 8, 2, 4)
# Two more for the big layers, from `benchmarks/conv.py --tiles` on an H100 (fp32, batch 256, the
# 16 x 16 256 <-> 128 layers; ms forward / input gradient / weight gradient): LARGE 2.14 / 2.33 / 2.99,
# WIDE 1.77 / 2.07-2.10 / 2.55, SQUARE 1.82-1.84 / 2.09-2.18 / 2.39. An im2col element costs more to
# fetch than a stored one, so tiles that feed more FMAs per fetch win here though not in gemm: WIDE
# for the pixel-row passes, SQUARE (and its 16-deep slices) for the weight gradient.
WIDE_TILE = (64, 128, 8, 4, 8, 1)
SQUARE_TILE = (128, 128, 16, 8, 8, 1)
TILES = {"wide": (WIDE_TILE, 128), "square": (SQUARE_TILE, 128), **tiles.TILES, "narrow": (NARROW_TILE, 0)}
PIXEL_TILES = ("wide", "large", "medium", "small", "narrow")
WEIGHT_TILES = ("square", "large", "medium", "small", "narrow")


# float32 passes on conv_tf32 where they fit; off, on the CUDA-core tiles. Off on the simulator, which emulates
# each mma through shared memory (as gemm.RUN_TF32X3): conv_tf32 is tested there on a small tile.
TF32X3 = not config.ENABLE_CUDASIM


class Plan(NamedTuple):
    variant: str  # narrow | wide | tensor_cores | tf32x3 | tiled
    tile: str | None  # the tiled variant's tile (a key of TILES)
    workspace: int  # float32 elements of weight-gradient workspace; 0 for the other passes

    def label(self) -> str:
        return f"tiled/{self.tile}" if self.variant == "tiled" else self.variant


def tensor_cores(dtype, summed, capability) -> bool:
    """Whether a pass over `dtype` storage summing `summed` channels a tap runs on tensor cores on a
    GPU of `capability` (summed 0: the weight gradient, which sums pixels)."""
    return (np.dtype(dtype) in conv_mma.KINDS and summed % 2 == 0
            and tuple(capability) >= tensor_core.CAPABILITY)


def tf32x3(dtype, summed, other, capability) -> bool:
    """Whether a float32 pass summing `summed` channels a tap into `other` channels runs on conv_tf32 on a GPU of
    `capability`: both whole 16-byte pieces (the weight gradient: Cin and Cout)."""
    return (TF32X3 and np.dtype(dtype) == np.float32 and summed % 4 == 0 and other % 4 == 0
            and tuple(capability) >= tensor_core.CAPABILITY)


def plan(pass_: str, x_shape, w_shape, dtype, capability, flipped: bool = True) -> Plan:
    """The variant, tile and workspace of one pass for x (N, H, W, Cin) and w (KS, KS, Cin, Cout)."""
    N, H, W, Cin = x_shape
    size, _, _, Cout = w_shape
    pixels = N * H * W
    if pass_ == "forward":
        if conv_narrow.fits(size, Cout):
            return Plan("narrow", None, 0)
        if conv_wide.wide_fits(size, Cin):
            return Plan("wide", None, 0)
        if tensor_cores(dtype, Cin, capability):
            return Plan("tensor_cores", None, 0)
        if tf32x3(dtype, Cin, Cout, capability):
            return Plan("tf32x3", None, 0)
        return Plan("tiled", pick_tile(pixels, Cout), 0)
    if pass_ == "backward_input":
        if conv_wide.wide_fits(size, Cout):
            return Plan("wide", None, 0)
        if flipped and tensor_cores(dtype, Cout, capability):
            return Plan("tensor_cores", None, 0)
        if flipped and tf32x3(dtype, Cout, Cin, capability):
            return Plan("tf32x3", None, 0)
        return Plan("tiled", pick_tile(pixels, Cin), 0)
    if pass_ == "backward_weight":
        elements = size * size * Cin * Cout
        if conv_narrow.fits(size, Cout):
            return Plan("narrow", None, conv_narrow.weight_workspace(x_shape, w_shape))
        if tensor_cores(dtype, 0, capability):
            return Plan("tensor_cores", None, conv_mma.weight_plan(x_shape, w_shape)[2] * elements)
        if tf32x3(dtype, Cin, Cout, capability):
            return Plan("tf32x3", None, conv_tf32.weight_plan(x_shape, w_shape)[2] * elements)
        name, _, _, most = tiled_weight_chunks(x_shape, w_shape)
        return Plan("tiled", name, most * elements)
    raise ValueError(f"unknown convolution pass {pass_!r} (expected one of {', '.join(PASSES)})")


def pick_tile(rows, columns, weight=False):
    """The tile that reads the fewest shared-memory values for a rows x columns output, padding
    included (a thread reads TM + TN values for TM x TN FMAs; a 3-channel output pads LARGE 43-fold,
    SMALL 11-fold, NARROW under 3-fold); ties go to the first listed. The pixel-row passes choose
    among PIXEL_TILES whose grid has the tile's minimum of blocks; a `weight` gradient among all of
    WEIGHT_TILES (it fills the GPU with pixel chunks)."""
    def reads(name):
        BM, BN, _, TM, TN, _ = TILES[name][0]
        return math.ceil(rows / BM) * BM * math.ceil(columns / BN) * BN * (TM + TN) / (TM * TN)

    def fills(name):
        tile, min_blocks = TILES[name]
        grid, _ = tiles.launch_grid(rows, columns, tile)
        return grid[0] * grid[1] >= min_blocks

    if weight:
        return min(WEIGHT_TILES, key=reads)
    return min((name for name in PIXEL_TILES if fills(name)), key=reads)


def tiled_weight_chunks(x_shape, w_shape):
    """(tile name, chunk, chunks, most chunks) of the tiled weight gradient: the tile for its
    (KS*KS*Cin, Cout) output, then at most enough pixel chunks for about chunks.CHUNK_BLOCKS blocks,
    each of at least chunks.MIN_CHUNK pixels. `most chunks` grows with the batch."""
    N, H, W, Cin = x_shape
    size, _, _, Cout = w_shape
    pixels, rows = N * H * W, size * size * Cin
    name = pick_tile(rows, Cout, weight=True)
    return (name, *chunks.chunk_plan(pixels, rows, Cout, TILES[name][0]))

