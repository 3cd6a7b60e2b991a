"""Tile products on tensor cores for 16-bit operands (CUDA backend).

The mixed-precision twin of gemm's tile product: the same `Operand`s (a
stored matrix, or a convolution's im2col read on the fly), the same
(a, b, acc, m0, n0, M, N, k_begin, k_end) call and the same epilogues, but
the products run as tensor_core.mma instructions on bf16 / fp16 inputs with
float32 accumulators. CUDA-core FMAs had topped out at 21-22 TFLOP/s in the
autoencoder's convolutions, in every precision.

A tile is (BM, BN, WM, WN): a block of WM x WN warps computes a BM x BN tile
of the output, each warp a (BM / WM) x (BN / WN) part of it in 16 x 8
fragments. K advances in slices of BK = 32. Both operands are staged in
shared memory as [row, k pair]: one uint32 holds the 16-bit values of k and
k + 1 of one row, which is what an mma fragment register holds, so each
fragment register is one 4-byte shared load. The row pitch of BK / 2 + 4
words puts the 8 rows x 4 k pairs a fragment load touches on 32 distinct
banks.

An operand supplies its elements as raw bits (uint32): a k-contiguous one
(`k_contiguous`) as *pairs*, read from the array viewed as uint32 (its K must
be even), a k-strided one as single 16-bit values, two of which a thread
packs. Each warp loads a k-contiguous slice along k (16 threads a row) and a
k-strided one as 8 adjacent rows x 4 k pairs (stores on distinct banks).

`make_async_tile_product` is the same product for two stored matrices whose
rows are whole 16-byte copies (a dense layer's, the mma16 engine): their
slices copied by cp.async several slices ahead into gemm_async's ring, each
kept in its memory layout, a row-contiguous operand's pair of k read as two
halves there; the same mma sequence, so the same bits.

Every output is summed by one warp in a fixed order (the mma sequence over
k), with no atomics, so results are bitwise reproducible on one GPU model.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int64, uint32, uint64
from mlptrain.backends.numba_kernels import gemm_async, tiles
from mlptrain.backends.numba_kernels.async_copy import shared_address
from mlptrain.backends.numba_kernels.codecs import half_bits
from mlptrain.backends.numba_kernels.ldmatrix import ldmatrix4
from mlptrain.backends.numba_kernels.tensor_core import mma

BK = 32  # k a slice: two m16n8k16 steps
PAIRS = BK // 2
PITCH = PAIRS + 4  # uint32 words a staged row


@kernel_cache.device
def bits(v):
    """A stored 16-bit value (or a uint32 pair of them) as uint32 bits."""
    return uint32(v)


@kernel_cache.device
def bits_zero():
    return uint32(0)


def storage_bits(dtype):
    """The device function giving a stored 16-bit element's bits as uint32: bf16 lives in uint16 already, an fp16
    value's bits are reinterpreted."""
    return half_bits if str(dtype) == "float16" else bits


def _tile_shape(tile):
    BM, BN, WM, WN = tile
    if BM % (16 * WM) or BN % (8 * WN) or BM % 8 or BN % 8:
        raise ValueError(f"tile {tile}: warps must cover 16 x 8 fragments")
    return BM, BN, WM, WN, BM // WM // 16, BN // WN // 8, 32 * WM * WN


def threads(tile):
    return _tile_shape(tile)[6]


