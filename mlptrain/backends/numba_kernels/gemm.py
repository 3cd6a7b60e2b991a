"""Dense layers as tiled GEMMs with fused epilogues (CUDA backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N),
all C-contiguous. Activations and weights share one storage format (float32,
or float16 / bf16-in-uint16 for mixed precision); weight gradients are always
float32. Elements are converted to float32 as they are loaded, every product
is summed in float32, and outputs are rounded to the storage format once. The three products of a dense layer differ only
in which operand is read transposed:

    forward          y  = act(x @ w + b)       A = x  (M,K)      B = w   (K,N)
    backward input   dx = (dy @ w.T) * act'(h)  A = dy (M,N)      B = w.T (w is N-major)
    backward weight  dw = beta * dw + x.T @ dy  A = x.T (x is M-major) B = dy

Each is one tile product of tiles.py: the forward and the input gradient are one kernel factory
that differs in how w is read and in the epilogue; the weight gradient writes its sums itself, or
with a workspace splits a long batch across blocks into partials that chunks.py adds in chunk order.
No atomics: a fixed summation order, bitwise-reproducible results.
"""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.chunks import SPLIT_BELOW, add_chunks, chunk_plan, make_weight_partials
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.tiles import (
    TILES,
    check_activation,
    dense_operand,
    launch_grid,
    make_epilogues,
    make_tile_product,
    pick_tile,
    tile_coords,
    tile_layout,
)

# --- forward y = act(x @ w + b) and backward input dx = (dy @ w.T) * act'(h) --------

@functools.cache
def make_linear_rows(tile, dtype, backward, **jit_options):
    """The kernel (a, w, other, out, activation) of a pass whose output rows are the batch's:
    forward (backward False): out = act(a @ w + other), a = x (M, K), other = b;
    backward input: out = (a @ w.T) * act'(other), a = dy (M, N), other = h, w read N-major."""
    BM, BN, TM, TN, _, _ = tile_coords(tile)
    load, store = codec(dtype)
    tile_product = make_tile_product(tile, dense_operand(load, True), dense_operand(load, backward))
    bias_activation, activation_grad = make_epilogues(tile_layout(tile), load, store)
    epilogue = activation_grad if backward else bias_activation

    # Block (by, bx) owns out[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of a's columns, group 0 adds them in order and each of its
    # threads writes its own TM x TN outputs through the epilogue. No atomics.
    @kernel_cache.jit(**jit_options)
    def linear_rows_kernel(a, w, other, out, activation):
        M, summed = a.shape
        N = out.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if tile_product(a, w, acc, m0, n0, M, N, 0, summed):
            epilogue(acc, other, out, m0, n0, M, N, activation)

    return linear_rows_kernel


def linear_forward(x, w, b, y, activation):
    """y = act(x @ w + b), all four in one storage format."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    M, K = x.shape
    require("w", w, x.dtype, (K, None))
    N = w.shape[1]
    require("b", b, x.dtype, (N,))
    require("y", y, x.dtype, (M, N))
    check_activation(activation)
    if M == 0 or N == 0:
        return
    tile = TILES[pick_tile(M, N)][0]
    grid, threads = launch_grid(M, N, tile)
    make_linear_rows(tile, x.dtype, False)[grid, threads, streams.current()](x, w, b, y, activation)


def linear_backward_input(dy, w, h, dx, activation):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input.

    All four share one storage format. With activation NONE, h is not read
    (pass dx or any (M, K) array of that format).
    """
    require_one_of("dy", dy, STORAGE_DTYPES, (None, None))
    M, N = dy.shape
    require("w", w, dy.dtype, (None, N))
    K = w.shape[0]
    require("h", h, dy.dtype, (M, K))
    require("dx", dx, dy.dtype, (M, K))
    check_activation(activation)
    if M == 0 or K == 0:
        return
    tile = TILES[pick_tile(M, K)][0]
    grid, threads = launch_grid(M, K, tile)
    make_linear_rows(tile, dy.dtype, True)[grid, threads, streams.current()](dy, w, h, dx, activation)


# --- backward weight: dw = beta * dw + x.T @ dy ----------------------------------

