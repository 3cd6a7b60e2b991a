"""Tile products whose operands cp.async copies into a ring of slices in shared memory (CUDA backend): the ring and
the copies, shared by the tensor-core engines, around each engine's own product of a slice (gemm_tf32's 3xTF32
for float32 operands, gemm_mma's m16n8k16 for 16-bit ones).

Staged through registers, a slice's loads are waited for before they can be stored: with one slice in flight,
their latency outlasts a slice's products, and the SMs wait (24 TFLOP/s for 16 lanes' tf32x3 GEMMs;
benchmarks/NOTES.md, issue 30 step 13). Here each thread issues 16-byte copies of the slice STAGES - 1 ahead
(async_copy.copy16_to) straight into a ring of STAGES buffers, so several slices' loads overlap the products. The
copies cannot transpose, so an operand keeps its memory layout in shared memory, in elements of its storage: a
k-contiguous one as [row, k] with a pitch of BK + 16 / size elements, a row-contiguous one as [k, row] with a pitch
of ROWS + 8 (size: its elements' bytes; each engine's slice product reads them without bank conflicts there).

An operand is a stored matrix whose rows wide.copyable_rows passed (every copy 16 aligned bytes, a row whole
copies), or a `Copied` that brings its own copies (im2col_async: a convolution's image read as its column matrix);
a copy past the matrix is zero-filled, so elements outside (M, N) and [k_begin, k_end) read as zero.
"""

from typing import NamedTuple

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int32, int64, uint32, uint64
from mlptrain.backends.numba_kernels import tiles
from mlptrain.backends.numba_kernels.async_copy import commit, copy16_to, shared_address, wait_all_but

COPY_BYTES = 16


class Copied(NamedTuple):
    """An operand that is not a stored matrix: `k_contiguous` as tiles.Operand's, and `make_copy(ROWS, BK, THREADS,
    size)` -> (plan, copy, COPIES), the same calls as a stored matrix's (_make_copy), its pieces 16 bytes along the
    contiguous axis."""

    k_contiguous: bool
    make_copy: object


def shared_layout(operand, ROWS, BK, size):
    """(ROW, K, ELEMENTS): the element steps of one row and one k of an operand's slice in shared memory, and its
    elements, for elements of `size` bytes."""
    if operand.k_contiguous:
        return BK + COPY_BYTES // size, 1, ROWS * (BK + COPY_BYTES // size)
    return 1, ROWS + 8, BK * (ROWS + 8)