def _make_stage(operand, ROWS, THREADS):
    """(rows, load, store, loads): a block's share of one BK x ROWS slice of an operand. Unit e of
    the ROWS x PAIRS units is (row, k pair) `unit(e)`; thread t takes units t, t + THREADS, ...: the
    codes of their rows once per tile, their bits into registers once per slice, then to shared
    memory at row * PITCH + pair."""
    _, row, column, fetch, along_k = operand
    UNITS = ROWS * PAIRS
    LOADS = UNITS // THREADS
    if UNITS % THREADS:
        raise ValueError(f"{UNITS} units of a slice do not split over {THREADS} threads")

    @kernel_cache.device
    def unit(e):
        if along_k:
            return e // PAIRS, e % PAIRS
        return (e // (8 * PAIRS)) * 8 + e % 8, (e // 8) % PAIRS

    @kernel_cache.device
    def rows(array, geometry, codes, i0, I, t):
        for l in range(LOADS):
            r, _ = unit(t + l * THREADS)
            codes[l] = row(array, geometry, i0 + r, I)

    @kernel_cache.device
    def load(array, geometry, codes, regs, k0, K, t):
        for l in range(LOADS):
            _, p = unit(t + l * THREADS)
            k = k0 + 2 * p
            if along_k:  # the array holds pairs: pair k / 2 of K / 2
                regs[l] = fetch(array, geometry, codes[l], column(array, geometry, k >> 1, K >> 1))
            else:
                low = fetch(array, geometry, codes[l], column(array, geometry, k, K))
                high = fetch(array, geometry, codes[l], column(array, geometry, k + 1, K))
                regs[l] = low | (high << uint32(16))

    @kernel_cache.device
    def store(shared, regs, t):
        for l in range(LOADS):
            r, p = unit(t + l * THREADS)
            shared[r * PITCH + p] = regs[l]

    return rows, load, store, LOADS


def layout(tile):
    """The tiles.Layout of make_tile_product's threads: acc[2 i + h, 2 j + c] is fragment (i, j)'s
    register 2 h + c, output row (warp's first) + 16 i + 8 h + lane // 4, column (warp's first) +
    8 j + 2 (lane % 4) + c."""
    BM, BN, WM, WN, FM, FN, _ = _tile_shape(tile)

    @kernel_cache.device
    def row_of(m0, i):
        warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        return m0 + (warp // WN) * (BM // WM) + 16 * (i >> 1) + 8 * (i & 1) + lane // 4

    @kernel_cache.device
    def col_of(n0, j):
        warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        return n0 + (warp % WN) * (BN // WN) + 8 * (j >> 1) + 2 * (lane % 4) + (j & 1)

    return tiles.Layout(2 * FM, 2 * FN, row_of, col_of)


def _make_fragment_products(FM, FN, kind):
    """Device function (a, b, acc): acc += one k16 step's products of a warp's FM x FN fragments from their registers,
    a (FM, 4) and b (FN, 2), fragment i then j: the order of both stagings' slices, so their bits."""
    product = mma(kind)

    @kernel_cache.device
    def fragment_products(a, b, acc):
        for i in range(FM):
            for j in range(FN):
                (acc[2 * i, 2 * j], acc[2 * i, 2 * j + 1],
                 acc[2 * i + 1, 2 * j], acc[2 * i + 1, 2 * j + 1]) = product(
                    a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[j, 0], b[j, 1],
                    acc[2 * i, 2 * j], acc[2 * i, 2 * j + 1], acc[2 * i + 1, 2 * j], acc[2 * i + 1, 2 * j + 1])

    return fragment_products


def make_tile_product(tile, a_operand, b_operand, kind):
    """Device function: acc = A[m0:m0+BM, k_begin:k_end] @ B[k_begin:k_end, n0:n0+BN] for this
    thread's outputs (see `layout`), on tensor cores for 16-bit inputs of `kind`; always True (every
    thread holds complete sums). Elements outside (M, N) and [k_begin, k_end) read as zero; k_begin
    must be even. The next slice is fetched into registers while the current one is multiplied."""
    BM, BN, WM, WN, FM, FN, THREADS = _tile_shape(tile)
    rows_a, load_a, store_a, A_LOADS = _make_stage(a_operand, BM, THREADS)
    rows_b, load_b, store_b, B_LOADS = _make_stage(b_operand, BN, THREADS)
    prepare_a, prepare_b = a_operand.prepare, b_operand.prepare
    fragment_products = _make_fragment_products(FM, FN, kind)
    ROW_STEP = 8 * PITCH  # a fragment's rows g and g + 8
    A_WORDS, B_WORDS = BM * PITCH, BN * PITCH

    slices = tiles.shared_slices(A_WORDS, B_WORDS, uint32, 16)

    @kernel_cache.device
    def multiply_slice(As, Bs, a_first, b_first, acc):
        a = cuda.local.array((FM, 4), uint32)
        b = cuda.local.array((FN, 2), uint32)
        for s in range(0, PAIRS, 8):  # the slice's two k16 steps
            for i in range(FM):
                p = a_first + uint64(16 * i * PITCH + s)
                a[i, 0], a[i, 1] = As[p], As[p + uint64(ROW_STEP)]
                a[i, 2], a[i, 3] = As[p + uint64(4)], As[p + uint64(ROW_STEP + 4)]
            for j in range(FN):
                p = b_first + uint64(8 * j * PITCH + s)
                b[j, 0], b[j, 1] = Bs[p], Bs[p + uint64(4)]
            fragment_products(a, b, acc)

    @kernel_cache.device
    def first_reads(t):
        warp, lane = t // 32, t % 32
        return (uint64(((warp // WN) * (BM // WM) + lane // 4) * PITCH + lane % 4),
                uint64(((warp % WN) * (BN // WN) + lane // 4) * PITCH + lane % 4))

    return pipelined_product((rows_a, load_a, store_a, A_LOADS), (rows_b, load_b, store_b, B_LOADS),
                             (prepare_a, prepare_b), slices, multiply_slice, first_reads, BK, uint32,
                             (2 * FM, 2 * FN))


def pipelined_product(stage_a, stage_b, prepares, slices, multiply_slice, first_reads, BK, register,
                      accumulators):
    """The tile product of both tensor-core engines (this module's and gemm_tf32's), around their own pieces:
    each operand's stage (rows, load, store, loads: its codes once per tile, a slice's elements into
    `register`-typed registers, then to shared memory), its `prepare`, the `slices()` in shared memory,
    `multiply_slice(As, Bs, a_first, b_first, acc)` and `first_reads(thread)` (a thread's first shared reads
    of each slice). acc (`accumulators` rows x columns) starts at zero; the next slice is fetched into
    registers while the current one is multiplied; always True (every thread holds complete sums)."""
    rows_a, load_a, store_a, A_LOADS = stage_a
    rows_b, load_b, store_b, B_LOADS = stage_b
    prepare_a, prepare_b = prepares
    ROWS, COLUMNS = accumulators

    @kernel_cache.device
    def tile_product(a, b, acc, m0, n0, M, N, k_begin, k_end):
        As, Bs = slices()
        a_regs = cuda.local.array(A_LOADS, register)
        b_regs = cuda.local.array(B_LOADS, register)
        a_codes = cuda.local.array(A_LOADS, int64)
        b_codes = cuda.local.array(B_LOADS, int64)
        ga, gb = prepare_a(a), prepare_b(b)
        t = cuda.threadIdx.x
        a_first, b_first = first_reads(t)
        for i in range(ROWS):
            for j in range(COLUMNS):
                acc[i, j] = float32(0)
        rows_a(a, ga, a_codes, m0, M, t)
        rows_b(b, gb, b_codes, n0, N, t)
        load_a(a, ga, a_codes, a_regs, k_begin, k_end, t)
        load_b(b, gb, b_codes, b_regs, k_begin, k_end, t)
        for k0 in range(k_begin, k_end, BK):
            store_a(As, a_regs, t)
            store_b(Bs, b_regs, t)
            cuda.syncthreads()
            if k0 + BK < k_end:
                load_a(a, ga, a_codes, a_regs, k0 + BK, k_end, t)
                load_b(b, gb, b_codes, b_regs, k0 + BK, k_end, t)
            multiply_slice(As, Bs, a_first, b_first, acc)
            cuda.syncthreads()
        return True

    return tile_product


def _make_pair(steps):
    """Device function (S, at, shift): the uint32 an mma fragment register holds, elements (row, k) and (row, k + 1)
    of an operand's slice in the ring's 4-byte words S, for an operand whose (row, k) steps are `steps` 16-bit
    elements (gemm_async.shared_layout) and whose element (row, k) is in word `at`. A k-contiguous operand's pair is
    that word; a row-contiguous one's two halves are `shift` (16 where row is odd, else 0) into the words of k and
    k + 1, half a k step apart."""
    ROW, K = steps
    if K == 1:
        @kernel_cache.device
        def pair(S, at, shift):
            return S[at]
    else:
        HALF_K = K // 2

        @kernel_cache.device
        def pair(S, at, shift):
            low = (S[at] >> shift) & uint32(0xFFFF)
            high = (S[at + uint64(HALF_K)] >> shift) & uint32(0xFFFF)
            return low | (high << uint32(16))

    return pair


def _make_async_slice(shape, kind, a_steps, b_steps):
    """(multiply_slice, first_reads) of a BK-deep slice in a gemm_async ring for a tile of (BM, BN, WM, WN, FM, FN)
    = `shape`: the register path's products in its order (k16 steps ascending, fragments i then j), so its bits.
    Thread (g = lane // 4, t = lane % 4) reads row g (+ 8) of each fragment at k 2t (+ 8); its first word is
    (first row * ROW + 2t * K) / 2, and every other read is a constant number of words on."""
    BM, BN, WM, WN, FM, FN = shape
    A_ROW, A_K = a_steps
    B_ROW, B_K = b_steps
    pair_a, pair_b = _make_pair(a_steps), _make_pair(b_steps)
    fragment_products = _make_fragment_products(FM, FN, kind)

    @kernel_cache.device
    def multiply_slice(As, Bs, a_first, b_first, acc):
        # a warp's rows start at a multiple of 8, so row g's parity is g's, every fragment's
        shift = uint32((((cuda.threadIdx.x % 32) // 4) & 1) * 16)
        a = cuda.local.array((FM, 4), uint32)
        b = cuda.local.array((FN, 2), uint32)
        for s in range(0, BK, 16):
            for i in range(FM):
                for r in range(4):  # A[g, 2t], A[g + 8, 2t], A[g, 2t + 8], A[g + 8, 2t + 8] and each k + 1
                    at = a_first + uint64(((16 * i + 8 * (r & 1)) * A_ROW + (s + 8 * (r >> 1)) * A_K) // 2)
                    a[i, r] = pair_a(As, at, shift)
            for j in range(FN):
                for r in range(2):  # B[2t, g], B[2t + 8, g] and each k + 1
                    b[j, r] = pair_b(Bs, b_first + uint64((8 * j * B_ROW + (s + 8 * r) * B_K) // 2), shift)
            fragment_products(a, b, acc)

    @kernel_cache.device
    def first_reads(t):
        warp, lane = t // 32, t % 32
        a_row = (warp // WN) * (BM // WM) + lane // 4
        b_row = (warp % WN) * (BN // WN) + lane // 4
        return (uint64((a_row * A_ROW + 2 * (lane % 4) * A_K) // 2),
                uint64((b_row * B_ROW + 2 * (lane % 4) * B_K) // 2))

    return multiply_slice, first_reads


def _make_ldmatrix_slice(shape, kind, a_steps, b_steps):
    """_make_async_slice's (multiply_slice, first_reads) with each operand's fragment registers loaded four at a time
    by ldmatrix (transposed from a row-contiguous operand's [k, row]): the same registers in the same order, so the
    same bits. A fragment's four 8 x 8 matrices are (rows, k) halves q & 1 and q >> 1; two adjacent B fragments'
    are (k, columns) halves q & 1 and q >> 1. Lane 8q + r gives row r of matrix q: its first word (`first_reads`) is
    that row's in the first fragment's first k16 step, and every other is a constant number of words on."""
    BM, BN, WM, WN, FM, FN = shape
    A_ROW, A_K = a_steps
    B_ROW, B_K = b_steps
    if FN % 2:
        raise ValueError(f"{FN} fragments a warp across: ldmatrix loads B's two at a time")
    load_a, load_b = ldmatrix4(A_K != 1), ldmatrix4(B_K != 1)
    fragment_products = _make_fragment_products(FM, FN, kind)

    @kernel_cache.device
    def multiply_slice(As, Bs, a_first, b_first, acc):
        a_base, b_base = shared_address(As, 0), shared_address(Bs, 0)
        a = cuda.local.array((FM, 4), uint32)
        b = cuda.local.array((FN, 2), uint32)
        for s in range(0, BK, 16):
            for i in range(FM):
                at = a_first + uint64((16 * i * A_ROW + s * A_K) // 2)
                a[i, 0], a[i, 1], a[i, 2], a[i, 3] = load_a(As, uint32(a_base + uint32(4 * at)))
            for j in range(0, FN, 2):
                at = b_first + uint64((8 * j * B_ROW + s * B_K) // 2)
                b[j, 0], b[j, 1], b[j + 1, 0], b[j + 1, 1] = load_b(Bs, uint32(b_base + uint32(4 * at)))
            fragment_products(a, b, acc)

    @kernel_cache.device
    def first_reads(t):
        warp, lane = t // 32, t % 32
        q, r = lane // 8, lane % 8
        # a matrix's rows are the operand's rows where it is k-contiguous, its k where it is row-contiguous
        a_row, a_k = (8 * (q & 1) + r, 8 * (q >> 1)) if A_K == 1 else (8 * (q & 1), 8 * (q >> 1) + r)
        b_row, b_k = (8 * (q >> 1) + r, 8 * (q & 1)) if B_K == 1 else (8 * (q >> 1), 8 * (q & 1) + r)
        a_row += (warp // WN) * (BM // WM)
        b_row += (warp % WN) * (BN // WN)
        return uint64((a_row * A_ROW + a_k * A_K) // 2), uint64((b_row * B_ROW + b_k * B_K) // 2)

    return multiply_slice, first_reads


def make_async_tile_product(tile, a_operand, b_operand, kind, stages, early=False, ldmatrix=False):
    """make_tile_product's device function (the same call, layout and bits) for two stored 16-bit matrices whose
    rows wide.copyable_rows passed, or gemm_async `Copied` operands (a convolution's image, im2col_async), their
    BK-deep slices copied by cp.async `stages` - 1 ahead into a ring (gemm_async; `early` as there): no registers
    and no barrier a slice for the staging, and k_begin a multiple of 8. `ldmatrix`: the fragments read from the
    ring four registers an instruction (_make_ldmatrix_slice), the same bits."""
    BM, BN, WM, WN, FM, FN, THREADS = _tile_shape(tile)

    def make_slice(a_steps, b_steps):
        return (_make_ldmatrix_slice if ldmatrix else _make_async_slice)((BM, BN, WM, WN, FM, FN), kind, a_steps,
                                                                          b_steps)

    return gemm_async.make_ring_product((BM, BN, 2 * FM, 2 * FN, THREADS), BK, (a_operand, b_operand), 2, stages,
                                        make_slice, early)
