"""Fused losses, forward + backward in one call (NumPy backend)."""

import numpy as np

from mlptrain.dtypes import from_float32, to_float32


def softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale, loss_scale,
                          cursor=None):
    """Per row i of logits (M, C) with integer label labels[i]:

    row_loss[offset + i]    = logsumexp(logits[i]) - logits[i, labels[i]]
    row_correct[offset + i] = 1 where argmax(logits[i]) == labels[i] (first max wins), else -1 - that argmax
    dlogits[i]              = (softmax(logits[i]) - onehot(labels[i])) * grad_scale * loss_scale[0]

    grad_scale is 1 / (samples in the optimizer window), so summing the
    per-sample gradients gives the gradient of the mean loss; loss_scale is
    fp16's dynamic loss scale (a 1-element float64 array, else 1). A `cursor` (1-element int64
    array) adds cursor[0] to offset.
    """
    rows = logits.shape[0]
    offset += 0 if cursor is None else int(cursor[0])
    logits = to_float32(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    picked = shifted[np.arange(rows), labels]
    row_loss[offset:offset + rows] = np.log(total[:, 0]) - picked
    predicted = np.argmax(logits, axis=1)
    row_correct[offset:offset + rows] = np.where(predicted == labels, 1, -1 - predicted)
    grad = exp / total
    grad[np.arange(rows), labels] -= 1.0
    grad *= np.float32(grad_scale) * np.float32(loss_scale[0])
    dlogits[...] = from_float32(grad, dlogits.dtype)


def softmax_cross_entropy_lanes(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale, loss_scale,
                                cursor, active):
    """`softmax_cross_entropy` for every active lane z (active[z] != 0), on lane z's logits[z], labels[z],
    dlogits[z], row_loss[z], row_correct[z], loss_scale[z] and cursor[z]; an inactive lane is not touched."""
    for z in np.flatnonzero(active):
        softmax_cross_entropy(logits[z], labels[z], dlogits[z], row_loss[z], row_correct[z], offset, grad_scale,
                              loss_scale[z], cursor[z])


def mse(output, target, doutput, row_loss, offset, grad_scale, loss_scale, cursor=None):
    """Per row i of output (M, D) against target (M, D):

    row_loss[offset + i] = mean over j of (output[i, j] - target[i, j])^2
    doutput[i]           = 2 (output[i] - target[i]) / D * grad_scale * loss_scale[0]

    Computed in float32 from the stored values, doutput rounded once to its
    format; 2 / D * grad_scale is rounded to float32 first, as the CUDA
    launcher does, so both backends give the same gradient bits. A `cursor` (1-element int64 array)
    adds cursor[0] to offset.
    """
    rows, width = output.shape
    offset += 0 if cursor is None else int(cursor[0])
    if width == 0:
        raise ValueError("output must have at least one column")
    if offset < 0 or offset + rows > row_loss.shape[0]:
        raise ValueError(f"rows {offset}..{offset + rows} do not fit row_loss ({row_loss.shape[0]})")
    diff = to_float32(output) - to_float32(target)
    row_loss[offset:offset + rows] = np.square(diff).sum(axis=1, dtype=np.float32) / np.float32(width)
    scale = np.float32(2.0 / width * grad_scale) * np.float32(loss_scale[0])
    doutput[...] = from_float32(diff * scale, doutput.dtype)
