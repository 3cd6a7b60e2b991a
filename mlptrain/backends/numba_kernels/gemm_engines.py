"""The engines a dense layer's GEMM can sum with, and what each needs to launch (CUDA backend).

"fma": float32 FMAs on CUDA cores, every storage format (tiles.py), its tile picked by the output's size;
"tf32x3": tensor cores at float32 accuracy, one tile (gemm_tf32.py; cp.async where both operands are wide,
gemm_async.py), 16-bit operands by one exact product; "mma16": 16-bit operands on tensor cores by m16n8k16
products, float32 sums, one tile (gemm_mma.py; cp.async where both operands' rows are whole copies); "narrow":
FMAs shaped by a layer's narrow side, N at most gemm_narrow.NARROW_MOST, every format (gemm_narrow.py, which
launches itself). gemm.py's launchers and gemm_split.py's chunked sums take their tile products, staging and
launch geometry from here.
"""

import functools

from mlptrain.backends.numba_kernels import gemm_mma, gemm_narrow, gemm_tf32, wide
from mlptrain.backends.numba_kernels.tiles import (
    TILES, dense_operand, launch_grid, make_tile_product, pick_tile, tile_layout)

ENGINES = ("fma", "tf32x3", "mma16", "narrow")
MMA16_KINDS = {"uint16": "bf16", "float16": "fp16"}  # a 16-bit storage format's mma inputs (bf16 lives in uint16)
TF32_TILE = (64, 64, 2, 2, 16)  # a trial-axis launch's (packed lanes, packing.lane_step)
# a run's own launches': 784-512-512-10 at batch 128 fp32, 67.0 / 68.0 -> 63.1 / 63.3 µs a step on 64 x 32;
# 784-128-128-10 at 2048, 184.8 / 189.8 -> 178.9 / 177.7 (H200; benchmarks/NOTES.md, issue 31 step 4b)
RUN_TF32_TILE = (64, 32, 2, 2, 16)
# tf32x3 with both operands copied by cp.async this many slices deep (gemm_async; both must be wide), 0: staged
# through registers: 16 lanes' eight GEMMs 274 -> 238 µs at 4, 244 at 3, 297 at 2 (benchmarks/trial_gemms.py
# --tf32-stages, H200; benchmarks/NOTES.md, issue 30 step 15)
TF32_STAGES = 4
# The tf32x3 tile's chunks of a split sum may be shorter than the CUDA-core tiles' chunks.MIN_CHUNK: its one 64 x 64
# tile makes 16 blocks of a 128 x 512 output, and K = 784 in 256-deep chunks would fill 48 of 132 SMs.
TF32_MIN_CHUNK = 64
# mma16: four warps of 32 x 16 outputs (two 16-row by two 8-column fragments a warp), 32-deep slices (gemm_mma.BK).
# 784-512-512-10 at batch 128, bf16, µs a step: 64.9 / 65.3 on 64 x 64 tiles, 64.7 / 64.5 on 32 x 64, 60.6 / 62.0 on
# 64 x 32 (H200; benchmarks/NOTES.md, issue 31 step 4)
MMA16_TILE = (64, 32, 2, 2)
# ... its slices copied by cp.async this many deep where both operands' rows are whole copies (0: through
# registers): 4 against 3, 64.9 / 65.3 against 65.3 / 65.4 µs there
MMA16_STAGES = 4


def engine_parts(engine, tile, dtype, staging=(False, False, 0)):
    """(make the tile product of two operands, the Layout of its threads) of an engine's tile for operands stored
    as `dtype`; `staging` (A wide, B wide, stages) as engine_staging gives it for the tensor-core engines. tf32x3
    sums 16-bit operands (values a tf32 holds exactly) by one product each (gemm_tf32's `exact`)."""
    if engine == "tf32x3":
        exact = str(dtype) != "float32"
        make = (functools.partial(gemm_tf32.make_async_tile_product, tile, stages=staging[2]) if staging[2] else
                functools.partial(gemm_tf32.make_tile_product, tile, wide=staging[:2], exact=exact))
        return make, gemm_tf32.layout(tile)
    if engine == "mma16":
        kind = MMA16_KINDS[str(dtype)]
        if staging[2]:
            return functools.partial(gemm_mma.make_async_tile_product, tile, kind=kind, stages=staging[2]), \
                gemm_mma.layout(tile)
        bits = gemm_mma.storage_bits(dtype)

        def make_staged(a_operand, b_operand):
            # the operands' elements as raw bits, each packed by its pair of k (gemm_mma's k-strided staging,
            # which reads a k-contiguous matrix element by element too): any shape, the async slices' bits
            return gemm_mma.make_tile_product(tile, *(dense_operand(bits, o.k_contiguous, gemm_mma.bits_zero)
                                                      ._replace(k_contiguous=False) for o in (a_operand, b_operand)),
                                              kind)

        return make_staged, gemm_mma.layout(tile)
    return functools.partial(make_tile_product, tile), tile_layout(tile)


def engine_staging(engine, a, b):
    """How a tensor-core engine stages operands a and b: (a wide, b wide, stages). tf32x3: an operand
    wide.aligned_rows passes four elements a load, both by cp.async TF32_STAGES slices deep where both pass and
    TF32_STAGES is on. mma16: both by cp.async MMA16_STAGES deep where wide.copyable_rows passes both, else both
    through registers. The bits are the same every way."""
    if engine == "mma16":
        whole_a, whole_b = wide.copyable_rows(a), wide.copyable_rows(b)
        return whole_a, whole_b, MMA16_STAGES if whole_a and whole_b else 0
    if engine != "tf32x3":
        return False, False, 0
    wide_a, wide_b = wide.aligned_rows(a), wide.aligned_rows(b)
    return wide_a, wide_b, TF32_STAGES if wide_a and wide_b else 0


def engine_launch(engine, M, N, trials, lead, tiles_for=None):
    """(tile, grid, threads) of an M x N output (each of `trials`; a grid axis for them when `lead`), the tile
    the one chosen for `tiles_for` trials (default `trials`)."""
    if engine in ("tf32x3", "mma16"):  # one tile each (tf32x3: a trial-axis launch's and a run's own)
        if engine == "tf32x3":
            tile = TF32_TILE if lead else RUN_TF32_TILE
            threads = gemm_tf32.tile_shape(tile)[6]
        else:
            tile, threads = MMA16_TILE, gemm_mma.threads(MMA16_TILE)
        grid = (-(-N // tile[1]), -(-M // tile[0]))
        return tile, ((*grid, trials) if lead else grid), threads
    tile = TILES[pick_tile(M, N, tiles_for or trials)][0]
    return (tile, *launch_grid(M, N, tile, trials if lead else None))


def check_engine(engine, dtype, narrow_side=None):
    """`narrow_side`: the pass's N, which the narrow engine takes up to gemm_narrow.NARROW_MOST."""
    if engine not in ENGINES:
        raise ValueError(f"unknown GEMM engine {engine!r} (expected one of {ENGINES})")
    if engine == "mma16" and str(dtype) not in MMA16_KINDS:
        raise ValueError(f"the mma16 engine takes 16-bit operands (bf16 or fp16), got {dtype}")
    if engine == "narrow" and narrow_side > gemm_narrow.NARROW_MOST:
        raise ValueError(f"the narrow engine takes layers of at most {gemm_narrow.NARROW_MOST} outputs, got "
                         f"{narrow_side}")


def min_chunk(engine):
    """The shortest chunk a split sum on `engine` takes (None: chunks.MIN_CHUNK)."""
    return TF32_MIN_CHUNK if engine in ("tf32x3", "mma16") else None
