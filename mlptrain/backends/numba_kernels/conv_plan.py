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
                  and later (the input gradient also needs the pre-flipped kernel buffer); `padded` "cin"
                  or "cout": the layer's side of fewer than conv_padded.PIECE channels (an RGB image or
                  output) padded with zeros into a scratch buffer first, so that conv_mma's cp.async ring
                  takes the pass (tried first, where PADDED names it and the buffers are large enough)
    tf32x3        float32 with the channels on both sides a multiple of 4, on compute capability 8.0
                  and later: tensor cores at float32 accuracy (conv_tf32; the input gradient also
                  needs the pre-flipped kernel buffer), where TF32X3 is on
    tiled         the CUDA-core implicit GEMM, with the tile named in `tile`

`workspace` is the float32 elements the weight gradient's chunk partials need (0 for the pixel-row
passes), `scratch` the storage elements a padded pixel-row pass needs in its scratch buffer; neither
shrinks for a smaller batch, so buffers planned for the largest batch serve all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import config
from mlptrain.backends.numba_kernels import (chunks, conv_mma, conv_narrow, conv_padded, conv_tf32, conv_wide,
                                             tensor_core, tiles)

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


# The 16-bit passes, (pass, the layer's side), with a side of fewer than conv_padded.PIECE channels that run on
# conv_mma's ring, that side padded first (conv_padded); the others take conv_narrow, conv_wide or the register
# staging. `benchmarks/conv.py --stagings`, bf16, batch 256, H200, ms padded against not: enc1's (3 -> 256) weight
# gradient 0.141 against 0.426 (registers); dec3's (256 -> 3) forward 0.434, 0.344 on a ring of 4, against 0.372
# (conv_narrow). Left out: enc1's forward 0.318 against 0.236 (conv_wide), dec3's input gradient 0.627 against
# 0.298 (conv_wide): with K = 72, a tile is three slices, and its start and epilogue are most of its time.
PADDED = frozenset({("backward_weight", "cin"), ("forward", "cout")})


class Plan(NamedTuple):
    variant: str  # narrow | wide | tensor_cores | tf32x3 | tiled
    tile: str | None  # the tiled variant's tile (a key of TILES)
    workspace: int  # float32 elements of weight-gradient workspace; 0 for the other passes
    padded: str = ""  # "cin" or "cout": the layer's side padded to conv_padded.PIECE channels first; "" none
    scratch: int = 0  # storage elements of scratch a padded pixel-row pass needs

    def label(self) -> str:
        if self.variant == "tiled":
            return f"tiled/{self.tile}"
        return f"{self.variant}/{self.padded}_padded" if self.padded else self.variant


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


def padded_side(dtype, summed, other, capability) -> str:
    """Which side of a 16-bit pass summing `summed` channels a tap into `other` channels conv_padded can pad: "summed"
    where only it falls short of a whole piece, "other" where only the other side does, else ""."""
    if not tensor_cores(dtype, 0, capability):
        return ""
    piece = conv_padded.PIECE
    if summed < piece and other % piece == 0:
        return "summed"
    if other < piece and summed % piece == 0:
        return "other"
    return ""


def padded_plan(pass_: str, x_shape, w_shape, dtype, capability, flipped: bool, scratch) -> Plan | None:
    """The padded tensor-core Plan of a pass where one fits (padded_side) and `scratch` (storage elements, None:
    unlimited) holds what it needs, else None. The forward pads the summed Cin (with the kernel's rows) or the
    kernel's Cout columns (a narrow tile then); the input gradient dy's summed Cout (with the flipped kernel's
    rows); the weight gradient the image's Cin, in its float32 workspace after the chunks' partials."""
    N, H, W, Cin = x_shape
    size, _, _, Cout = w_shape
    pixels, taps, piece = N * H * W, size * size, conv_padded.PIECE
    itemsize = np.dtype(dtype).itemsize
    if pass_ == "forward":
        side = padded_side(dtype, Cin, Cout, capability)
        needs = {"summed": (pixels * piece, taps * piece * Cout), "other": (taps * Cin * piece,)}.get(side)
        padded = "cin" if side == "summed" else "cout"
    elif pass_ == "backward_input":
        side = padded_side(dtype, Cout, Cin, capability) if flipped else ""
        # dy padded, the kernel padded along Cout, then flipped
        needs = (pixels * piece, taps * Cin * piece, taps * piece * Cin) if side == "summed" else None
        padded = "cout"
    else:
        side = padded_side(dtype, Cin, Cout, capability)
        if side != "summed" or (pass_, "cin") not in PADDED:
            return None
        most = conv_mma.weight_plan((N, H, W, piece), (size, size, piece, Cout))[2]
        image = conv_padded.pieces_elements(4, math.ceil(pixels * piece * itemsize / 4))
        return Plan("tensor_cores", None, conv_padded.pieces_elements(4, most * taps * piece * Cout) + image, "cin")
    if needs is None or (pass_, padded) not in PADDED:
        return None
    need = conv_padded.pieces_elements(itemsize, *needs)
    if scratch is not None and scratch < need:
        return None
    return Plan("tensor_cores", None, 0, padded, need)


def plan(pass_: str, x_shape, w_shape, dtype, capability, flipped: bool = True, scratch=None) -> Plan:
    """The variant, tile and workspace of one pass for x (N, H, W, Cin) and w (KS, KS, Cin, Cout). `scratch`: the
    storage elements of the pixel-row pass's scratch buffer (the forward's, the input gradient's flipped one), None
    where it will be as large as conv.conv2d_scratch asks."""
    N, H, W, Cin = x_shape
    size, _, _, Cout = w_shape
    pixels = N * H * W
    if pass_ in PASSES:
        padded = padded_plan(pass_, x_shape, w_shape, dtype, capability, flipped, scratch)
        if padded is not None:
            return padded
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

