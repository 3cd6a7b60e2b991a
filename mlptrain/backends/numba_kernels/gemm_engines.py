"""The engines a dense layer's GEMM can sum with, and what each needs to launch (CUDA backend).

"fma": float32 FMAs on CUDA cores, every storage format (tiles.py), its tile picked by the output's size;
"tf32x3": tensor cores at float32 accuracy, one tile (gemm_tf32.py; cp.async where both operands are wide,
gemm_tf32_async.py), 16-bit operands by one exact product; "narrow": FMAs shaped by a layer's narrow side, N at
most gemm_narrow.NARROW_MOST, every format (gemm_narrow.py, which launches itself). gemm.py's launchers and
gemm_split.py's chunked sums take their tile products, staging and launch geometry from here.
"""

import functools

from mlptrain.backends.numba_kernels import gemm_narrow, gemm_tf32, gemm_tf32_async, wide
from mlptrain.backends.numba_kernels.tiles import TILES, launch_grid, make_tile_product, pick_tile, tile_layout

ENGINES = ("fma", "tf32x3", "narrow")
TF32_TILE = (64, 64, 2, 2, 16)
# tf32x3 with both operands copied by cp.async this many slices deep (gemm_tf32_async; both must be wide), 0: staged
# through registers: 16 lanes' eight GEMMs 274 -> 238 µs at 4, 244 at 3, 297 at 2 (benchmarks/trial_gemms.py
# --tf32-stages, H200; benchmarks/NOTES.md, issue 30 step 15)
TF32_STAGES = 4
# The tf32x3 tile's chunks of a split sum may be shorter than the CUDA-core tiles' chunks.MIN_CHUNK: its one 64 x 64
# tile makes 16 blocks of a 128 x 512 output, and K = 784 in 256-deep chunks would fill 48 of 132 SMs.
TF32_MIN_CHUNK = 64


def engine_parts(engine, tile, dtype, staging=(False, False, 0)):
    """(make the tile product of two operands, the Layout of its threads) of an engine's tile for operands stored
    as `dtype`; `staging` (A wide, B wide, stages) as engine_staging gives it for the tf32x3 engine, which sums
    16-bit operands (values a tf32 holds exactly) by one product each (gemm_tf32's `exact`)."""
    if engine == "tf32x3":
        exact = str(dtype) != "float32"
        make = (functools.partial(gemm_tf32_async.make_tile_product, tile, stages=staging[2]) if staging[2] else
                functools.partial(gemm_tf32.make_tile_product, tile, wide=staging[:2], exact=exact))
        return make, gemm_tf32.layout(tile)
    return functools.partial(make_tile_product, tile), tile_layout(tile)


def engine_staging(engine, a, b):
    """How the tf32x3 engine stages operands a and b: (a wide, b wide, stages): an operand wide.aligned_rows passes
    four elements a load, both by cp.async TF32_STAGES slices deep where both pass and TF32_STAGES is on. The bits
    are the same every way."""
    if engine != "tf32x3":
        return False, False, 0
    wide_a, wide_b = wide.aligned_rows(a), wide.aligned_rows(b)
    return wide_a, wide_b, TF32_STAGES if wide_a and wide_b else 0


def engine_launch(engine, M, N, trials, lead, tiles_for=None):
    """(tile, grid, threads) of an M x N output (each of `trials`; a grid axis for them when `lead`), the tile
    the one chosen for `tiles_for` trials (default `trials`)."""
    if engine == "tf32x3":
        BM, BN = TF32_TILE[:2]
        grid = (-(-N // BN), -(-M // BM))
        return TF32_TILE, ((*grid, trials) if lead else grid), gemm_tf32.tile_shape(TF32_TILE)[6]
    tile = TILES[pick_tile(M, N, tiles_for or trials)][0]
    return (tile, *launch_grid(M, N, tile, trials if lead else None))


def check_engine(engine, dtype, narrow_side=None):
    """`narrow_side`: the pass's N, which the narrow engine takes up to gemm_narrow.NARROW_MOST."""
    if engine not in ENGINES:
        raise ValueError(f"unknown GEMM engine {engine!r} (expected one of {ENGINES})")
    if engine == "narrow" and narrow_side > gemm_narrow.NARROW_MOST:
        raise ValueError(f"the narrow engine takes layers of at most {gemm_narrow.NARROW_MOST} outputs, got "
                         f"{narrow_side}")


def min_chunk(engine):
    """The shortest chunk a split sum on `engine` takes (None: chunks.MIN_CHUNK)."""
    return TF32_MIN_CHUNK if engine == "tf32x3" else None
