"""Dense layers with a narrow side (a classifier's output layer of ten classes), CUDA backend: the "narrow"
engine of gemm.py's launchers, for passes whose N (the forward's and the weight gradient's output columns, the
input gradient's summed width) is at most NARROW_MOST.

The tile engines spend such a pass's time on columns that are not there: 16 lanes of adam_mnist's 512 -> 10
layer took 19.3 µs for the forward (K = 512 summed by 64 blocks of 32 x 32 tiles), 19.6 for the input gradient
(K = 10 on tf32x3's 64 x 64 tiles) and 14.8 for the weight gradient, against ~3 µs of their memory traffic
(ncu, one H100; benchmarks/NOTES.md, issue 30 step 18). Here each pass is shaped by its narrow side:

- forward, y = act(x @ w + b): `split` warps per output row (forward_grid: up to 4 for a long K); thread t of
  the row's L = 32 x split sums k = t, t + L, ... for each of the N columns, then the row's L partials of a
  column are added by a fixed tree (offsets L / 2, ..., 2, 1: in shared memory across the row's warps, by
  shuffles within its first) and thread n writes column n;
- input gradient, dx = (dy @ w.T) * act'(h): a thread per output column of a few rows, its N weights in
  registers, summing each row's N products in order;
- weight gradient, dw = beta * dw + x.T @ dy: a thread per output element, summing its rows in order;
- a classifier's output layer and its softmax cross-entropy in one launch (one run's, no trial axis): the
  forward's blocks, each then taking its rows' losses from the logits it wrote.

Every output is summed by one thread or one block in a fixed order: no atomics, the same bits on every run. The
order differs from the tile engines', so a layer's outputs differ from theirs by float32 rounding. Operands carry
a leading trial axis (packed trials; a lane view, mlptrain.backends.lanes, where a layer's weights sit among each
trial's flat parameters); the grid's last axis is the trials', trial z's blocks skipped where `active[z]` is 0.
"""

import functools

from mlptrain.activation import NONE, RELU
from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import config, cuda, float32, uint64
from mlptrain.backends.numba_kernels.codecs import codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.loss import make_cross_entropy_row
from mlptrain.backends.numba_kernels.tiles import activation_grad_of, squash

NARROW_MOST = 16  # columns: a forward thread holds one partial sum for each
# output rows of a forward block (`split` warps each): its 10-column output layer's forward is bound by each
# warp's instructions, not the L1; 2 spread them on more SMs (H200, batch 128: 78.7-79.8 -> 77.4-77.6 µs a step with
# INPUT_ROWS_FEW; batch 2048: ~203 -> ~192; 4 and 1 gained less: benchmarks/NOTES.md, issue 31 step 2e)
ROWS = 2
WARP = 32
FULL_MASK = 0xFFFFFFFF
# a forward row's tree adds its widths below this by warp shuffles (five block barriers fewer a forward: the fused
# output layer 8.3 -> 8.0 µs under ncu, the step at batch 128 -1.3 µs in fp32, bf16 within noise, H200;
# benchmarks/NOTES.md, issue 31 step 6b); the simulator has no shuffles, so there the shared-memory tree runs down
# to width 1: the same additions
SHUFFLE_BELOW = 1 if config.ENABLE_CUDASIM else WARP
# warps summing one row's K: a forward's warp is bound by its own instruction chain (~2,300 instructions for K
# 512), so a long K is split over up to SPLIT_MOST warps, each thread keeping at least SPLIT_K of it (the fused
# output layer 9.9 -> 8.1 µs, the step at batch 128 -2 µs; 2 warps gained as much: benchmarks/NOTES.md, issue 31
# step 3b)
SPLIT_MOST = 4
SPLIT_K = 4
# the output layer's input gradient in its forward and loss's launch (make_narrow_cross_entropy's
# input_gradient): one launch fewer, the step at batch 128 -0.7 µs (fp32) and -1.3 (bf16) on an H200
# (benchmarks/NOTES.md, issue 31 step 6d); False launches it on its own right after, the same bits
FUSE_INPUT_GRADIENT = True
THREADS = 256  # of the input and weight gradients' blocks
ROWS_IN_FLIGHT = 8  # rows a weight-gradient thread loads before adding them
INPUT_ROWS = 8  # rows of an input-gradient block, a thread's column of each in turn (its N weights read once)
INPUT_ROWS_FEW = 2  # ... where INPUT_ROWS would leave the grid fewer than FILL_BLOCKS blocks
# about an H100's or H200's SMs; none on the simulator, which runs every thread in Python: more blocks of 256
# threads for the same outputs only cost it (its MLP tests took 14% longer)
FILL_BLOCKS = 0 if config.ENABLE_CUDASIM else 128


