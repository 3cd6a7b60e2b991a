"""A dense layer's forward or input gradient summed by more blocks than its output has tiles (CUDA backend).

An MLP's 128 x 512 output is 64 SMALL tiles, about half of an H100's SMs, and each block sums the whole K (784
for the first layer) by itself: a 128 x 784 -> 512 -> 512 -> 10 step's forwards took 20.1 and 14.8 µs and its
512-wide input gradient 16.8, at 4-5 TFLOP/s (benchmarks/step_profile.py --model mlp, H100; benchmarks/NOTES.md,
issue 31 step 1). Given a workspace, a pass of fewer than chunks.SPLIT_BELOW tiles has its summed axis cut into
chunks (chunks.blocks_chunk_plan, as a weight gradient's batch is): block (bx, by, z) writes chunk z's partial
tile (on the pass's engine, gemm.make_linear_rows_partials), then a second launch adds each output's chunks in
chunk order and applies the pass's epilogue (bias and activation, or the activation's derivative), rounding to
the storage format as the one-launch pass does. A fixed plan, read off the shapes alone, and a fixed order: the
same bits on every run.
"""

import functools
import math

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.chunks import SPLIT_BELOW, blocks_chunk_plan
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.tiles import activation_grad_of, squash

SUM_THREADS = 256  # outputs of one row a block of the second launch adds up
ROW_STEP = 32  # every tile's BM is a multiple: a plan changes only at multiples of it
# The tf32x3 tile's chunks may be shorter than the CUDA-core tiles' MIN_CHUNK: its one 64 x 64 tile makes 16
# blocks of a 128 x 512 output, and K = 784 in 256-deep chunks would fill 48 of 132 SMs.
TF32_MIN_CHUNK = 64


def chunk_plan(blocks, summed, min_chunk=None):
    """(chunk, chunks) of a pass of `blocks` tiles summed over `summed`: one chunk (the one-launch pass) where the
    tiles fill SPLIT_BELOW blocks or the sum is too short to cut (chunks.blocks_chunk_plan, `min_chunk` its
    shortest chunk)."""
    if blocks >= SPLIT_BELOW:
        return summed, 1
    chunk, chunks, _ = blocks_chunk_plan(summed, blocks, min_chunk)
    return chunk, chunks


def workspace_for(rows, outputs, chunks_at):
    """float32 elements of workspace a pass of up to `rows` output rows of `outputs` columns needs, its chunks at
    m rows `chunks_at(m)` (0: it never splits). Fewer rows make fewer tiles and never fewer chunks, so the largest
    split batch at or below `rows` sets it: a plan changes only at multiples of ROW_STEP rows, and once a batch
    stops splitting no larger one splits."""
    most, m = 0, 0
    while m < rows:
        m = min(rows, m + ROW_STEP)
        chunks = chunks_at(m)
        if chunks == 1:
            break
        most = max(most, chunks * m * outputs)
    return most


@functools.cache
def make_rows_sum(dtype, backward):
    """Kernel (partials, other, out, activation): each output's chunks added in chunk order, then the epilogue
    of gemm.make_linear_rows's tiles (tiles.make_epilogues), in the same steps: forward out = act(sum + b) (other
    = b), input gradient out = sum * act'(h) (other = h), each rounded to the storage format where they round."""
    load, store = codec(dtype)

    # Block (bx, m): row m's outputs bx*SUM_THREADS:+SUM_THREADS, a thread each (a warp's reads and writes are
    # consecutive). Every output is summed by one thread in a fixed order: no atomics.
    @kernel_cache.jit
    def rows_sum_kernel(partials, other, out, activation):
        chunks, _, N = partials.shape
        n = cuda.blockIdx.x * SUM_THREADS + cuda.threadIdx.x
        if n >= N:
            return
        r, c = uint64(cuda.blockIdx.y), uint64(n)
        total = float32(0)
        for z in range(chunks):
            total += partials[uint64(z), r, c]
        if backward:
            stored = store(total)
            if activation != NONE:
                stored = store(load(stored) * activation_grad_of(load(other[r, c]), activation))
        else:
            value = total + load(other[c])
            if activation == RELU and value < float32(0):  # NaN stays NaN, as in np.maximum
                value = float32(0)
            stored = store(value)
            if activation == TANH or activation == SIGMOID:
                stored = store(squash(load(stored), activation))
        out[r, c] = stored

    return rows_sum_kernel


def split_rows_pass(partials_kernel, grid, threads, a, w, other, out, activation, backward, workspace, chunk,
                    chunks):
    """A pass of gemm._rows_pass (forward: other = b; `backward`, the input gradient: other = h) in `chunks` chunks
    of `chunk` of a's columns: `partials_kernel` (a, w, partials, chunk) writes their partial tiles into
    `workspace` (float32, at least chunks x M x N elements) on (*grid, chunks) blocks of `threads`, then
    rows_sum_kernel adds them."""
    M, N = tuple(out.shape)
    if workspace.shape[0] < chunks * M * N:  # as the weight gradient's: never a silent slower path
        raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * M * N} "
                         "(linear_rows_workspace(rows, summed, outputs))")
    partials = workspace[:chunks * M * N].reshape(chunks, M, N)
    stream = streams.current()
    partials_kernel[(*grid, chunks), threads, stream](a, w, partials, chunk)
    make_rows_sum(a.dtype, backward)[(math.ceil(N / SUM_THREADS), M), SUM_THREADS, stream](
        partials, other, out, activation)
