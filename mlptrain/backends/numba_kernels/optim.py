"""The fused updates of the optimizer step over the flat buffers (CUDA backend).

A step is `reduce.sum_of_squares` (the gradient's norm, deterministic), `step_rules.finish_step` (one thread:
loss scaling, skip, clipping, schedule, bias corrections, all written to the step state) and one fused update
over every parameter, which reads its scalars from the step state, so nothing here waits for the host. Adam's
update can also sum the gradient's squares as it reads it (`partials`, in sum_of_squares's partition): a step
without clipping or loss scaling then needs no pass of its own over the gradient (`step_rules.record_norm`).
The update formulas are documented in `mlptrain.optim.optimizers`; a skipped window returns before touching any
buffer.
"""

import functools
import math

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32, float64
from mlptrain.backends.numba_kernels import streams, wide
from mlptrain.backends.numba_kernels.checks import require, require_lanes, require_lanes_one_of, require_one_of
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES, codec
from mlptrain.backends.numba_kernels.compiled_rules import prepared_state
from mlptrain.backends.numba_kernels.grid_order import after_previous_grid
from mlptrain.backends.numba_kernels.reduce import PARTIALS, SQUARES_THREADS, square_sum
from mlptrain.backends.numba_kernels.update_math import (adam_scalars, adam_value, momentum_element, sgd_element,
                                                         step_scalars)
from mlptrain.backends.numba_kernels.wide import load_quad, store_quad
from mlptrain.optim import step_state
from mlptrain.optim.step_state import APPLY, SIZE

THREADS = 256
MAX_BLOCKS = 2048  # grid-stride beyond this: enough to fill any current GPU

def _grid(size):
    return max(1, min(MAX_BLOCKS, math.ceil(size / THREADS)))


def _check_buffers(param, state, compute, **like_param):
    require("param", param, "float32", (None,))
    for name, array in like_param.items():
        require(name, array, "float32", param.shape)
    require_one_of("compute", compute, STORAGE_DTYPES, param.shape)
    require("state", state, "float64", (step_state.SIZE,))