@functools.cache
def _narrow_forward_rows(N, dtype, split):
    """The device function (x, w, b, y, activation, partials) of a forward block: its rows of y from x, w and
    b (2-D, one trial's), `partials` the block's shared (ROWS, N, WARP * split) float32. Every thread of the
    block calls it (it holds barriers)."""
    load, store = codec(dtype)
    LANES = WARP * split  # threads a row

    # Block bx: rows bx*ROWS:+ROWS, `split` warps a row. Thread t of a row sums k = t, t + LANES, ... into one
    # partial a column; the tree then adds partial c + width into partial c, width LANES / 2 down to 1, and
    # thread n of the row writes column n: no atomics.
    @kernel_cache.device
    def narrow_forward_rows(a, weights, bias, out, activation, partials):
        M, K = a.shape
        row, t = cuda.threadIdx.x // LANES, cuda.threadIdx.x % LANES
        m = cuda.blockIdx.x * ROWS + row
        acc = cuda.local.array(N, float32)
        for n in range(N):
            acc[n] = float32(0)
        if m < M:
            r = uint64(m)
            k = t
            # two k a step, both loaded before either is added (in the order one at a time would add them): a
            # step's loads wait on the memory once, not twice
            while k + LANES < K:
                c, d = uint64(k), uint64(k + LANES)
                first, second = load(a[r, c]), load(a[r, d])
                for n in range(N):
                    acc[n] += first * load(weights[c, uint64(n)])
                    acc[n] += second * load(weights[d, uint64(n)])
                k += 2 * LANES
            if k < K:
                c = uint64(k)
                value = load(a[r, c])
                for n in range(N):
                    acc[n] += value * load(weights[c, uint64(n)])
        for n in range(N):
            partials[row, n, t] = acc[n]
        cuda.syncthreads()
        width = LANES // 2
        while width >= SHUFFLE_BELOW:  # across the row's warps, in shared memory
            if t < width:
                for n in range(N):
                    partials[row, n, t] += partials[row, n, t + width]
            cuda.syncthreads()
            width //= 2
        # the last widths within the row's first warp, by shuffles: lane t adds lane t + width's value, as the
        # shared tree would (the same additions in the same order), without a block barrier a width
        if t < SHUFFLE_BELOW:
            for n in range(N):
                value = partials[row, n, t]
                width = SHUFFLE_BELOW // 2
                while width > 0:
                    value += cuda.shfl_down_sync(FULL_MASK, value, width)
                    width //= 2
                if t == 0:
                    partials[row, n, 0] = value
        cuda.syncthreads()
        if m < M and t < N:
            r, c = uint64(m), uint64(t)
            value = partials[row, t, 0] + load(bias[c])
            if activation == RELU and value < float32(0):  # NaN stays NaN, as in np.maximum
                value = float32(0)
            stored = store(value)
            if activation != NONE and activation != RELU:
                stored = store(squash(load(stored), activation))
            out[r, c] = stored

    return narrow_forward_rows


@functools.cache
def make_narrow_forward(N, dtype, split):
    """The forward kernel (x, w, b, y, activation, active) of layers of N output columns stored as `dtype`,
    `split` warps a row (forward_grid's)."""
    rows, LANES = _narrow_forward_rows(N, dtype, split), WARP * split

    # Block (bx, z): rows bx*ROWS:+ROWS of trial z
    @kernel_cache.jit
    def narrow_forward_kernel(x, w, b, y, activation, active):
        after_previous_grid()
        partials = cuda.shared.array((ROWS, N, LANES), float32)
        z = cuda.blockIdx.y
        if active[z] == 0:  # the whole block, uniformly: none of its barriers is left waiting
            return
        rows(x[z], w[z], b[z], y[z], activation, partials)

    return narrow_forward_kernel