@functools.cache
def make_linear_backward_weight(tile, dtype, **jit_options):
    BM, BN, TM, TN, _, _ = tile_coords(tile)
    load, _ = codec(dtype)
    tile_product = make_tile_product(tile, dense_operand(load, False), dense_operand(load, False))
    _, _, row_of, col_of = tile_layout(tile)

    # Block (by, bx) owns dw[by*BM:+BM, bx*BN:+BN]: its K-split groups sum
    # their shares of the batch, group 0 adds them in order and each of its
    # threads writes its own TM x TN weights. No atomics; beta == 0 never
    # reads dw (it may hold garbage).
    @kernel_cache.jit(**jit_options)
    def linear_backward_weight_kernel(x, dy, dw, beta):
        B, K = x.shape
        N = dy.shape[1]
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        acc = cuda.local.array((TM, TN), float32)
        if not tile_product(x, dy, acc, m0, n0, K, N, 0, B):
            return
        for i in range(TM):
            k = row_of(m0, i)
            for j in range(TN):
                n = col_of(n0, j)
                if k < K and n < N:
                    if beta == float32(0):
                        dw[k, n] = acc[i, j]
                    else:
                        dw[k, n] = beta * dw[k, n] + acc[i, j]

    return linear_backward_weight_kernel


@functools.cache
def _make_linear_weight_partials(tile, dtype):
    load, _ = codec(dtype)
    product = make_tile_product(tile, dense_operand(load, False), dense_operand(load, False))
    return make_weight_partials(product, tile_layout(tile), tile[:2])


def linear_backward_weight_workspace(batch, inputs, outputs):
    """float32 elements of workspace linear_backward_weight can use for x (batch, inputs) and dy
    (batch, outputs): 0 where one block per output tile already fills the GPU. Never smaller for a
    smaller batch, so one workspace sized for the largest batch serves all."""
    tile = TILES[pick_tile(inputs, outputs)][0]
    grid, _ = launch_grid(inputs, outputs, tile)
    _, _, most = chunk_plan(batch, inputs, outputs, tile)
    return most * inputs * outputs if most > 1 and grid[0] * grid[1] < SPLIT_BELOW else 0


def linear_variants(rows, inputs, outputs, workspace=True):
    """The kernel each pass of an (inputs -> outputs) dense layer over `rows` samples runs, for the run's
    record: the tile of the forward, input gradient and weight gradient (`+chunks` where the weight
    gradient sums the batch in chunks, given a workspace)."""
    tile = TILES[pick_tile(inputs, outputs)][0]
    grid, _ = launch_grid(inputs, outputs, tile)
    chunked = workspace and grid[0] * grid[1] < SPLIT_BELOW and chunk_plan(rows, inputs, outputs, tile)[1] > 1
    return {"forward": f"tiled/{pick_tile(rows, outputs)}", "backward_input": f"tiled/{pick_tile(rows, inputs)}",
            "backward_weight": f"tiled/{pick_tile(inputs, outputs)}{'+chunks' if chunked else ''}"}


def linear_backward_weight(x, dy, dw, beta, workspace=None):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates); x and dy in one storage
    format, dw float32 (gradients are accumulated in float32 whatever the precision). With a float32
    workspace of `linear_backward_weight_workspace(...)` elements, a long batch is summed in chunks
    by more blocks (see CHUNK_BLOCKS)."""
    require_one_of("x", x, STORAGE_DTYPES, (None, None))
    B, K = x.shape
    require("dy", dy, x.dtype, (B, None))
    N = dy.shape[1]
    require("dw", dw, "float32", (K, N))
    if beta not in (0.0, 1.0):
        raise ValueError(f"beta must be 0.0 (overwrite) or 1.0 (accumulate), got {beta!r}")
    if K == 0 or N == 0:
        return
    tile = TILES[pick_tile(K, N)][0]
    grid, threads = launch_grid(K, N, tile)
    if workspace is not None and grid[0] * grid[1] < SPLIT_BELOW:
        require("workspace", workspace, "float32", (None,))
        chunk, chunks, most = chunk_plan(B, K, N, tile)
        if chunks > 1 and workspace.shape[0] < chunks * K * N:  # as conv and reduce do: never a silent slower path
            raise ValueError(f"workspace has {workspace.shape[0]} elements, needs {chunks * K * N} "
                             "(linear_backward_weight_workspace(batch, inputs, outputs))")
        if chunks > 1:
            partials = workspace[:chunks * K * N]
            _make_linear_weight_partials(tile, x.dtype)[(*grid, chunks), threads, streams.current()](
                x, dy, partials.reshape(chunks, K, N), chunk)
            add_chunks(partials.reshape(chunks, K * N), dw.reshape(K * N), beta)
            return
    make_linear_backward_weight(tile, x.dtype)[grid, threads, streams.current()](x, dy, dw, float32(beta))
