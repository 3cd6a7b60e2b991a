"""The fused updates of the optimizer step over the flat buffers (NumPy backend).

The CUDA backend's updates: each in place, reading its scalars from the step state (`step_rules` writes
it). The formulas are documented in `mlptrain.optim.optimizers`.
"""

import numpy as np

from mlptrain.backends.numpy_kernels import reduce
from mlptrain.dtypes import from_float32
from mlptrain.optim import step_state
from mlptrain.optim.step_state import APPLY, BIAS_CORRECTION1, BIAS_CORRECTION2, GRAD_MULTIPLIER, LR


def _scalars(state):
    return np.float32(state[LR]), np.float32(state[GRAD_MULTIPLIER])


def _write_compute(param, compute):
    if compute is not param:
        compute[...] = from_float32(param, compute.dtype)


def sgd_update(param, grad, compute, state, weight_decay):
    """p -= lr * (g + wd * p), g the summed gradient times the step's multiplier."""
    if state[APPLY] == 0:
        return
    lr, multiplier = _scalars(state)
    g = grad * multiplier
    if weight_decay:
        g += np.float32(weight_decay) * param
    param -= lr * g
    _write_compute(param, compute)


def momentum_update(param, grad, velocity, compute, state, momentum, weight_decay, nesterov):
    """g' = g + wd p; v = mu v + g'; p -= lr * (g' + mu v if nesterov else v)"""
    if state[APPLY] == 0:
        return
    lr, multiplier = _scalars(state)
    g = grad * multiplier
    if weight_decay:
        g += np.float32(weight_decay) * param
    velocity *= np.float32(momentum)
    velocity += g
    step = g + np.float32(momentum) * velocity if nesterov else velocity
    param -= lr * step
    _write_compute(param, compute)


def adam_update(param, grad, m, v, compute, state, beta1, beta2, eps, weight_decay, decoupled, partials=None,
                prepare=None):
    """Adam (decoupled=False: L2 added to g) or AdamW (decoupled=True); lr and the bias corrections
    come from the step state. Given `partials`, also writes the gradient's sum of squares there, as
    `reduce.sum_of_squares` does (even where the window is skipped); given `prepare` too (lr_schedule, beta1,
    beta2), the rules come from `prepare_step` applied to a copy of the state, which is left as it is."""
    if prepare is not None:
        if partials is None:
            raise ValueError("prepare needs partials")
        state = state.copy()
        step_state.prepare_step(state, prepare[0], float(prepare[1]), float(prepare[2]))
    if partials is not None:
        reduce.sum_of_squares(grad, partials)
    # 1 - beta from the float64 beta: in float32, 1 - float32(0.999) keeps only 4 significant digits
    _adam(param, grad, m, v, compute, state, np.float32(beta1), np.float32(beta2), np.float32(1.0 - beta1),
          np.float32(1.0 - beta2), np.float32(eps), np.float32(weight_decay), bool(decoupled) and bool(weight_decay))


def _adam(param, grad, m, v, compute, state, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay,
          decoupled):
    """adam_update on its float32 scalars, as the CUDA launcher passes them (and a lane's row holds them)."""
    if state[APPLY] == 0:
        return
    lr, multiplier = _scalars(state)
    g = grad * multiplier
    if decoupled:
        param *= np.float32(1) - lr * weight_decay
    elif weight_decay:
        g += weight_decay * param
    m *= beta1
    m += one_minus_beta1 * g
    v *= beta2
    v += one_minus_beta2 * g * g
    step_size = lr / np.float32(state[BIAS_CORRECTION1])
    denom = np.sqrt(v) / np.float32(state[BIAS_CORRECTION2]) + eps
    param -= step_size * m / denom
    _write_compute(param, compute)


# --- lanes: the packed trials' buffers (K, ...), lane z's rows updated as the solo call would --------------


def _active_lanes(param, compute, active):
    """(z, param[z], lane z's compute copy) for every active lane z: the copy is param[z] itself where compute
    is param (fp32), so that the solo update sees one array and rewrites nothing."""
    for z in np.flatnonzero(active):
        lane = param[z]
        yield z, lane, lane if compute is param else compute[z]


def sgd_update_lanes(param, grad, compute, state, hypers, active):
    """`sgd_update` for every active lane z (active[z] != 0); hypers (K, 1) float32 holds lane z's
    [weight_decay]."""
    for z, lane, lane_compute in _active_lanes(param, compute, active):
        sgd_update(lane, grad[z], lane_compute, state[z], hypers[z, 0])


def momentum_update_lanes(param, grad, velocity, compute, state, hypers, active):
    """`momentum_update` for every active lane z; hypers (K, 3) float32 holds lane z's
    [momentum, weight_decay, nesterov (0 or 1)]."""
    for z, lane, lane_compute in _active_lanes(param, compute, active):
        momentum, weight_decay, nesterov = hypers[z]
        momentum_update(lane, grad[z], velocity[z], lane_compute, state[z], momentum, weight_decay, nesterov != 0)


def adam_update_lanes(param, grad, m, v, compute, state, hypers, active, partials=None):
    """`adam_update` for every active lane z; hypers (K, 7) float32 holds lane z's [beta1, beta2, 1 - beta1,
    1 - beta2, eps, weight_decay, decoupled (0 or 1)], each the float32 the solo update computes (1 - beta
    rounded from the float64 beta; decoupled 0 without weight decay). Given `partials` (K, PARTIALS), also
    writes every active lane's sum of squares there."""
    for z, lane, lane_compute in _active_lanes(param, compute, active):
        if partials is not None:
            reduce.sum_of_squares(grad[z], partials[z])
        beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, decoupled = hypers[z]
        _adam(lane, grad[z], m[z], v[z], lane_compute, state[z], beta1, beta2, one_minus_beta1, one_minus_beta2,
              eps, weight_decay, decoupled != 0)