@functools.cache
def make_narrow_cross_entropy(N, dtype, split, input_gradient=False):
    """The forward kernel of a classifier's output layer (no activation) fused with its softmax cross-entropy
    (x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset, grad_scale, loss_scale; one
    run's operands, no trial axis): a block writes its rows' logits, then a thread a row takes that row's loss,
    hit and gradient with loss.make_cross_entropy_row's, from the logits as stored. One launch where there were two,
    and the same bits. With `input_gradient`, the kernel takes (h, dx, activation) too and its block then writes
    its rows of the layer's input gradient, dx = (dlogits @ w.T) * act'(h), with narrow_backward_input_kernel's
    arithmetic (_input_gradient_value): a third launch fewer, the same bits."""
    rows, cross_entropy_of_row = _narrow_forward_rows(N, dtype, split), make_cross_entropy_row(dtype)
    input_value = _input_gradient_value(N, dtype)
    load, _ = codec(dtype)
    LANES = WARP * split

    @kernel_cache.device
    def forward_loss(x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset, grad_scale,
                     loss_scale, partials):
        rows(x, w, b, logits, NONE, partials)
        cuda.syncthreads()  # the block's logits are written (and visible to its threads): its rows' losses read them
        m = cuda.blockIdx.x * ROWS + cuda.threadIdx.x // LANES
        if cuda.threadIdx.x % LANES == 0 and m < x.shape[0]:
            cross_entropy_of_row(logits, labels, dlogits, row_loss, row_correct, m, offset + cursor[0], grad_scale,
                                 loss_scale)

    if not input_gradient:
        @kernel_cache.jit
        def narrow_cross_entropy_kernel(x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset,
                                        grad_scale, loss_scale):
            after_previous_grid()
            partials = cuda.shared.array((ROWS, N, LANES), float32)
            forward_loss(x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset, grad_scale,
                         loss_scale, partials)

        return narrow_cross_entropy_kernel

    # ... then thread t of a row owns dx[m, k] for k = t, t + LANES, ...: each summed by one thread, no atomics.
    @kernel_cache.jit
    def narrow_cross_entropy_input_kernel(x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset,
                                          grad_scale, loss_scale, h, dx, activation):
        after_previous_grid()
        partials = cuda.shared.array((ROWS, N, LANES), float32)
        forward_loss(x, w, b, logits, labels, dlogits, row_loss, row_correct, cursor, offset, grad_scale,
                     loss_scale, partials)
        cuda.syncthreads()  # the block's rows of dlogits are written: their input gradient reads them
        M, K = x.shape
        m = cuda.blockIdx.x * ROWS + cuda.threadIdx.x // LANES
        if m < M:
            r = uint64(m)
            column = cuda.local.array(N, float32)
            for k in range(cuda.threadIdx.x % LANES, K, LANES):
                c = uint64(k)
                for n in range(N):
                    column[n] = load(w[c, uint64(n)])
                dx[r, c] = input_value(dlogits, column, h, r, c, activation)

    return narrow_cross_entropy_input_kernel


@functools.cache
def _input_gradient_value(N, dtype):
    """The device function (dy, column, h, r, c, activation) -> dx[r, c] in the storage format: row r's N products
    with the weights `column` (w[c, :N] loaded, in float32) summed in order, then times act'(h[r, c]). Every
    narrow input gradient computes each output with it, so a fused one gives the separate launch's bits."""
    load, store = codec(dtype)

    @kernel_cache.device
    def input_gradient_value(grad, column, kept, r, c, activation):
        total = float32(0)
        for n in range(N):
            total += load(grad[r, uint64(n)]) * column[n]
        stored = store(total)
        if activation != NONE:
            stored = store(load(stored) * activation_grad_of(load(kept[r, c]), activation))
        return stored

    return input_gradient_value


