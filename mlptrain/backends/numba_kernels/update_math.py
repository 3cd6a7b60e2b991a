"""One element's optimizer update, written once for every kernel that applies it (CUDA backend): the solo and lane
updates (optim) and the lanes' weight gradients with Adam in their epilogue (gemm_update), so that each rounds
alike. The formulas are documented in `mlptrain.optim.optimizers`."""

import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import float32
from mlptrain.optim.step_state import BIAS_CORRECTION1, BIAS_CORRECTION2, GRAD_MULTIPLIER, LR


@kernel_cache.device
def step_scalars(state):
    """(lr, gradient multiplier) of this step, in float32."""
    return float32(state[LR]), float32(state[GRAD_MULTIPLIER])


@kernel_cache.device
def sgd_element(param, grad, i, lr, multiplier, weight_decay):
    """Updates param[i]; returns it."""
    g = grad[i] * multiplier
    if weight_decay != float32(0):
        g = g + weight_decay * param[i]
    p = param[i] - lr * g
    param[i] = p
    return p


@kernel_cache.device
def momentum_element(param, grad, velocity, i, lr, multiplier, momentum, weight_decay, nesterov):
    """Updates velocity[i] and param[i]; returns param[i]."""
    g = grad[i] * multiplier
    if weight_decay != float32(0):
        g = g + weight_decay * param[i]
    v = momentum * velocity[i] + g
    velocity[i] = v
    step = g + momentum * v if nesterov else v
    p = param[i] - lr * step
    param[i] = p
    return p


@kernel_cache.device
def adam_scalars(state, weight_decay, decoupled):
    """(multiplier, step size, bias correction 2, decay, l2): what every element's Adam update reads."""
    lr, multiplier = step_scalars(state)
    step_size = lr / float32(state[BIAS_CORRECTION1])
    decay = float32(1) - lr * weight_decay if decoupled else float32(1)
    l2 = float32(0) if decoupled else weight_decay
    return multiplier, step_size, float32(state[BIAS_CORRECTION2]), decay, l2


@kernel_cache.device
def adam_value(p, g, m_i, v_i, scalars, beta1, beta2, one_minus_beta1, one_minus_beta2, eps):
    """One element's Adam update (scalars from adam_scalars), from its parameter p, its raw gradient g and its
    moments m_i, v_i: (p, m_i, v_i) updated. The only place the update's arithmetic is written, so every kernel
    and path that applies it (a quad at a time or an element at a time, a lane or a run alone) rounds alike."""
    multiplier, step_size, bias_correction2, decay, l2 = scalars
    g = g * multiplier
    if decay != float32(1):  # AdamW: decoupled decay
        p = p * decay
    if l2 != float32(0):  # Adam with weight decay: L2 in the gradient
        g = g + l2 * p
    m_i = beta1 * m_i + one_minus_beta1 * g
    v_i = beta2 * v_i + one_minus_beta2 * g * g
    p = p - step_size * m_i / (math.sqrt(v_i) / bias_correction2 + eps)
    return p, m_i, v_i
