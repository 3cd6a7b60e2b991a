"""Dense layers as GEMMs with fused epilogues (NumPy backend).

Layout: x (M, K) row-major activations, w (K, N) weights, b (N,), y (M, N).
"""

import numpy as np

from mlptrain.activation import NONE, RELU, SIGMOID, TANH


def _apply_activation(y, activation):
    if activation == RELU:
        np.maximum(y, 0.0, out=y)
    elif activation == TANH:
        np.tanh(y, out=y)
    elif activation == SIGMOID:
        np.negative(y, out=y)
        with np.errstate(over="ignore"):  # exp(-z) = inf for z << 0 gives 1 / (1 + inf) = 0: exact
            np.exp(y, out=y)
        y += 1.0
        np.reciprocal(y, out=y)
    elif activation != NONE:
        raise ValueError(f"unknown activation code {activation}")


def _activation_grad(h, activation):
    """d act / d z expressed through the activation's output h."""
    if activation == RELU:
        return (h > 0).astype(h.dtype)
    if activation == TANH:
        return 1.0 - h * h
    if activation == SIGMOID:
        return h * (1.0 - h)
    raise ValueError(f"unknown activation code {activation}")


def linear_forward(x, w, b, y, activation):
    """y = act(x @ w + b)."""
    np.matmul(x, w, out=y)
    y += b
    _apply_activation(y, activation)


def linear_backward_input(dy, w, h, dx, activation):
    """dx = (dy @ w.T) * act'(h), where h = act(z) is this layer's input."""
    np.matmul(dy, w.T, out=dx)
    if activation != NONE:
        dx *= _activation_grad(h, activation)


def linear_backward_weight(x, dy, dw, beta):
    """dw = beta * dw + x.T @ dy (beta 0 overwrites, 1 accumulates)."""
    if beta == 0.0:
        np.matmul(x.T, dy, out=dw)
    else:
        dw *= beta
        dw += x.T @ dy
