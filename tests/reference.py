"""Float64 NumPy references for the kernel tests of both backends.

Each function states the operation in the plainest NumPy, in float64, from
the float32 inputs a test hands to a kernel; nothing here is imported from
`mlptrain` except the activation codes.
"""

import numpy as np

from mlptrain.activation import NONE, RELU, SIGMOID, TANH

ACTIVATIONS = [NONE, RELU, TANH, SIGMOID]


def f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def activate(z, activation):
    z = np.asarray(z, dtype=np.float64)
    if activation == NONE:
        return z
    if activation == RELU:
        return np.maximum(z, 0.0)
    if activation == TANH:
        return np.tanh(z)
    if activation == SIGMOID:
        return 1.0 / (1.0 + np.exp(-z))
    raise ValueError(activation)


def activation_grad(h, activation):
    """d act / d z at the point whose activation output is h."""
    h = np.asarray(h, dtype=np.float64)
    if activation == NONE:
        return np.ones_like(h)
    if activation == RELU:
        return (h > 0).astype(np.float64)
    if activation == TANH:
        return 1.0 - h * h
    if activation == SIGMOID:
        return h * (1.0 - h)
    raise ValueError(activation)


def linear_forward(x, w, b, activation):
    x, w, b = f64(x, w, b)
    return activate(x @ w + b, activation)


def linear_backward_input(dy, w, h, activation):
    dy, w = f64(dy, w)
    return (dy @ w.T) * activation_grad(h, activation)


def linear_backward_weight(x, dy, dw, beta):
    x, dy, dw = f64(x, dy, dw)
    product = x.T @ dy
    return product if beta == 0.0 else beta * dw + product


def product_tolerance(a, b, extra=0.0):
    """Elementwise float32 error bound for a @ b (+ extra): a few ulps of the
    sum of absolute terms, so it holds for any summation order."""
    a, b = f64(a, b)
    return 2e-6 * np.sqrt(max(a.shape[1], 1)) * (np.abs(a) @ np.abs(b) + np.abs(extra)) + 1e-6


# Unit roundoff of each storage format: a value rounded once is within u * |value|.
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float16): 2.0**-11, np.dtype(np.uint16): 2.0**-8}
FP16_TINY = 2.0**-24  # fp16's smallest subnormal: an absolute floor for its rounding error


def rounding_tolerance(dtype, magnitude):
    """Error of storing values of this magnitude in `dtype` (0 for float32, whose rounding the
    product tolerances already cover)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return 0.0
    return UNIT_ROUNDOFF[dtype] * np.asarray(magnitude, np.float64) + (FP16_TINY if dtype == np.float16 else 0.0)


def softmax_cross_entropy(logits, labels, grad_scale):
    """(row_loss, row_correct, dlogits) with argmax ties going to the first max."""
    (logits,) = f64(logits)
    rows = np.arange(logits.shape[0])
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=1))
    loss = log_total - shifted[rows, labels]
    predicted = np.argmax(logits, axis=1)
    correct = np.where(predicted == labels, 1, -1 - predicted).astype(np.int32)  # a miss: -1 - the prediction
    probs = np.exp(shifted - log_total[:, None])
    probs[rows, labels] -= 1.0
    return loss, correct, probs * grad_scale


def bias_backward(dy, db, beta):
    dy, db = f64(dy, db)
    total = dy.sum(axis=0)
    return total if beta == 0.0 else beta * db + total


def sgd_update(param, grad, lr, weight_decay):
    p, g = f64(param, grad)
    return p - lr * (g + weight_decay * p)


def momentum_update(param, grad, velocity, lr, momentum, weight_decay, nesterov):
    """(param, velocity) after one heavy-ball (or Nesterov) step."""
    p, g, v = f64(param, grad, velocity)
    g = g + weight_decay * p
    v = momentum * v + g
    step = g + momentum * v if nesterov else v
    return p - lr * step, v


def adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step):
    """(param, m, v) after one Adam / AdamW step (Kingma & Ba 2015, Alg. 1;
    Loshchilov & Hutter 2019 for the decoupled decay)."""
    p, g, m, v = f64(param, grad, m, v)
    if decoupled:
        p = p * (1.0 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    m_hat = m / (1.0 - beta1**step)
    v_hat = v / (1.0 - beta2**step)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def gather_batch(images, labels, indices, start, n, scale, shift):
    """(x, y) for rows indices[start:start + n]."""
    rows = np.asarray(indices[start:start + n])
    return images[rows].astype(np.float64) * scale + shift, labels[rows].astype(np.int32)


def assert_within(got, expected, atol):
    """|got - expected| <= atol elementwise (atol may be an array); NaN fails."""
    got, expected = f64(got, expected)
    assert got.shape == expected.shape, f"shape {got.shape} != expected {expected.shape}"
    error = np.abs(got - expected)
    bad = ~(error <= atol)  # NaN compares False, so unwritten outputs show up here
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        limit = np.broadcast_to(atol, got.shape)[where]
        raise AssertionError(
            f"{int(bad.sum())} of {got.size} elements off; first at {where}: "
            f"got {got[where]!r}, expected {expected[where]!r}, tolerance {limit:.3g}"
        )
