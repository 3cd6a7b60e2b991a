"""Fused softmax cross-entropy forward + backward (CUDA backend)."""

import math

from numba import cuda, float32, int32

from mlptrain.numba_kernels.checks import require

THREADS = 128


# One thread per row: it owns row_loss/row_correct[offset + i] and the whole
# row dlogits[i], so no atomics. Rows are short (classes), three passes over
# the row (max, sum of exp, gradient) stay in L1.
@cuda.jit
def softmax_cross_entropy_kernel(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale):
    i = cuda.grid(1)
    rows, classes = logits.shape
    if i >= rows:
        return
    best, best_index = logits[i, 0], 0
    for j in range(1, classes):
        if logits[i, j] > best:  # strict: the first maximum wins, as np.argmax
            best, best_index = logits[i, j], j
    total = float32(0)
    for j in range(classes):
        total += math.exp(logits[i, j] - best)
    label = labels[i]
    if 0 <= label < classes:
        row_loss[offset + i] = math.log(total) - (logits[i, label] - best)
    else:  # a bad label shows up as a NaN loss instead of a wild read
        row_loss[offset + i] = float32(math.nan)
    row_correct[offset + i] = int32(1) if best_index == label else int32(0)
    for j in range(classes):
        p = math.exp(logits[i, j] - best) / total
        if j == label:
            p -= float32(1)
        dlogits[i, j] = p * grad_scale


def softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale):
    """Per row i of logits (M, C) with integer label labels[i]:

    row_loss[offset + i]    = logsumexp(logits[i]) - logits[i, labels[i]]
    row_correct[offset + i] = argmax(logits[i]) == labels[i]   (first max wins)
    dlogits[i]              = (softmax(logits[i]) - onehot(labels[i])) * grad_scale

    Labels are int32 in [0, C); a label outside gives a NaN loss.
    """
    require("logits", logits, "float32", (None, None))
    rows, classes = logits.shape
    require("labels", labels, "int32", (rows,))
    require("dlogits", dlogits, "float32", (rows, classes))
    require("row_loss", row_loss, "float32", (None,))
    require("row_correct", row_correct, "int32", (None,))
    if classes == 0:
        raise ValueError("logits must have at least one class column")
    if offset < 0 or offset + rows > min(row_loss.shape[0], row_correct.shape[0]):
        raise ValueError(
            f"rows {offset}..{offset + rows} do not fit row_loss ({row_loss.shape[0]}) "
            f"and row_correct ({row_correct.shape[0]})"
        )
    if rows == 0:
        return
    blocks = math.ceil(rows / THREADS)
    softmax_cross_entropy_kernel[blocks, THREADS](
        logits, labels, dlogits, row_loss, row_correct, offset, float32(grad_scale)
    )
