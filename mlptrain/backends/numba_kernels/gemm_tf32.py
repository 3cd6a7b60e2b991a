"""Tile products of float32 operands on tensor cores at float32 accuracy: 3xTF32 (CUDA backend).

A tensor core multiplies tf32 (float32 with 10 mantissa bits). Each float32 element x is split, as it
is read for a product, into big = x rounded to tf32 (to nearest, ties away from zero) and small = x - big
(exact in float32; the tensor core reads its top 10 mantissa bits too), and every k step sums three
products into the float32 accumulators: small_a @ big_b, big_a @ small_b, then big_a @ big_b (the small
terms first, so they are not lost against the big one). The dropped small_a @ small_b and small's own
truncation leave each product within ~2^-21 of its value, where float32's own rounding is 2^-24: float32
accuracy, but not the bits of the CUDA-core kernels. (CUTLASS's route to fp32-accurate tensor-core GEMMs.)
An inf or NaN operand gives NaN (big - big), not inf: a non-finite gradient is still non-finite.

The same interface as tiles.make_tile_product: the same `Operand`s (tiles.dense_operand: float32 elements,
zero outside the matrix), the call (a, b, acc, m0, n0, M, N, k_begin, k_end), and a thread `layout` for
the epilogues.

A tile is (BM, BN, WM, WN, BK): WM x WN warps, each a (BM / WM) x (BN / WN) part of the output in 16 x 8
fragments; K advances in slices of BK (a multiple of 8: BK / 8 k8 steps between two barriers). Both
operands are staged in shared memory as [k, row] float32 with a row pitch of ROWS + 8 words: a fragment
load (rows g = lane // 4 of 8, k t = lane % 4 of 4) then touches banks 8t + g, all 32 distinct. A
k-contiguous operand is read from memory as 8 rows x 4 consecutive k a warp (stores to banks 8k + row:
distinct); a row-contiguous one as 32 consecutive rows at one k (coalesced, stores to consecutive banks).

Every output is summed by one warp in a fixed order (the mma sequence over k), with no atomics: the
results are bitwise reproducible on one GPU model.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint32, uint64
from mlptrain.backends.numba_kernels import gemm_async, gemm_mma, tiles
from mlptrain.backends.numba_kernels.codecs import bits_float, float_bits
from mlptrain.backends.numba_kernels.tensor_core import mma
from mlptrain.backends.numba_kernels.wide import load4, store4

ROUND = 0x1000  # half of the 13 bits tf32 drops: added to the magnitude bits, it rounds them to nearest
TF32 = 0xFFFFE000  # the bits tf32 keeps


def tile_shape(tile):
    """(BM, BN, WM, WN, FM, FN, threads): FM x FN fragments a warp."""
    BM, BN, WM, WN, BK = tile
    if BM % (16 * WM) or BN % (8 * WN) or BM % 32 or BN % 32 or BK % 8:
        raise ValueError(f"tile {tile}: warps must cover 16 x 8 fragments, each side 32 rows, a slice whole k8 steps")
    return BM, BN, WM, WN, BM // WM // 16, BN // WN // 8, 32 * WM * WN


def layout(tile):
    """The tiles.Layout of a tile's threads: m16n8k8's accumulators sit where gemm_mma's m16n8k16's do."""
    return gemm_mma.layout(tile[:4])


@kernel_cache.device
def exact_parts(x):
    """(big, small) bits of a float32 x that a tf32 holds exactly (a 16-bit storage format's value: bf16's 8
    mantissa bits and fp16's 10 fit tf32's 10, its exponent float32's): x itself and zero, with no rounding."""
    return float_bits(x), uint32(0)


@kernel_cache.device
def split(x):
    """(big, small) bits of float32 x: big = x rounded to tf32, small = x - big."""
    big = uint32((float_bits(x) + uint32(ROUND)) & uint32(TF32))
    return big, float_bits(x - bits_float(big))


def make_first_reads(shape, a_steps, b_steps):
    """Device function (t) -> (a_first, b_first): the words where thread t's first fragment reads start in a
    slice, for a tile of (BM, BN, WM, WN) = `shape` whose operands' words are `steps` (one row, one k) apart: row g
    = lane // 4 of its warp's first fragment, at k lane % 4 (make_multiply_slice reads from there), whichever
    staging filled the slice."""
    BM, BN, WM, WN = shape
    A_ROW, A_K = a_steps
    B_ROW, B_K = b_steps

    @kernel_cache.device
    def first_reads(t):
        warp, lane = t // 32, t % 32
        return (uint64(((warp // WN) * (BM // WM) + lane // 4) * A_ROW + (lane % 4) * A_K),
                uint64(((warp % WN) * (BN // WN) + lane // 4) * B_ROW + (lane % 4) * B_K))

    return first_reads


def make_multiply_slice(FM, FN, BK, a_steps, b_steps, exact=False):
    """Device function (As, Bs, a_first, b_first, acc): acc += one BK-deep slice's 3xTF32 products for a warp's
    FM x FN fragments, from the slices in shared memory, each operand's words `steps` (one row, one k) apart and
    this thread's first reads at a_first and b_first. Every fragment value is split as it is read; the products
    of a fragment run small_a @ big_b, big_a @ small_b, big_a @ big_b, k ascending: the engine's order, whichever
    staging filled the slices."""
    A_ROW, A_K = a_steps
    B_ROW, B_K = b_steps
    product = mma("tf32")
    parts = exact_parts if exact else split

    @kernel_cache.device
    def multiply_slice(As, Bs, a_first, b_first, acc):
        a_big, a_small = cuda.local.array((FM, 4), uint32), cuda.local.array((FM, 4), uint32)
        b_big, b_small = cuda.local.array((FN, 2), uint32), cuda.local.array((FN, 2), uint32)
        for s in range(0, BK, 8):  # the slice's k8 steps
            for i in range(FM):
                for r in range(4):  # A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]
                    at = a_first + uint64((16 * i + 8 * (r & 1)) * A_ROW + (s + 4 * (r >> 1)) * A_K)
                    a_big[i, r], a_small[i, r] = parts(As[at])
            for j in range(FN):
                for r in range(2):  # B[t, g], B[t + 4, g]
                    at = b_first + uint64(8 * j * B_ROW + (s + 4 * r) * B_K)
                    b_big[j, r], b_small[j, r] = parts(Bs[at])
            for i in range(FM):
                for j in range(FN):
                    c0, c1 = acc[2 * i, 2 * j], acc[2 * i, 2 * j + 1]
                    c2, c3 = acc[2 * i + 1, 2 * j], acc[2 * i + 1, 2 * j + 1]
                    if not exact:  # (a constant of the closure: an exact slice has no small products)
                        c0, c1, c2, c3 = product(a_small[i, 0], a_small[i, 1], a_small[i, 2], a_small[i, 3],
                                                 b_big[j, 0], b_big[j, 1], c0, c1, c2, c3)
                        c0, c1, c2, c3 = product(a_big[i, 0], a_big[i, 1], a_big[i, 2], a_big[i, 3],
                                                 b_small[j, 0], b_small[j, 1], c0, c1, c2, c3)
                    c0, c1, c2, c3 = product(a_big[i, 0], a_big[i, 1], a_big[i, 2], a_big[i, 3],
                                             b_big[j, 0], b_big[j, 1], c0, c1, c2, c3)
                    acc[2 * i, 2 * j], acc[2 * i, 2 * j + 1] = c0, c1
                    acc[2 * i + 1, 2 * j], acc[2 * i + 1, 2 * j + 1] = c2, c3

    return multiply_slice


def _make_stage(operand, ROWS, BK, THREADS):
    """(rows, load, store, loads): a block's share of one BK x ROWS slice of an operand. Element e of the
    slice is (row, k) `unit(e)`; thread t takes elements t, t + THREADS, ...: the codes of their rows once
    per tile, their values into registers once per slice, then to shared memory at k * PITCH + row."""
    _, row, column, fetch, along_k = operand
    UNITS = ROWS * BK
    LOADS = UNITS // THREADS
    PITCH = ROWS + 8
    if UNITS % THREADS:
        raise ValueError(f"{UNITS} elements of a slice do not split over {THREADS} threads")

    @kernel_cache.device
    def unit(e):
        if along_k:  # 32 elements: 8 rows x 4 consecutive k; then the slice's next 4 k, then the next 8 rows
            lane, group = e % 32, e // 32
            return (group // (BK // 4)) * 8 + lane // 4, (group % (BK // 4)) * 4 + lane % 4
        return e % ROWS, e // ROWS

    @kernel_cache.device
    def rows(array, geometry, codes, i0, I, t):
        for l in range(LOADS):
            r, _ = unit(t + l * THREADS)
            codes[l] = row(array, geometry, i0 + r, I)

    @kernel_cache.device
    def load(array, geometry, codes, regs, k0, K, t):
        for l in range(LOADS):
            _, k = unit(t + l * THREADS)
            regs[l] = fetch(array, geometry, codes[l], column(array, geometry, k0 + k, K))

    @kernel_cache.device
    def store(shared, regs, t):
        for l in range(LOADS):
            r, k = unit(t + l * THREADS)
            shared[k * PITCH + r] = regs[l]

    return rows, load, store, LOADS, PITCH


def _make_wide_stage(operand, ROWS, BK, THREADS):
    """`_make_stage` for a stored float32 matrix whose rows `wide.aligned_rows` passed: four elements along its
    contiguous axis a load (wide.load4) and a bounds check a load, not an element. The same values land in the
    same shared words, so a product's bits do not depend on which stage staged it. A k-contiguous operand's
    quads are read by 16 rows x 2 quads a warp (each row's 32 bytes one sector; its stores two-way on banks),
    a row-contiguous one's by 64 consecutive rows at two k, stored 16 bytes at a time (wide.store4)."""
    along_k = operand.k_contiguous
    PITCH = ROWS + 8
    UNITS = ROWS * BK // 4
    LOADS = UNITS // THREADS
    if UNITS % THREADS or BK % 8 or ROWS % 16:
        raise ValueError(f"{UNITS} quads of a {ROWS} x {BK} slice do not split over {THREADS} threads")

    @kernel_cache.device
    def unit(e):  # (row, k) of quad e's first element
        if along_k:
            lane, group = e % 32, e // 32
            return (group // (BK // 8)) * 16 + lane % 16, ((group % (BK // 8)) * 2 + lane // 16) * 4
        return (e % (ROWS // 4)) * 4, e // (ROWS // 4)

    @kernel_cache.device
    def rows(array, geometry, codes, i0, I, t):
        for l in range(LOADS):
            r, _ = unit(t + l * THREADS)
            codes[l] = i0 + r if i0 + r < I else -1  # a row-contiguous quad: I is a multiple of four

    @kernel_cache.device
    def load(array, geometry, codes, regs, k0, K, t):
        for l in range(LOADS):
            _, k = unit(t + l * THREADS)
            i, k = codes[l], k0 + k
            v0 = v1 = v2 = v3 = float32(0)
            if i >= 0 and k < K:  # a k-contiguous quad: K is a multiple of four
                if along_k:
                    v0, v1, v2, v3 = load4(array, i, k)
                else:
                    v0, v1, v2, v3 = load4(array, k, i)
            regs[4 * l], regs[4 * l + 1], regs[4 * l + 2], regs[4 * l + 3] = v0, v1, v2, v3

    @kernel_cache.device
    def store(shared, regs, t):
        for l in range(LOADS):
            r, k = unit(t + l * THREADS)
            if along_k:
                for j in range(4):
                    shared[(k + j) * PITCH + r] = regs[4 * l + j]
            else:
                store4(shared, k * PITCH + r, regs[4 * l], regs[4 * l + 1], regs[4 * l + 2], regs[4 * l + 3])

    return rows, load, store, 4 * LOADS, PITCH


def make_tile_product(tile, a_operand, b_operand, wide=(False, False), exact=False):
    """Device function: acc = A[m0:m0+BM, k_begin:k_end] @ B[k_begin:k_end, n0:n0+BN] for this thread's
    outputs (`layout`), by 3xTF32 products (gemm_mma.pipelined_product around this engine's staging and
    slice product). Elements outside (M, N) and [k_begin, k_end) read as zero. `wide` (for A, for B): the
    operand is a stored float32 matrix whose rows wide.aligned_rows passed, staged four elements a load
    (k_begin must then be a multiple of four); the bits are the same either way. `exact`: every operand value
    is one a tf32 holds exactly (16-bit storage), summed by one product a fragment (_make_exact_slice)."""
    BM, BN, WM, WN, FM, FN, THREADS = tile_shape(tile)
    BK = tile[4]
    stage_a = _make_wide_stage if wide[0] else _make_stage
    stage_b = _make_wide_stage if wide[1] else _make_stage
    rows_a, load_a, store_a, A_LOADS, A_PITCH = stage_a(a_operand, BM, BK, THREADS)
    rows_b, load_b, store_b, B_LOADS, B_PITCH = stage_b(b_operand, BN, BK, THREADS)
    prepare_a, prepare_b = a_operand.prepare, b_operand.prepare
    A_WORDS, B_WORDS = BK * A_PITCH, BK * B_PITCH

    slices = tiles.shared_slices(A_WORDS, B_WORDS, float32, 16)

    multiply_slice = make_multiply_slice(FM, FN, BK, (1, A_PITCH), (1, B_PITCH), exact)
    first_reads = make_first_reads((BM, BN, WM, WN), (1, A_PITCH), (1, B_PITCH))

    return gemm_mma.pipelined_product((rows_a, load_a, store_a, A_LOADS), (rows_b, load_b, store_b, B_LOADS),
                                      (prepare_a, prepare_b), slices, multiply_slice, first_reads, BK, float32,
                                      (2 * FM, 2 * FN))


def make_async_tile_product(tile, a_operand, b_operand, stages, early=False):
    """make_tile_product's device function (the same call, layout and bits) for two wide operands (or gemm_async
    `Copied` ones: a convolution's image, im2col_async), their slices copied by cp.async `stages` - 1 ahead into a
    ring (gemm_async; `early` as there): each k-contiguous one kept as [row, k] with a pitch of BK + 4 words (a
    fragment load, 8 rows x 4 k, touches banks 4 row + k: all 32 distinct), a row-contiguous one as [k, row] with a
    pitch of ROWS + 8 (banks 8 k + row), as here."""
    BM, BN, WM, WN, FM, FN, THREADS = tile_shape(tile)
    BK = tile[4]

    def make_slice(a_steps, b_steps):
        return (make_multiply_slice(FM, FN, BK, a_steps, b_steps),
                make_first_reads((BM, BN, WM, WN), a_steps, b_steps))

    return gemm_async.make_ring_product((BM, BN, 2 * FM, 2 * FN, THREADS), BK, (a_operand, b_operand), 4, stages,
                                       make_slice, early)