@functools.cache
def make_narrow_backward_input(N, dtype):
    """The input-gradient kernel (dy, w, h, dx, activation, active, rows) of layers of N output columns, `rows`
    rows a block (input_grid's)."""
    load, _ = codec(dtype)
    input_value = _input_gradient_value(N, dtype)

    # Block (bx, by, z): columns bx*THREADS:+THREADS of rows by*rows:+rows of trial z, a thread a column, its N
    # weights held in registers: each row's N products summed in order. No atomics.
    @kernel_cache.jit
    def narrow_backward_input_kernel(dy, w, h, dx, activation, active, rows):
        after_previous_grid()
        z = cuda.blockIdx.z
        if active[z] == 0:
            return
        grad, weights, kept, out = dy[z], w[z], h[z], dx[z]
        M, K = out.shape
        k = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if k >= K:
            return
        c = uint64(k)
        column = cuda.local.array(N, float32)
        for n in range(N):
            column[n] = load(weights[c, uint64(n)])
        first = cuda.blockIdx.y * rows
        for m in range(first, min(first + rows, M)):
            r = uint64(m)
            out[r, c] = input_value(grad, column, kept, r, c, activation)

    return narrow_backward_input_kernel


@functools.cache
def make_narrow_backward_weight(dtype):
    """The weight-gradient kernel (x, dy, dw, beta, active) of narrow layers (dw float32)."""
    load, _ = codec(dtype)

    # Block (bx, n, z): dw[z][bx*THREADS:+THREADS, n], a thread an element (a warp reads consecutive inputs of
    # x's rows): its rows' products summed in order, then beta * dw added. No atomics.
    @kernel_cache.jit
    def narrow_backward_weight_kernel(x, dy, dw, beta, active):
        after_previous_grid()
        z = cuda.blockIdx.z
        if active[z] == 0:
            return
        a, grad, out = x[z], dy[z], dw[z]
        B, K = a.shape
        k = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if k >= K:
            return
        c, n = uint64(k), uint64(cuda.blockIdx.y)
        total = float32(0)
        # rows ROWS_IN_FLIGHT at a time, all loaded before any is added (in row order, as one at a time would):
        # a batch's loads wait on the memory once
        products = cuda.local.array(ROWS_IN_FLIGHT, float32)
        m = 0
        while m + ROWS_IN_FLIGHT <= B:
            for j in range(ROWS_IN_FLIGHT):
                r = uint64(m + j)
                products[j] = load(a[r, c]) * load(grad[r, n])
            for j in range(ROWS_IN_FLIGHT):
                total += products[j]
            m += ROWS_IN_FLIGHT
        while m < B:
            r = uint64(m)
            total += load(a[r, c]) * load(grad[r, n])
            m += 1
        if beta == float32(0):  # never reads dw (it may hold garbage)
            out[c, n] = total
        else:
            out[c, n] = beta * out[c, n] + total

    return narrow_backward_weight_kernel


def forward_grid(M, K, trials):
    """(grid, threads, split) of a forward: ROWS rows a block, `split` warps summing each row's K, as many as
    leave each thread at least SPLIT_K of them (at most SPLIT_MOST). A row's sum is then split into more
    partials, added by a longer tree: the split is a function of K alone, so every launch of a layer (packed
    lanes, the fused loss's) adds in one order."""
    split = max(1, min(SPLIT_MOST, K // (WARP * SPLIT_K)))
    return (-(-M // ROWS), trials), ROWS * WARP * split, split


def input_grid(M, K, trials):
    """(grid, threads, rows a block) of an input gradient: INPUT_ROWS rows a block, or INPUT_ROWS_FEW where
    that leaves fewer than FILL_BLOCKS blocks (a batch of 128: 32 blocks for K = 512). Each output is one
    thread's sum whatever the rows: the same bits."""
    columns = -(-K // THREADS)
    rows = INPUT_ROWS if columns * -(-M // INPUT_ROWS) * trials >= FILL_BLOCKS else INPUT_ROWS_FEW
    return (columns, -(-M // rows), trials), THREADS, rows


def weight_grid(K, N, trials):
    return (-(-K // THREADS), N, trials), THREADS
