"""Optimizer updates over the flat parameter buffer (CUDA backend).

Each update is one fused elementwise launch over every parameter; the
formulas are documented in `mlptrain.optim.optimizers`. Scalars that depend
only on the step (bias corrections, decoupled decay factor) are computed on
the host in float32 exactly as the NumPy twin does, and passed in.
"""

import math

import numpy as np
from numba import cuda, float32

from mlptrain.numba_kernels.checks import require

THREADS = 256
MAX_BLOCKS = 2048  # grid-stride beyond this: enough to fill any current GPU


def _grid(size):
    return max(1, min(MAX_BLOCKS, math.ceil(size / THREADS)))


def _require_same(name, array, like):
    require(name, array, "float32", like.shape)


# Thread t owns elements t, t + stride, ... of every buffer: no atomics.
@cuda.jit
def sgd_update_kernel(param, grad, lr, weight_decay):
    for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        g = grad[i]
        if weight_decay != float32(0):
            g = g + weight_decay * param[i]
        param[i] = param[i] - lr * g


def sgd_update(param, grad, lr, weight_decay):
    """p -= lr * (g + wd * p)"""
    require("param", param, "float32", (None,))
    _require_same("grad", grad, param)
    sgd_update_kernel[_grid(param.shape[0]), THREADS](param, grad, float32(lr), float32(weight_decay))


# Thread t owns elements t, t + stride, ... of every buffer: no atomics.
@cuda.jit
def momentum_update_kernel(param, grad, velocity, lr, momentum, weight_decay, nesterov):
    for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        g = grad[i]
        if weight_decay != float32(0):
            g = g + weight_decay * param[i]
        v = momentum * velocity[i] + g
        velocity[i] = v
        step = g + momentum * v if nesterov else v
        param[i] = param[i] - lr * step


def momentum_update(param, grad, velocity, lr, momentum, weight_decay, nesterov):
    """g' = g + wd p; v = mu v + g'; p -= lr * (g' + mu v if nesterov else v)"""
    require("param", param, "float32", (None,))
    _require_same("grad", grad, param)
    _require_same("velocity", velocity, param)
    momentum_update_kernel[_grid(param.shape[0]), THREADS](
        param, grad, velocity, float32(lr), float32(momentum), float32(weight_decay), bool(nesterov)
    )


# Thread t owns elements t, t + stride, ... of every buffer: no atomics.
@cuda.jit
def adam_update_kernel(param, grad, m, v, beta1, beta2, eps, l2, decay, step_size, bias_correction2):
    for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        p, g = param[i], grad[i]
        if decay != float32(1):  # AdamW: decoupled decay
            p = p * decay
        if l2 != float32(0):  # Adam with weight decay: L2 in the gradient
            g = g + l2 * p
        m_i = beta1 * m[i] + (float32(1) - beta1) * g
        v_i = beta2 * v[i] + (float32(1) - beta2) * g * g
        m[i] = m_i
        v[i] = v_i
        denom = math.sqrt(v_i) / bias_correction2 + eps
        param[i] = p - step_size * m_i / denom


def adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step):
    """Adam (decoupled=False: L2 added to g) or AdamW (decoupled=True).

    step is the 1-based optimizer step used in the bias corrections.
    """
    require("param", param, "float32", (None,))
    _require_same("grad", grad, param)
    _require_same("m", m, param)
    _require_same("v", v, param)
    if step < 1:
        raise ValueError(f"step must be the 1-based optimizer step, got {step}")
    lr32, b1, b2 = np.float32(lr), np.float32(beta1), np.float32(beta2)
    decoupled = bool(weight_decay) and decoupled
    decay = np.float32(1.0 - lr32 * weight_decay) if decoupled else np.float32(1)
    l2 = np.float32(weight_decay) if weight_decay and not decoupled else np.float32(0)
    bias_correction1 = np.float32(1.0 - float(b1) ** step)
    bias_correction2 = np.float32(np.sqrt(1.0 - float(b2) ** step))
    adam_update_kernel[_grid(param.shape[0]), THREADS](
        param, grad, m, v, b1, b2, np.float32(eps), l2, decay, lr32 / bias_correction1, bias_correction2
    )
