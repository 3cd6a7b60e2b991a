"""Fused losses, forward + backward in one launch (CUDA backend)."""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, int32
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import (
    check_cross_entropy, check_rows, checked_cursor, require, require_lanes, require_lanes_one_of, require_one_of)
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid

THREADS = 128


@functools.cache
def make_cross_entropy_row(dtype):
    """The device function (logits, labels, dlogits, row_loss, row_correct, i, offset, grad_scale, loss_scale)
    that takes row i of logits in this format to its loss, hit and gradient: every kernel of this loss runs it
    a row a thread (here, and fused behind the output layer in gemm_narrow.py), so they all give its bits."""
    load, store = codec(dtype)

    # One thread per row: it owns row_loss/row_correct[offset + i] and the
    # whole row dlogits[i], so no atomics. Rows are short (classes), three
    # passes over the row (max, sum of exp, gradient) stay in L1.
    @kernel_cache.device
    def cross_entropy_of_row(logits, labels, dlogits, row_loss, row_correct, i, offset, grad_scale, loss_scale):
        classes = logits.shape[1]
        best, best_index = load(logits[i, 0]), 0
        for j in range(1, classes):
            if load(logits[i, j]) > best:  # strict: the first maximum wins, as np.argmax
                best, best_index = load(logits[i, j]), j
        total = float32(0)
        for j in range(classes):
            total += math.exp(load(logits[i, j]) - best)
        label = labels[i]
        if 0 <= label < classes:
            row_loss[offset + i] = math.log(total) - (load(logits[i, label]) - best)
        else:  # a bad label shows up as a NaN loss instead of a wild read
            row_loss[offset + i] = float32(math.nan)
        # a miss also says what was predicted: the confusion matrix needs no other pass
        row_correct[offset + i] = int32(1) if best_index == label else int32(-1 - best_index)
        scale = grad_scale * float32(loss_scale[0])
        for j in range(classes):
            p = math.exp(load(logits[i, j]) - best) / total
            if j == label:
                p -= float32(1)
            dlogits[i, j] = store(p * scale)

    return cross_entropy_of_row


@functools.cache
def _make_softmax_cross_entropy(dtype):
    """(softmax_cross_entropy_kernel, softmax_cross_entropy_lanes_kernel) for logits in this format; both
    run one device function per row, so a lane's rows are the solo kernel's bits."""
    row = make_cross_entropy_row(dtype)

    @kernel_cache.jit
    def softmax_cross_entropy_kernel(logits, labels, dlogits, row_loss, row_correct, cursor, offset, grad_scale,
                                     loss_scale):
        after_previous_grid()
        i = cuda.grid(1)
        if i < logits.shape[0]:
            row(logits, labels, dlogits, row_loss, row_correct, i, offset + cursor[0], grad_scale, loss_scale)

    # Block row z serves lane z as the solo kernel's grid would; an inactive lane's threads return before
    # reading its cursor.
    @kernel_cache.jit
    def softmax_cross_entropy_lanes_kernel(logits, labels, dlogits, row_loss, row_correct, cursor, offset,
                                           grad_scale, loss_scale, active):
        after_previous_grid()
        i, z = cuda.grid(1), cuda.blockIdx.y
        if i < logits.shape[1] and active[z] != 0:
            row(logits[z], labels[z], dlogits[z], row_loss[z], row_correct[z], i, offset + cursor[z, 0], grad_scale,
                loss_scale[z])

    return softmax_cross_entropy_kernel, softmax_cross_entropy_lanes_kernel


def softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale, loss_scale,
                          cursor=None):
    """Per row i of logits (M, C) with integer label labels[i]:

    row_loss[offset + i]    = logsumexp(logits[i]) - logits[i, labels[i]]
    row_correct[offset + i] = 1 where argmax(logits[i]) == labels[i] (first max wins), else -1 - that argmax
    dlogits[i]              = (softmax(logits[i]) - onehot(labels[i])) * grad_scale * loss_scale[0]

    logits and dlogits share a storage format; the loss is computed in float32.
    grad_scale is a host float (1 / samples in the optimizer window); loss_scale
    a 1-element float64 device array (fp16's dynamic loss scale, else 1), read
    on the device. Labels are int32 in [0, C); a label outside gives a NaN loss.
    """
    rows = check_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, loss_scale)
    if rows == 0:
        return
    blocks = math.ceil(rows / THREADS)
    _make_softmax_cross_entropy(logits.dtype)[0][blocks, THREADS, streams.current()](
        logits, labels, dlogits, row_loss, row_correct, checked_cursor(cursor), offset, float32(grad_scale), loss_scale
    )


