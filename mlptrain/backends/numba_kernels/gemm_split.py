"""A dense layer's forward or input gradient summed by more blocks than its output has tiles (CUDA backend).

An MLP's 128 x 512 output is 64 SMALL tiles, about half of an H100's SMs, and each block sums the whole K (784
for the first layer) by itself: a 128 x 784 -> 512 -> 512 -> 10 step's forwards took 20.1 and 14.8 µs and its
512-wide input gradient 16.8, at 4-5 TFLOP/s (benchmarks/step_profile.py --model mlp, H100; benchmarks/NOTES.md,
issue 31 step 1). Given a workspace, a pass of fewer than chunks.SPLIT_BELOW tiles has its summed axis cut into
chunks (chunks.blocks_chunk_plan, as a weight gradient's batch is): block (bx, by, z) writes chunk z's partial
tile (on the pass's engine, make_chunk_partials), then a second launch adds each output's chunks in
chunk order and applies the pass's epilogue (bias and activation, or the activation's derivative), rounding to
the storage format as the one-launch pass does. A weight gradient of few tiles cuts its batch the same way
(weight_chunks; chunks.add_chunks adds them). A fixed plan, read off the shapes alone, and a fixed order: the
same bits on every run.
"""

import functools
import math

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import gemm_engines, streams
from mlptrain.backends.numba_kernels.chunks import SPLIT_BELOW, blocks_chunk_plan, make_weight_partials
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.tiles import activation_grad_of, dense_operand, squash

SUM_THREADS = 256  # outputs of one row a block of the second launch adds up
ROW_STEP = 32  # every tile's BM is a multiple: a plan changes only at multiples of it


def rows_split(engine, M, summed, N):
    """(tile, grid, threads, chunk, chunks) of a run's own forward or input gradient of M x N outputs on `engine`
    ("fma" or "tf32x3") summed over `summed`: its K in chunks (chunks.blocks_chunk_plan, the engine's shortest
    chunk) where its tiles are fewer than SPLIT_BELOW, else in one (the one-launch pass)."""
    tile, grid, threads = gemm_engines.engine_launch(engine, M, N, 1, False)
    if engine == "narrow" or grid[0] * grid[1] >= SPLIT_BELOW:
        return tile, grid, threads, summed, 1
    chunk, chunks, _ = blocks_chunk_plan(summed, grid[0] * grid[1], gemm_engines.min_chunk(engine))
    return tile, grid, threads, chunk, chunks


def weight_chunks(engine, batch, inputs, outputs):
    """(tile, grid, threads, chunk, chunks, most) of a run's own weight gradient on `engine` ("fma" or "tf32x3"):
    its batch summed in chunks where its tiles are fewer than SPLIT_BELOW (chunks.blocks_chunk_plan; `most`
    chunks at this batch, what a workspace is sized for), else in one."""
    tile, grid, threads = gemm_engines.engine_launch(engine, inputs, outputs, 1, False)
    if grid[0] * grid[1] >= SPLIT_BELOW:
        return tile, grid, threads, batch, 1, 1
    return (tile, grid, threads, *blocks_chunk_plan(batch, grid[0] * grid[1]))


@functools.cache
def make_chunk_partials(tile, dtype, engine, staging, rows):
    """The kernel (a, b, partials, chunk) of a chunked sum on `engine`'s `tile` (`staging` as
    gemm_engines.engine_staging gives it): with `rows`, a forward's or input gradient's partials[z] =
    a[:, chunk z] @ w (`rows` "backward": w.T), a (M, summed); else (None) a weight gradient's partials[z] =
    x[chunk z].T @ dy[chunk z]."""
    load, _ = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    if rows is None:
        return make_weight_partials(make_product(dense_operand(load, False), dense_operand(load, False)), layout,
                                    tile[:2])
    product = make_product(dense_operand(load, True), dense_operand(load, rows == "backward"))
    return make_weight_partials(product, layout, tile[:2], summed_by_a=True)


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
        after_previous_grid()
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


def split_rows_pass(engine, a, w, other, out, activation, backward, workspace, staging, plan):
    """A pass of gemm._rows_pass on `engine` (forward: other = b; `backward`, the input gradient: other = h) in the
    chunks of `plan` (rows_split's, more than one) of a's columns: their partial tiles into `workspace` (float32,
    at least chunks x M x N elements), then rows_sum_kernel adds them."""
    tile, grid, threads, chunk, chunks = plan
    M, N = tuple(out.shape)
    if workspace.shape[0] < chunks * M * N:  # as the weight gradient's: never a silent slower path
        raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * M * N} "
                         "(linear_rows_workspace(rows, summed, outputs))")
    partials = workspace[:chunks * M * N].reshape(chunks, M, N)
    stream = streams.current()
    kernel = make_chunk_partials(tile, a.dtype, engine, staging, "backward" if backward else "forward")
    kernel[(*grid, chunks), threads, stream](a, w, partials, chunk)
    make_rows_sum(a.dtype, backward)[(math.ceil(N / SUM_THREADS), M), SUM_THREADS, stream](
        partials, other, out, activation)
