"""Optimizer updates over the flat parameter buffer (NumPy backend).

Each function is one in-place update of every parameter; the formulas are
documented in `mlptrain.optim.optimizers`.
"""

import numpy as np


def sgd_update(param, grad, lr, weight_decay):
    """p -= lr * (g + wd * p)"""
    step = grad + np.float32(weight_decay) * param if weight_decay else grad
    param -= np.float32(lr) * step


def momentum_update(param, grad, velocity, lr, momentum, weight_decay, nesterov):
    """g' = g + wd p; v = mu v + g'; p -= lr * (g' + mu v if nesterov else v)"""
    g = grad + np.float32(weight_decay) * param if weight_decay else grad
    velocity *= np.float32(momentum)
    velocity += g
    step = g + np.float32(momentum) * velocity if nesterov else velocity
    param -= np.float32(lr) * step


def adam_update(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step):
    """Adam (decoupled=False: L2 added to g) or AdamW (decoupled=True).

    step is the 1-based optimizer step used in the bias corrections.
    """
    lr, beta1, beta2 = np.float32(lr), np.float32(beta1), np.float32(beta2)
    g = grad
    if weight_decay and decoupled:
        param *= np.float32(1.0 - lr * weight_decay)
    elif weight_decay:
        g = grad + np.float32(weight_decay) * param
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    bias_correction1 = np.float32(1.0 - float(beta1) ** step)
    bias_correction2 = np.float32(np.sqrt(1.0 - float(beta2) ** step))
    denom = np.sqrt(v) / bias_correction2 + np.float32(eps)
    param -= (lr / bias_correction1) * m / denom