def _make_copy(operand, ROWS, BK, THREADS, size):
    """(plan, copy, COPIES): thread t's copies of a BK x ROWS slice of the operand into a ring of buffers in shared
    memory, a piece (PER = 16 / size elements along its contiguous axis) a copy, COPIES a thread; pieces past I or
    K zero-filled.

        plan(array, shared, i0, I, k_begin, K, t, offsets, ks, addresses, extra)
                once a tile (rows i0.., k from k_begin): copy c's piece in the first slice is `offsets[c]` bytes
                into the array and goes to `addresses[c]` (async_copy.shared_address) in the ring's first buffer;
                `ks[c]`: its k, or K where its row is past I; `extra` (int32, a copy each) is unused here
        copy(shared, buffer, array, offsets, ks, addresses, extra, s, K)
                slice s of the tile into the ring's buffer `buffer`

    The addresses are worked out once a tile, and a slice's copy adds s slices' bytes to the array's and the
    buffer's bytes to the ring's: numba's indexing took ~27 instructions a copy in the slice loop's SASS
    (benchmarks/NOTES.md, issue 30 step 15)."""
    along_k = operand.k_contiguous
    PER = COPY_BYTES // size
    ROW, K_STEP, ELEMENTS = shared_layout(operand, ROWS, BK, size)
    WORD = 4 // size  # elements a shared word (the ring's words are 4 bytes)
    PIECES = ROWS * BK // PER
    COPIES = PIECES // THREADS
    if PIECES % THREADS or BK % PER or ROWS % PER:
        raise ValueError(f"{PIECES} pieces of a {ROWS} x {BK} slice do not split over {THREADS} threads")

    @kernel_cache.device
    def plan(array, shared, i0, I, k_begin, K, t, offsets, ks, addresses, extra):
        row_step, k_step = (array.strides[0], array.strides[1]) if along_k else (array.strides[1], array.strides[0])
        for c in range(COPIES):
            e = t + c * THREADS
            if along_k:  # a row's BK / PER pieces side by side: its bytes in order
                r, k = e // (BK // PER), (e % (BK // PER)) * PER
                addresses[c] = shared_address(shared, (r * ROW + k) // WORD)
            else:
                r, k = (e % (ROWS // PER)) * PER, e // (ROWS // PER)
                addresses[c] = shared_address(shared, (k * K_STEP + r) // WORD)
            offsets[c] = (i0 + r) * row_step + (k_begin + k) * k_step
            # I a multiple of PER for a row-contiguous operand: a piece is whole or past the end
            ks[c] = k_begin + k if i0 + r < I else K

    @kernel_cache.device
    def copy(shared, buffer, array, offsets, ks, addresses, extra, s, K):
        step = s * (BK * (array.strides[1] if along_k else array.strides[0]))
        k0, there = int32(s * BK), uint32(buffer * (ELEMENTS * size))
        for c in range(COPIES):
            valid = int32(ks[c] + k0) < K  # K a multiple of PER: a piece is whole or past the end
            # a piece not read takes the array's first (cp.async reads none of its bytes; an address inside the
            # array all the same, as cp.async's specification does not promise that one outside it is never used)
            copy16_to(uint32(addresses[c] + there), shared, array, offsets[c] + step if valid else int64(0), valid)

    return plan, copy, COPIES


def _copies(operand, ROWS, BK, THREADS, size):
    """(plan, copy, COPIES) of an operand: a Copied's own, else a stored matrix's."""
    if isinstance(operand, Copied):
        return operand.make_copy(ROWS, BK, THREADS, size)
    return _make_copy(operand, ROWS, BK, THREADS, size)


def make_ring_product(shape, BK, operands, size, stages, make_slice, early=False):
    """Device function: acc = A[m0:m0+BM, k_begin:k_end] @ B[k_begin:k_end, n0:n0+BN] for this thread's outputs,
    the tile product's (a, b, acc, m0, n0, M, N, k_begin, k_end) call; always True (every thread holds complete
    sums). `shape`: (BM, BN, accumulator rows, accumulator columns, threads); `operands`: (A's, B's), each stored
    in elements of `size` bytes; `make_slice(a_steps, b_steps)` -> (multiply_slice, first_reads), the engine's
    product of one BK-deep slice, `multiply_slice(As, Bs, a_first, b_first, acc)`, and `first_reads(thread)` (a
    thread's first reads of a slice in the ring's first buffer), given each operand's (row, k) steps in shared
    memory, in elements. Slices are copied `stages` - 1 ahead; k_begin must be a multiple of 16 / size. `early`:
    each slice's copies are issued before the products of the slice ahead of them, not after (the buffer they fill
    is free once the barrier has passed), so that a ring of two still overlaps a slice's copies with products."""
    BM, BN, ROWS, COLUMNS, THREADS = shape
    a_operand, b_operand = operands
    if stages < 2:
        raise ValueError(f"a ring of {stages} slices: at least 2")
    A_ROW, A_K, A_ELEMENTS = shared_layout(a_operand, BM, BK, size)
    B_ROW, B_K, B_ELEMENTS = shared_layout(b_operand, BN, BK, size)
    plan_a, copy_a, A_COPIES = _copies(a_operand, BM, BK, THREADS, size)
    plan_b, copy_b, B_COPIES = _copies(b_operand, BN, BK, THREADS, size)
    A_WORDS, B_WORDS = A_ELEMENTS * size // 4, B_ELEMENTS * size // 4
    wait = wait_all_but(stages - 2)
    slices = tiles.shared_slices(stages * A_WORDS, stages * B_WORDS, float32 if size == 4 else uint32, 16)
    multiply_slice, first_reads = make_slice((A_ROW, A_K), (B_ROW, B_K))

    @kernel_cache.device
    def tile_product(a, b, acc, m0, n0, M, N, k_begin, k_end):
        As, Bs = slices()
        t = cuda.threadIdx.x
        a_first, b_first = first_reads(t)
        for i in range(ROWS):
            for j in range(COLUMNS):
                acc[i, j] = float32(0)
        count = int32((k_end - k_begin + BK - 1) // BK)
        a_offsets, b_offsets = cuda.local.array(A_COPIES, int64), cuda.local.array(B_COPIES, int64)
        a_ks, b_ks = cuda.local.array(A_COPIES, int32), cuda.local.array(B_COPIES, int32)
        a_addresses, b_addresses = cuda.local.array(A_COPIES, uint32), cuda.local.array(B_COPIES, uint32)
        a_extra, b_extra = cuda.local.array(A_COPIES, int32), cuda.local.array(B_COPIES, int32)
        K = int32(k_end)
        plan_a(a, As, m0, M, k_begin, K, t, a_offsets, a_ks, a_addresses, a_extra)
        plan_b(b, Bs, n0, N, k_begin, K, t, b_offsets, b_ks, b_addresses, b_extra)
        for s in range(stages - 1):  # the ring's first slices; a group for each, empty past the last
            if s < count:
                copy_a(As, s, a, a_offsets, a_ks, a_addresses, a_extra, s, K)
                copy_b(Bs, s, b, b_offsets, b_ks, b_addresses, b_extra, s, K)
            commit()
        here, there = int32(0), int32(stages - 1)  # the buffers of slice s and of slice s + stages - 1
        for s in range(count):
            wait()  # this thread's copies of slice s are in
            cuda.syncthreads()  # everyone's are, and everyone is done with slice s - 1's buffer
            ahead = s + stages - 1
            if early and ahead < count:  # into the buffer slice s - 1 left (a constant of the closure)
                copy_a(As, there, a, a_offsets, a_ks, a_addresses, a_extra, ahead, K)
                copy_b(Bs, there, b, b_offsets, b_ks, b_addresses, b_extra, ahead, K)
            multiply_slice(As, Bs, a_first + uint64(here * A_WORDS), b_first + uint64(here * B_WORDS), acc)
            if not early and ahead < count:
                copy_a(As, there, a, a_offsets, a_ks, a_addresses, a_extra, ahead, K)
                copy_b(Bs, there, b, b_offsets, b_ks, b_addresses, b_extra, ahead, K)
            commit()
            here = int32(here + 1) if here < int32(stages - 1) else int32(0)
            there = int32(there + 1) if there < int32(stages - 1) else int32(0)
        return True

    return tile_product