def _quad_grid(size):
    """The blocks of an update over `size` elements, a thread a quad of four."""
    return _grid(-(-size // 4))


# Blocks of a squares-summing update (reduce's fixed grid, SQUARES_THREADS a block) an SM holds at once, their
# registers capped to fit: uncapped, Adam's took 80 registers a thread, one block an SM, and 134 µs for 16 lanes of
# adam_mnist (2.0 TB/s); capped for two, 64 registers and 90 µs, the lanes' step 337.7 -> 291.4 µs; for three, 40
# and 92 µs; a run's own step the same (51.1 µs; H200, benchmarks/NOTES.md, issue 30 step 26)
UPDATE_BLOCKS_PER_SM = 2


def _update_bounds():
    """The jit options of an update on reduce's fixed grid (None: registers uncapped)."""
    return {} if UPDATE_BLOCKS_PER_SM is None else kernel_cache.launch_bounds(SQUARES_THREADS, UPDATE_BLOCKS_PER_SM)


@functools.cache
def _make_updates(dtype):
    """The three update kernels writing the compute copy in this storage format (write_compute False: fp32, where
    the compute copy is the parameter itself), and Adam's span, which its lane kernel applies to each lane."""
    _, store = codec(dtype)

    # Thread t owns elements t, t + stride, ... of every buffer: no atomics.
    @kernel_cache.jit
    def sgd_update_kernel(param, grad, compute, state, weight_decay, write_compute):
        after_previous_grid()
        if state[APPLY] == 0:
            return
        lr, multiplier = step_scalars(state)
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            p = sgd_element(param, grad, i, lr, multiplier, weight_decay)
            if write_compute:
                compute[i] = store(p)

    # Thread t owns elements t, t + stride, ... of every buffer: no atomics.
    @kernel_cache.jit
    def momentum_update_kernel(param, grad, velocity, compute, state, momentum, weight_decay, nesterov,
                               write_compute):
        after_previous_grid()
        if state[APPLY] == 0:
            return
        lr, multiplier = step_scalars(state)
        for i in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
            p = momentum_element(param, grad, velocity, i, lr, multiplier, momentum, weight_decay, nesterov)
            if write_compute:
                compute[i] = store(p)

    # Thread t owns quads t, t + stride, ... (elements 4q..4q+3; with `quads`, param, grad, m and v 16-byte
    # aligned (wide.aligned_quads), each buffer's four read and written in one access), then the last size % 4
    # elements one each: reduce.sum_of_squares's partition. No atomics; each element's arithmetic is adam_value.
    # Updates only where `apply`; returns the sum of the raw gradient's squares it read, in sum_of_squares's order
    # (an update that ignores it compiles without it).
    @kernel_cache.device
    def adam_span(param, grad, m, v, compute, scalars, beta1, beta2, one_minus_beta1, one_minus_beta2, eps,
                  write_compute, quads, apply):
        size, first, stride = param.shape[0], cuda.grid(1), cuda.gridsize(1)
        rules = (scalars, beta1, beta2, one_minus_beta1, one_minus_beta2, eps)
        squares = float32(0)
        count = size // 4
        for q in range(first, count, stride):
            i = 4 * q
            p0, p1, p2, p3 = load_quad(param, i, quads)
            g0, g1, g2, g3 = load_quad(grad, i, quads)
            a0, a1, a2, a3 = load_quad(m, i, quads)
            b0, b1, b2, b3 = load_quad(v, i, quads)
            squares += g0 * g0
            squares += g1 * g1
            squares += g2 * g2
            squares += g3 * g3
            if apply:
                p0, a0, b0 = adam_value(p0, g0, a0, b0, *rules)
                p1, a1, b1 = adam_value(p1, g1, a1, b1, *rules)
                p2, a2, b2 = adam_value(p2, g2, a2, b2, *rules)
                p3, a3, b3 = adam_value(p3, g3, a3, b3, *rules)
                store_quad(m, i, a0, a1, a2, a3, quads)
                store_quad(v, i, b0, b1, b2, b3, quads)
                store_quad(param, i, p0, p1, p2, p3, quads)
                if write_compute:
                    compute[i], compute[i + 1] = store(p0), store(p1)
                    compute[i + 2], compute[i + 3] = store(p2), store(p3)
        for i in range(4 * count + first, size, stride):
            g = grad[i]
            squares += g * g
            if apply:
                p, m[i], v[i] = adam_value(param[i], g, m[i], v[i], *rules)
                param[i] = p
                if write_compute:
                    compute[i] = store(p)
        return squares

    @kernel_cache.jit
    def adam_update_kernel(param, grad, m, v, compute, state, beta1, beta2, one_minus_beta1, one_minus_beta2, eps,
                           weight_decay, decoupled, write_compute, quads):
        after_previous_grid()
        if state[APPLY] == 0:
            return
        adam_span(param, grad, m, v, compute, adam_scalars(state, weight_decay, decoupled), beta1, beta2,
                  one_minus_beta1, one_minus_beta2, eps, write_compute, quads, True)

    # adam_update_kernel on reduce's fixed grid, also writing the gradient's sum of squares: thread 0 of block b
    # writes partials[b], as reduce.sum_of_squares would. No atomics. Its scalars come from the block's copy of
    # the state, with prepare_step's rules applied to it where `prepare` (compiled_rules.prepared_state).
    @kernel_cache.jit(**_update_bounds())
    def adam_norm_update_kernel(param, grad, m, v, compute, state, partials, lr_schedule, bias_beta1, bias_beta2,
                                prepare, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay,
                                decoupled, write_compute, quads):
        after_previous_grid()
        rules = cuda.shared.array(SIZE, float64)  # a module constant: numba types step_state.SIZE as a variable
        prepared_state(state, lr_schedule, bias_beta1, bias_beta2, prepare, rules)
        squares = adam_span(param, grad, m, v, compute, adam_scalars(rules, weight_decay, decoupled), beta1, beta2,
                            one_minus_beta1, one_minus_beta2, eps, write_compute, quads, rules[APPLY] != 0)
        total = square_sum(squares)
        if cuda.threadIdx.x == 0:
            partials[cuda.blockIdx.x] = total

    return sgd_update_kernel, momentum_update_kernel, adam_update_kernel, adam_span, adam_norm_update_kernel


def sgd_update(param, grad, compute, state, weight_decay):
    """p -= lr * (g + wd * p), g the summed gradient times the step's multiplier."""
    _check_buffers(param, state, compute, grad=grad)
    kernel = _make_updates(compute.dtype)[0]
    kernel[_grid(param.shape[0]), THREADS, streams.current()](param, grad, compute, state, float32(weight_decay),
                                                              compute is not param)


def momentum_update(param, grad, velocity, compute, state, momentum, weight_decay, nesterov):
    """g' = g + wd p; v = mu v + g'; p -= lr * (g' + mu v if nesterov else v)"""
    _check_buffers(param, state, compute, grad=grad, velocity=velocity)
    kernel = _make_updates(compute.dtype)[1]
    kernel[_grid(param.shape[0]), THREADS, streams.current()](
        param, grad, velocity, compute, state, float32(momentum), float32(weight_decay), bool(nesterov),
        compute is not param)


def adam_update(param, grad, m, v, compute, state, beta1, beta2, eps, weight_decay, decoupled, partials=None,
                prepare=None):
    """Adam (decoupled=False: L2 added to g) or AdamW (decoupled=True); lr and the bias corrections
    come from the step state. Given `partials` (float32, (PARTIALS,)), also writes the gradient's sum of squares
    there, the bits `reduce.sum_of_squares(grad, partials)` writes, from the same reads (even where the window
    is skipped). Given `prepare` too (lr_schedule float64, beta1, beta2), the rules come from
    `step_rules.prepare_step` applied to each block's copy of the state, which is left as it is: a launch fewer
    (`step_rules.record_norm` given the same `prepare` writes them after the update)."""
    _check_buffers(param, state, compute, grad=grad, m=m, v=v)
    kernels = _make_updates(compute.dtype)
    quads = all(wide.aligned_quads(a) for a in (param, grad, m, v))
    # 1 - beta from the float64 beta: in float32, 1 - float32(0.999) keeps only 4 significant digits
    rules = (float32(beta1), float32(beta2), float32(1.0 - beta1), float32(1.0 - beta2), float32(eps),
             float32(weight_decay), bool(decoupled) and bool(weight_decay), compute is not param, quads)
    if prepare is not None and partials is None:
        raise ValueError("prepare needs partials")
    if partials is not None:
        require("partials", partials, "float32", (PARTIALS,))
        schedule, bias_beta1, bias_beta2 = (state, 0.0, 0.0) if prepare is None else prepare
        if prepare is not None:
            require("lr_schedule", schedule, "float64", (None,))
        kernels[4][PARTIALS, SQUARES_THREADS, streams.current()](param, grad, m, v, compute, state, partials,
                                                                 schedule, float(bias_beta1), float(bias_beta2),
                                                                 prepare is not None, *rules)
        return
    kernels[2][_quad_grid(param.shape[0]), THREADS, streams.current()](param, grad, m, v, compute, state, *rules)


# --- lanes: one launch updates the packed trials' buffers (K, P), lane z in grid row z -------------------


@functools.cache
def _make_lane_updates(dtype):
    """The lane kernels of `_make_updates`, on the same element functions: lane z's bits are the solo
    update's. An inactive lane's blocks (active[z] == 0) return before reading anything of it."""
    _, store = codec(dtype)

    # Thread t of grid row z owns elements t, t + stride, ... of lane z's buffers: no atomics.
    @kernel_cache.jit
    def sgd_update_lanes_kernel(param, grad, compute, state, hypers, active, write_compute):
        after_previous_grid()
        z = cuda.blockIdx.y
        if active[z] == 0 or state[z, APPLY] == 0:
            return
        lr, multiplier = step_scalars(state[z])
        weight_decay = hypers[z, 0]
        lane_param, lane_grad, lane_compute = param[z], grad[z], compute[z]
        for i in range(cuda.grid(1), lane_param.shape[0], cuda.gridsize(1)):
            p = sgd_element(lane_param, lane_grad, i, lr, multiplier, weight_decay)
            if write_compute:
                lane_compute[i] = store(p)

    # Thread t of grid row z owns elements t, t + stride, ... of lane z's buffers: no atomics.
    @kernel_cache.jit
    def momentum_update_lanes_kernel(param, grad, velocity, compute, state, hypers, active, write_compute):
        after_previous_grid()
        z = cuda.blockIdx.y
        if active[z] == 0 or state[z, APPLY] == 0:
            return
        lr, multiplier = step_scalars(state[z])
        momentum, weight_decay, nesterov = hypers[z, 0], hypers[z, 1], hypers[z, 2] != float32(0)
        lane_param, lane_grad, lane_velocity, lane_compute = param[z], grad[z], velocity[z], compute[z]
        for i in range(cuda.grid(1), lane_param.shape[0], cuda.gridsize(1)):
            p = momentum_element(lane_param, lane_grad, lane_velocity, i, lr, multiplier, momentum, weight_decay,
                                  nesterov)
            if write_compute:
                lane_compute[i] = store(p)

    adam_span = _make_updates(dtype)[3]

    # Grid row z applies the solo update's span (quads or elements) to lane z's buffers: no atomics.
    @kernel_cache.jit
    def adam_update_lanes_kernel(param, grad, m, v, compute, state, hypers, active, write_compute, quads):
        after_previous_grid()
        z = cuda.blockIdx.y
        if active[z] == 0 or state[z, APPLY] == 0:
            return
        rules = hypers[z]
        adam_span(param[z], grad[z], m[z], v[z], compute[z], adam_scalars(state[z], rules[5], rules[6] != float32(0)),
                  rules[0], rules[1], rules[2], rules[3], rules[4], write_compute, quads, True)

    # adam_update_lanes_kernel on reduce's fixed grid in x, also writing each lane's sum of squares: thread 0 of
    # block (b, z) writes partials[z, b], as reduce.sum_of_squares_lanes would. No atomics.
    @kernel_cache.jit(**_update_bounds())
    def adam_norm_update_lanes_kernel(param, grad, m, v, compute, state, partials, hypers, active, write_compute,
                                      quads):
        after_previous_grid()
        z = cuda.blockIdx.y
        if active[z] == 0:  # the whole block, uniformly: none of square_sum's barriers is left waiting
            return
        rules = hypers[z]
        squares = adam_span(param[z], grad[z], m[z], v[z], compute[z],
                            adam_scalars(state[z], rules[5], rules[6] != float32(0)), rules[0], rules[1], rules[2],
                            rules[3], rules[4], write_compute, quads, state[z, APPLY] != 0)
        total = square_sum(squares)
        if cuda.threadIdx.x == 0:
            partials[z, cuda.blockIdx.x] = total

    return (sgd_update_lanes_kernel, momentum_update_lanes_kernel, adam_update_lanes_kernel,
            adam_norm_update_lanes_kernel)


def _check_lane_buffers(param, state, compute, hypers, rules, active, **like_param):
    """The lane count K, after checking every operand of a lane update: `rules` hyperparameters per lane."""
    require("active", active, "int32", (None,))
    lanes = active.shape[0]
    require_lanes("param", param, "float32", (lanes, None))
    size = param.shape[1]
    for name, array in like_param.items():
        require_lanes(name, array, "float32", (lanes, size))
    require_lanes_one_of("compute", compute, STORAGE_DTYPES, (lanes, size))
    require_lanes("state", state, "float64", (lanes, step_state.SIZE))
    require_lanes("hypers", hypers, "float32", (lanes, rules))
    return lanes


def _lane_grid(param):
    return _grid(param.shape[1]), param.shape[0]


def sgd_update_lanes(param, grad, compute, state, hypers, active):
    """`sgd_update` for every active lane z (active[z] != 0) in one launch, on lane z's rows of param, grad,
    compute (K, P) and state (K, step_state.SIZE); hypers (K, 1) float32 holds lane z's [weight_decay].
    compute is param itself in fp32, as for the solo update. Lane operands may be lane views."""
    if _check_lane_buffers(param, state, compute, hypers, 1, active, grad=grad) == 0:
        return
    kernel = _make_lane_updates(compute.dtype)[0]
    kernel[_lane_grid(param), THREADS, streams.current()](param, grad, compute, state, hypers, active,
                                                          compute is not param)


def momentum_update_lanes(param, grad, velocity, compute, state, hypers, active):
    """`momentum_update` for every active lane z, as `sgd_update_lanes`; hypers (K, 3) float32 holds lane
    z's [momentum, weight_decay, nesterov (0 or 1)]."""
    if _check_lane_buffers(param, state, compute, hypers, 3, active, grad=grad, velocity=velocity) == 0:
        return
    kernel = _make_lane_updates(compute.dtype)[1]
    kernel[_lane_grid(param), THREADS, streams.current()](param, grad, velocity, compute, state, hypers, active,
                                                          compute is not param)


def adam_update_lanes(param, grad, m, v, compute, state, hypers, active, partials=None):
    """`adam_update` for every active lane z, as `sgd_update_lanes`; hypers (K, 7) float32 holds lane z's
    [beta1, beta2, 1 - beta1, 1 - beta2, eps, weight_decay, decoupled (0 or 1)], each the float32 the solo
    launcher passes (1 - beta rounded from the float64 beta; decoupled 0 without weight decay). Given `partials`
    (K, PARTIALS) float32, also writes every active lane's sum of squares there, as `adam_update` does."""
    lanes = _check_lane_buffers(param, state, compute, hypers, 7, active, grad=grad, m=m, v=v)
    if partials is not None:
        require_lanes("partials", partials, "float32", (lanes, PARTIALS))
    if lanes == 0:
        return
    kernels = _make_lane_updates(compute.dtype)
    quads = all(wide.aligned_quads(a) for a in (param, grad, m, v))
    args = (compute, state, hypers, active, compute is not param, quads)
    if partials is not None:
        kernels[3][(PARTIALS, lanes), SQUARES_THREADS, streams.current()](param, grad, m, v, compute, state,
                                                                            partials, *args[2:])
        return
    kernels[2][(_quad_grid(param.shape[1]), lanes), THREADS, streams.current()](param, grad, m, v, *args)
