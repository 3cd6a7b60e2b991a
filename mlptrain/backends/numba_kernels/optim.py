"""The optimizer step over the flat buffers (CUDA backend): three launches.

`reduce.sum_of_squares` (the gradient's norm, deterministic), `finish_step`
(one thread: loss scaling, skip, clipping, schedule, bias corrections, all
written to the step state) and one fused update over every parameter, which
reads its scalars from the step state, so nothing here waits for the host.
The update formulas are documented in `mlptrain.optim.optimizers`; a skipped
window returns before touching any buffer.
"""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32
from mlptrain.backends.numba_kernels import streams
from mlptrain.backends.numba_kernels.checks import require, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.optim import step_state
from mlptrain.optim.step_state import APPLY, BIAS_CORRECTION1, BIAS_CORRECTION2, GRAD_MULTIPLIER, LR

THREADS = 256
MAX_BLOCKS = 2048  # grid-stride beyond this: enough to fill any current GPU

_finish_step_device = cuda.jit(device=True)(step_state.finish_step)


# One thread: the decisions are a handful of scalars; a launch is cheaper than a round-trip.
@kernel_cache.jit
def finish_step_kernel(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                       dynamic_scaling, growth_factor, backoff_factor, growth_interval):
    if cuda.grid(1) == 0:
        _finish_step_device(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                            dynamic_scaling, growth_factor, backoff_factor, growth_interval)


def finish_step(partials, state, lr_schedule, grad_norms, max_norm, beta1, beta2,
                dynamic_scaling, growth_factor, backoff_factor, growth_interval):
    """See `mlptrain.optim.step_state.finish_step`; partials float32, the rest float64 device arrays."""
    require("partials", partials, "float32", (None,))
    require("state", state, "float64", (step_state.SIZE,))
    require("lr_schedule", lr_schedule, "float64", (None,))
    require("grad_norms", grad_norms, "float64", (None,))
    if lr_schedule.shape[0] == 0:
        raise ValueError("lr_schedule must hold at least one step")
    finish_step_kernel[1, 1, streams.current()](partials, state, lr_schedule, grad_norms, float(max_norm), float(beta1), float(beta2),
                             bool(dynamic_scaling), float(growth_factor), float(backoff_factor),
                             float(growth_interval))


def _grid(size):
    return max(1, min(MAX_BLOCKS, math.ceil(size / THREADS)))


def _check_buffers(param, state, compute, **like_param):
    require("param", param, "float32", (None,))
    for name, array in like_param.items():
        require(name, array, "float32", param.shape)
    require_one_of("compute", compute, STORAGE_DTYPES, param.shape)
    require("state", state, "float64", (step_state.SIZE,))


@functools.cache
def _make_updates(dtype):
    """The three update kernels writing the compute copy in this storage format
    (write_compute False: fp32, where the compute copy is the parameter itself)."""
    _, store = codec(dtype)

    # Thread t owns elements t, t + stride, ... of every buffer: no atomics.
    @kernel_cache.jit
    def sgd_update_kernel(param, grad, compute, state, weight_decay, write_compute):
        if state[APPLY] == 0:
            return
        lr, multiplier = float32(state[LR]), float32(state[GRAD_MULTIPLIER])
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            g = grad[i] * multiplier
            if weight_decay != float32(0):
                g = g + weight_decay * param[i]
            p = param[i] - lr * g
            param[i] = p
            if write_compute:
                compute[i] = store(p)

    # Thread t owns elements t, t + stride, ... of every buffer: no atomics.
    @kernel_cache.jit
    def momentum_update_kernel(param, grad, velocity, compute, state, momentum, weight_decay, nesterov,
                               write_compute):
        if state[APPLY] == 0:
            return
        lr, multiplier = float32(state[LR]), float32(state[GRAD_MULTIPLIER])
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            g = grad[i] * multiplier
            if weight_decay != float32(0):
                g = g + weight_decay * param[i]
            v = momentum * velocity[i] + g
            velocity[i] = v
            step = g + momentum * v if nesterov else v
            p = param[i] - lr * step
            param[i] = p
            if write_compute:
                compute[i] = store(p)

    # Thread t owns elements t, t + stride, ... of every buffer: no atomics.
    @kernel_cache.jit
    def adam_update_kernel(param, grad, m, v, compute, state, beta1, beta2, one_minus_beta1, one_minus_beta2, eps,
                           weight_decay, decoupled, write_compute):
        if state[APPLY] == 0:
            return
        lr, multiplier = float32(state[LR]), float32(state[GRAD_MULTIPLIER])
        step_size = lr / float32(state[BIAS_CORRECTION1])
        bias_correction2 = float32(state[BIAS_CORRECTION2])
        decay = float32(1) - lr * weight_decay if decoupled else float32(1)
        l2 = float32(0) if decoupled else weight_decay
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            p, g = param[i], grad[i] * multiplier
            if decay != float32(1):  # AdamW: decoupled decay
                p = p * decay
            if l2 != float32(0):  # Adam with weight decay: L2 in the gradient
                g = g + l2 * p
            m_i = beta1 * m[i] + one_minus_beta1 * g
            v_i = beta2 * v[i] + one_minus_beta2 * g * g
            m[i] = m_i
            v[i] = v_i
            p = p - step_size * m_i / (math.sqrt(v_i) / bias_correction2 + eps)
            param[i] = p
            if write_compute:
                compute[i] = store(p)

    return sgd_update_kernel, momentum_update_kernel, adam_update_kernel


def sgd_update(param, grad, compute, state, weight_decay):
    """p -= lr * (g + wd * p), g the summed gradient times the step's multiplier."""
    _check_buffers(param, state, compute, grad=grad)
    kernel = _make_updates(compute.dtype)[0]
    kernel[_grid(param.shape[0]), THREADS, streams.current()](param, grad, compute, state, float32(weight_decay), compute is not param)


def momentum_update(param, grad, velocity, compute, state, momentum, weight_decay, nesterov):
    """g' = g + wd p; v = mu v + g'; p -= lr * (g' + mu v if nesterov else v)"""
    _check_buffers(param, state, compute, grad=grad, velocity=velocity)
    kernel = _make_updates(compute.dtype)[1]
    kernel[_grid(param.shape[0]), THREADS, streams.current()](param, grad, velocity, compute, state, float32(momentum),
                                           float32(weight_decay), bool(nesterov), compute is not param)


def adam_update(param, grad, m, v, compute, state, beta1, beta2, eps, weight_decay, decoupled):
    """Adam (decoupled=False: L2 added to g) or AdamW (decoupled=True); lr and the bias corrections
    come from the step state."""
    _check_buffers(param, state, compute, grad=grad, m=m, v=v)
    kernel = _make_updates(compute.dtype)[2]
    # 1 - beta from the float64 beta: in float32, 1 - float32(0.999) keeps only 4 significant digits
    kernel[_grid(param.shape[0]), THREADS, streams.current()](param, grad, m, v, compute, state, float32(beta1), float32(beta2),
                                           float32(1.0 - beta1), float32(1.0 - beta2), float32(eps), float32(weight_decay), bool(decoupled) and bool(weight_decay),
                                           compute is not param)