def softmax_cross_entropy_lanes(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale, loss_scale,
                                cursor, active):
    """`softmax_cross_entropy` for every active lane z (active[z] != 0) in one launch: lane z's
    logits[z] (M, C), labels[z], dlogits[z], row_loss[z], row_correct[z], loss_scale[z] and cursor[z].

    logits, dlogits (K, M, C) in one storage format, labels (K, M) int32, row_loss (K, N) float32,
    row_correct (K, N) int32, loss_scale (K, 1) float64, cursor (K, 1) int64, active (K,) int32; grad_scale
    and offset are every lane's. Lane operands may be lane views (`mlptrain.backends.lanes.lane_view`:
    loss_scale is a column of the lanes' step states). An inactive lane is not touched.
    """
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes_one_of("logits", logits, STORAGE_DTYPES, (lanes, None, None))
    _, rows, classes = tuple(logits.shape)
    require_lanes("labels", labels, "int32", (lanes, rows))
    require_lanes("dlogits", dlogits, logits.dtype, (lanes, rows, classes))
    require_lanes("row_loss", row_loss, "float32", (lanes, None))
    require_lanes("row_correct", row_correct, "int32", (lanes, None))
    require_lanes("loss_scale", loss_scale, "float64", (lanes, 1))
    require_lanes("cursor", cursor, "int64", (lanes, 1))
    if classes == 0:
        raise ValueError("logits must have at least one class column")
    check_rows(offset, rows, row_loss.shape[1], row_correct.shape[1])
    if rows == 0 or lanes == 0:
        return
    blocks = (math.ceil(rows / THREADS), lanes)
    _make_softmax_cross_entropy(logits.dtype)[1][blocks, THREADS, streams.current()](
        logits, labels, dlogits, row_loss, row_correct, cursor, offset, float32(grad_scale), loss_scale, active
    )


# --- mean squared error ------------------------------------------------------------

MSE_THREADS = 256  # the most threads per row; D = 3072 gives each 12 elements


@functools.cache
def _make_mse(dtype):
    load, store = codec(dtype)

    # Block i owns row i: doutput[i] and row_loss[offset + i], so no atomics.
    # Thread t takes elements t, t + blockDim, ... (coalesced), writes their
    # gradients and sums their squares in order; a shared-memory tree whose
    # pairing depends only on blockDim then adds the threads' sums, so every
    # run adds in the same order.
    @kernel_cache.jit
    def mse_kernel(output, target, doutput, row_loss, cursor, offset, coefficient, loss_scale):
        after_previous_grid()
        partial = cuda.shared.array(MSE_THREADS, float32)
        i, t, threads = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
        width = output.shape[1]
        scale = coefficient * float32(loss_scale[0])
        total = float32(0)
        for j in range(t, width, threads):
            d = load(output[i, j]) - load(target[i, j])
            total += d * d
            doutput[i, j] = store(d * scale)
        partial[t] = total
        cuda.syncthreads()
        half = threads // 2
        while half > 0:
            if t < half:
                partial[t] += partial[t + half]
            cuda.syncthreads()
            half //= 2
        if t == 0:
            row_loss[cursor[0] + offset + i] = partial[0] / float32(width)

    return mse_kernel


def mse(output, target, doutput, row_loss, offset, grad_scale, loss_scale, cursor=None):
    """Per row i of output (M, D) against target (M, D):

    row_loss[offset + i] = mean over j of (output[i, j] - target[i, j])^2
    doutput[i]           = 2 (output[i] - target[i]) / D * grad_scale * loss_scale[0]

    output, target and doutput share a storage format; the loss is float32,
    computed in float32. grad_scale is a host float (1 / samples in the
    optimizer window; 0 evaluates only); loss_scale a 1-element float64 device
    array (fp16's dynamic loss scale, else 1), read on the device. 2 / D *
    grad_scale is rounded to float32 on the host, then multiplied by the loss
    scale on the device.
    """
    require_one_of("output", output, STORAGE_DTYPES, (None, None))
    rows, width = output.shape
    require("target", target, output.dtype, (rows, width))
    require("doutput", doutput, output.dtype, (rows, width))
    require("row_loss", row_loss, "float32", (None,))
    require("loss_scale", loss_scale, "float64", (1,))
    if width == 0:
        raise ValueError("output must have at least one column")
    if offset < 0 or offset + rows > row_loss.shape[0]:
        raise ValueError(f"rows {offset}..{offset + rows} do not fit row_loss ({row_loss.shape[0]})")
    if rows == 0:
        return
    # a power of two (the tree halves it), no more threads than a row has elements, at least a warp
    threads = min(MSE_THREADS, max(32, 1 << (width - 1).bit_length()))
    coefficient = float32(2.0 / width * grad_scale)
    _make_mse(output.dtype)[rows, threads, streams.current()](
        output, target, doutput, row_loss, checked_cursor(cursor), offset, coefficient, loss_scale)

