"""The tf32x3 tile product with its operands copied to shared memory by cp.async, STAGES slices in flight (CUDA
backend): gemm_tf32's arithmetic, in its order, without the registers and the barrier a slice of its staging.

gemm_tf32 stages a slice through registers, one slice ahead: its loads' latency outlasts a 16-deep slice's
products, and the SMs wait (24 TFLOP/s for 16 lanes' GEMMs; benchmarks/NOTES.md, issue 30 step 13). Here each
thread issues 16-byte copies of the slice STAGES - 1 ahead (async_copy.copy16) straight into a ring of STAGES
buffers, so several slices' loads overlap the products. The copies cannot transpose, so an operand keeps its
memory layout in shared memory: a k-contiguous one as [row, k] with a pitch of BK + 4 words (a fragment load, 8
rows x 4 k, touches banks 4 row + k: all 32 distinct), a row-contiguous one as [k, row] with a pitch of ROWS + 8
(banks 8 k + row), as in gemm_tf32.

Both operands must be stored float32 matrices whose rows wide.aligned_rows passed (every copy 16 aligned bytes;
a quad past the matrix is zero-filled). Every product and its order are gemm_tf32's (the same mma sequence a
fragment, k ascending), so the bits are its bits.
"""

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import tiles
from mlptrain.backends.numba_kernels.async_copy import commit, copy16, wait_all_but
from mlptrain.backends.numba_kernels.gemm_tf32 import make_multiply_slice, tile_shape


def _shared_layout(operand, ROWS, BK):
    """(ROW, K, WORDS): the word steps of one row and one k of an operand's slice in shared memory, and its
    words."""
    if operand.k_contiguous:
        return BK + 4, 1, ROWS * (BK + 4)
    return 1, ROWS + 8, BK * (ROWS + 8)


def _make_copy(operand, ROWS, BK, THREADS):
    """Device function (shared, base, array, i0, I, k0, K, t): thread t's copies of one BK x ROWS slice of the
    operand (rows i0.., k k0..) into shared memory from word `base`, a quad (four elements along its contiguous
    axis) a copy; quads past I or K zero-filled."""
    along_k = operand.k_contiguous
    ROW, K_STEP, _ = _shared_layout(operand, ROWS, BK)
    QUADS = ROWS * BK // 4
    COPIES = QUADS // THREADS
    if QUADS % THREADS:
        raise ValueError(f"{QUADS} quads of a {ROWS} x {BK} slice do not split over {THREADS} threads")

    @kernel_cache.device
    def copy(shared, base, array, i0, I, k0, K, t):
        for c in range(COPIES):
            e = t + c * THREADS
            if along_k:  # a row's BK / 4 quads side by side: its bytes in order
                r, k = e // (BK // 4), (e % (BK // 4)) * 4
                valid = i0 + r < I and k0 + k < K  # K a multiple of four: a quad is whole or past the end
                copy16(shared, base + r * ROW + k, array, i0 + r if valid else 0, k0 + k if valid else 0, valid)
            else:
                r, k = (e % (ROWS // 4)) * 4, e // (ROWS // 4)
                valid = i0 + r < I and k0 + k < K  # I a multiple of four
                copy16(shared, base + k * K_STEP + r, array, k0 + k if valid else 0, i0 + r if valid else 0, valid)

    return copy


def make_tile_product(tile, a_operand, b_operand, stages):
    """gemm_tf32.make_tile_product's device function (the same call, layout and bits) for two wide operands, their
    slices copied `stages` - 1 ahead."""
    BM, BN, WM, WN, FM, FN, THREADS = tile_shape(tile)
    BK = tile[4]
    if stages < 2:
        raise ValueError(f"a ring of {stages} slices: at least 2")
    A_ROW, A_K, A_WORDS = _shared_layout(a_operand, BM, BK)
    B_ROW, B_K, B_WORDS = _shared_layout(b_operand, BN, BK)
    copy_a, copy_b = _make_copy(a_operand, BM, BK, THREADS), _make_copy(b_operand, BN, BK, THREADS)
    wait = wait_all_but(stages - 2)
    slices = tiles.shared_slices(stages * A_WORDS, stages * B_WORDS, float32, 16)

    multiply_slice = make_multiply_slice(FM, FN, BK, (A_ROW, A_K), (B_ROW, B_K))

    @kernel_cache.device
    def tile_product(a, b, acc, m0, n0, M, N, k_begin, k_end):
        As, Bs = slices()
        t = cuda.threadIdx.x
        warp, lane = t // 32, t % 32
        a_first = uint64(((warp // WN) * (BM // WM) + lane // 4) * A_ROW + (lane % 4) * A_K)
        b_first = uint64(((warp % WN) * (BN // WN) + lane // 4) * B_ROW + (lane % 4) * B_K)
        for i in range(2 * FM):
            for j in range(2 * FN):
                acc[i, j] = float32(0)
        count = (k_end - k_begin + BK - 1) // BK
        for s in range(stages - 1):  # the ring's first slices; a group for each, empty past the last
            if s < count:
                copy_a(As, s * A_WORDS, a, m0, M, k_begin + s * BK, k_end, t)
                copy_b(Bs, s * B_WORDS, b, n0, N, k_begin + s * BK, k_end, t)
            commit()
        for s in range(count):
            wait()  # this thread's copies of slice s are in
            cuda.syncthreads()  # everyone's are, and everyone is done with slice s - 1's buffer
            here = s % stages
            multiply_slice(As, Bs, a_first + uint64(here * A_WORDS), b_first + uint64(here * B_WORDS), acc)
            ahead = s + stages - 1
            if ahead < count:  # into the buffer slice s - 1 left
                there = ahead % stages
                copy_a(As, there * A_WORDS, a, m0, M, k_begin + ahead * BK, k_end, t)
                copy_b(Bs, there * B_WORDS, b, n0, N, k_begin + ahead * BK, k_end, t)
            commit()
        return True

    return tile_product
