"""A dense layer's forward or input gradient summed by more blocks than its output has tiles (CUDA backend).

An MLP's 128 x 512 output is 64 SMALL tiles, about half of an H100's SMs, and each block sums the whole K (784
for the first layer) by itself: a 128 x 784 -> 512 -> 512 -> 10 step's forwards took 20.1 and 14.8 µs and its
512-wide input gradient 16.8, at 4-5 TFLOP/s (benchmarks/step_profile.py --model mlp, H100; benchmarks/NOTES.md,
issue 31 step 1). Given a workspace, a pass of fewer than chunks.SPLIT_BELOW tiles has its summed axis cut into
chunks (chunks.blocks_chunk_plan, as a weight gradient's batch is): block (bx, by, z) writes chunk z's partial
tile (on the pass's engine, make_chunk_partials), then a second launch adds each output's chunks in
chunk order and applies the pass's epilogue (bias and activation, or the activation's derivative), rounding to
the storage format as the one-launch pass does (on sm_90+, a tensor-core pass's chunks of a tile are instead one
thread-block cluster that adds them itself, make_cluster_rows: the same bits, a launch fewer). A weight gradient
of few tiles cuts its batch the same way (weight_chunks; chunks.add_chunks adds them). A fixed plan, read off
the shapes alone, and a fixed order: the same bits on every run.
"""

import functools
import math

from mlptrain.activation import NONE, RELU, SIGMOID, TANH
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, uint64
from mlptrain.backends.numba_kernels import gemm_engines, streams
from mlptrain.backends.numba_kernels.async_copy import shared_address
from mlptrain.backends.numba_kernels.chunks import SPLIT_BELOW, blocks_chunk_plan, make_weight_partials
from mlptrain.backends.numba_kernels.cluster import cluster_done, cluster_load, cluster_sync
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.tiles import activation_grad_of, dense_operand, squash

SUM_THREADS = 256  # outputs of one row a block of the second launch adds up
ROW_STEP = 32  # every tile's BM is a multiple: a plan changes only at multiples of it
# A pass's chunks as one thread-block cluster where the GPU and the launch path allow (clustered): the chunks' sum
# then needs no launch of its own (three a 784-512-512-10 step at batch 128: the step -0.7 µs in bf16, -1.2 in
# fp32 on an H200 with the remote loads batched and the exit barrier relaxed, +1.6 to +1.9 before either;
# benchmarks/NOTES.md, issue 31 steps 5c and 6). CLUSTER_MOST blocks a cluster (the size every GPU with clusters
# takes).
RUN_CLUSTERS = True
CLUSTER_MOST = 8


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
    if rows is None:
        product, layout = _tile_product(tile, dtype, engine, staging, False, False)
        return make_weight_partials(product, layout, tile[:2])
    product, layout = _tile_product(tile, dtype, engine, staging, True, rows == "backward")
    return make_weight_partials(product, layout, tile[:2], summed_by_a=True)


def _tile_product(tile, dtype, engine, staging, a_k_contiguous, b_k_contiguous):
    """(tile product, Layout) on `engine` of two stored operands (tiles.dense_operand, its k_contiguous per
    operand): a weight gradient's (False, False); a forward's (True, False: w as stored) or an input gradient's
    (True, True: w.T), a (M, summed) read along its rows. What make_chunk_partials and make_cluster_rows sum."""
    load, _ = codec(dtype)
    make_product, layout = gemm_engines.engine_parts(engine, tile, dtype, staging)
    return make_product(dense_operand(load, a_k_contiguous), dense_operand(load, b_k_contiguous)), layout


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
def make_rows_epilogue(dtype, backward):
    """The device function (total, other, r, c, activation) -> output r, c in the storage format: the epilogue of
    gemm.make_linear_rows's tiles (tiles.make_epilogues) on an output's sum, in the same steps: forward act(total +
    b) (other = b), input gradient total * act'(h) (other = h), each rounded to the storage format where they
    round."""
    load, store = codec(dtype)

    @kernel_cache.device
    def epilogue(total, other, r, c, activation):
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
        return stored

    return epilogue


@functools.cache
def make_rows_sum(dtype, backward):
    """Kernel (partials, other, out, activation): each output's chunks added in chunk order, then the pass's
    epilogue (make_rows_epilogue)."""
    epilogue = make_rows_epilogue(dtype, backward)

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
        out[r, c] = epilogue(total, other, r, c, activation)

    return rows_sum_kernel


def clustered(engine, chunks):
    """Whether a split pass of `chunks` chunks on `engine` runs as clusters (make_cluster_rows): RUN_CLUSTERS on,
    a tensor-core engine (the CUDA-core tiles' shared memory leaves no room for the partial tile beside it, and
    every GPU with clusters runs a run's passes on tensor cores), at most CLUSTER_MOST chunks, on a GPU and launch
    path that take clusters."""
    return (RUN_CLUSTERS and engine in ("tf32x3", "mma16") and 1 < chunks <= CLUSTER_MOST
            and kernel_cache.cluster_launches())


