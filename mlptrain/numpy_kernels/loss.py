"""Fused softmax cross-entropy forward + backward (NumPy backend)."""

import numpy as np


def softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale):
    """Per row i of logits (M, C) with integer label labels[i]:

    row_loss[offset + i]    = logsumexp(logits[i]) - logits[i, labels[i]]
    row_correct[offset + i] = argmax(logits[i]) == labels[i]   (first max wins)
    dlogits[i]              = (softmax(logits[i]) - onehot(labels[i])) * grad_scale

    grad_scale is 1 / (samples in the optimizer window), so summing the
    per-sample gradients gives the gradient of the mean loss.
    """
    rows = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    picked = shifted[np.arange(rows), labels]
    row_loss[offset:offset + rows] = np.log(total[:, 0]) - picked
    row_correct[offset:offset + rows] = np.argmax(logits, axis=1) == labels
    np.divide(exp, total, out=dlogits)
    dlogits[np.arange(rows), labels] -= 1.0
    dlogits *= np.float32(grad_scale)