@kernel_cache.device
def _cluster_sum(address, chunks):
    """The float32 at shared `address` in each of the cluster's first `chunks` blocks (at most CLUSTER_MOST),
    added in rank order from 0. All CLUSTER_MOST loads are issued before the first add (ranks past the last read
    the last block again, unused; both loops have a constant count, so they unroll and the values stay in
    registers): one at a time, each waited on its remote block's shared memory before the next was issued (the
    cluster pass was 2.9 µs longer than its chunks' pass alone; benchmarks/NOTES.md, issue 31 step 5c)."""
    values = cuda.local.array(CLUSTER_MOST, float32)
    for q in range(CLUSTER_MOST):
        values[q] = cluster_load(address, min(q, chunks - 1))
    total = float32(0)
    for q in range(CLUSTER_MOST):
        if q < chunks:
            total += values[q]
    return total


@functools.cache
def make_cluster_rows(tile, dtype, engine, staging, backward):
    """Kernel (a, w, other, out, activation, chunk) of a split pass whose grid's z axis (its chunks, at most
    CLUSTER_MOST) is one thread-block cluster: block (bx, by, z) sums chunk z's partial tile as make_chunk_partials'
    does, into its own shared memory; after a cluster barrier, block z adds the cluster's tiles at its share of the
    tile's outputs, in chunk order from 0, and applies make_rows_epilogue: rows_sum_kernel's additions on the same
    partials, so the same bits, with no workspace and no launch of their own."""
    product, layout = _tile_product(tile, dtype, engine, staging, True, backward)
    epilogue = make_rows_epilogue(dtype, backward)
    BM, BN = tile[:2]
    TM, TN, row_of, col_of = layout
    TILE = BM * BN

    # Block (bx, by, z) alone writes its tile's outputs z * T + t, + chunks * T, ... (T threads a block), each
    # summed by one thread in chunk order: no atomics. Its shared tile outlives every read of it: the exit
    # barrier (cluster_done).
    @kernel_cache.jit(cluster_z=True)
    def cluster_rows_kernel(a, w, other, out, activation, chunk):
        after_previous_grid()
        rows, columns = out.shape
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        z, chunks, threads = cuda.blockIdx.z, cuda.gridDim.z, cuda.blockDim.x
        begin = z * chunk
        acc = cuda.local.array((TM, TN), float32)
        tile_sum = cuda.shared.array(TILE, float32)
        if product(a, w, acc, m0, n0, rows, columns, begin, min(begin + chunk, a.shape[1])):  # else no sums here
            for i in range(TM):
                for j in range(TN):
                    tile_sum[(row_of(m0, i) - m0) * BN + col_of(n0, j) - n0] = acc[i, j]
        cluster_sync()
        base = shared_address(tile_sum, 0)
        for e in range(z * threads + cuda.threadIdx.x, TILE, chunks * threads):
            r, c = m0 + e // BN, n0 + e % BN
            if r < rows and c < columns:
                total = _cluster_sum(base + 4 * e, chunks)
                out[uint64(r), uint64(c)] = epilogue(total, other, uint64(r), uint64(c), activation)
        # every block's reads of the others' tiles are done (their values were added before the writes above):
        # no release, so no block waits for its own writes to drain (ncu: stalls on a memory barrier)
        cluster_done()

    return cluster_rows_kernel


def split_rows_pass(engine, a, w, other, out, activation, backward, workspace, staging, plan):
    """A pass of gemm._rows_pass on `engine` (forward: other = b; `backward`, the input gradient: other = h) in the
    chunks of `plan` (rows_split's, more than one) of a's columns: their partial tiles into `workspace` (float32,
    at least chunks x M x N elements), then rows_sum_kernel adds them; or, where `clustered`, one launch of
    clusters that adds them in shared memory (the workspace unused)."""
    tile, grid, threads, chunk, chunks = plan
    M, N = tuple(out.shape)
    stream = streams.current()
    if clustered(engine, chunks):
        make_cluster_rows(tile, a.dtype, engine, staging, backward)[(*grid, chunks), threads, stream](
            a, w, other, out, activation, chunk)
        return
    if workspace.shape[0] < chunks * M * N:  # as the weight gradient's: never a silent slower path
        raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * M * N} "
                         "(linear_rows_workspace(rows, summed, outputs))")
    partials = workspace[:chunks * M * N].reshape(chunks, M, N)
    kernel = make_chunk_partials(tile, a.dtype, engine, staging, "backward" if backward else "forward")
    kernel[(*grid, chunks), threads, stream](a, w, partials, chunk)
    make_rows_sum(a.dtype, backward)[(math.ceil(N / SUM_THREADS), M), SUM_THREADS, stream](
        partials, other, out, activation)
