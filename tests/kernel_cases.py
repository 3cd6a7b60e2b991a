"""Kernel test cases shared by both backends.

`tests/numba_kernels/test_*.py` and `tests/numpy_kernels/test_*.py` hold the
parametrisations, markers and backend-only tests; the body of every case both
run lives here once, and takes a `Backend`: the kernels package plus how an
array reaches it (`to_device`) and comes back (`to_host`). Outputs start
poisoned (NaN, or -7 for integers) so that an element a kernel never writes
fails the comparison with the float64 references of `tests.reference`.
"""

from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import numpy as np
import pytest

from mlptrain.dtypes import from_float32, to_float32
from mlptrain.optim import step_state
from tests import reference as ref

FORMATS = [np.float32, np.float16, np.uint16]  # fp32, fp16, bf16 storage
FORMAT_IDS = ["fp32", "fp16", "bf16"]


@dataclass(frozen=True)
class Backend:
    kernels: ModuleType  # mlptrain.backends.numba_kernels or mlptrain.backends.numpy_kernels
    to_device: Callable  # host array -> a fresh array the kernels take
    to_host: Callable  # such an array -> NumPy array

    def poisoned(self, shape, fill=np.nan, dtype=np.float32):
        """An array full of NaN (bf16's quiet NaN in uint16), or of `fill` for integers."""
        if np.dtype(dtype) == np.uint16:
            return self.to_device(np.full(shape, 0x7FC0, np.uint16))
        return self.to_device(np.full(shape, fill, dtype))


def numba_backend():
    """CUDA device arrays (the real GPU or the simulator, as conftest chose)."""
    import mlptrain.backends.numba_kernels
    from mlptrain.backends.numba_kernels import current

    return Backend(mlptrain.backends.numba_kernels, current.to_device, lambda array: array.copy_to_host())


def numpy_backend():
    """Plain NumPy; `to_device` copies, so kernels never write the test's own arrays."""
    import mlptrain.backends.numpy_kernels

    return Backend(mlptrain.backends.numpy_kernels, np.array, np.asarray)


def random(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def stored(values, dtype):
    """(the array in storage format `dtype`, the float32 values it holds): references start from the
    values a kernel actually reads."""
    array = from_float32(values, dtype)
    return array, to_float32(array)


# gemm


def hidden_output(rng, shape, activation):
    """A valid activation output h = act(z) (ReLU outputs include exact zeros)."""
    return ref.activate(random(rng, *shape), activation).astype(np.float32)


def rows_workspace(be, rows, summed, outputs, workspace, engine):
    """The poisoned workspace a forward or input gradient on `engine` asks for (`workspace` True; it may then sum
    its K in chunks), else None."""
    if not workspace:
        return None
    return be.poisoned(max(1, be.kernels.gemm.linear_rows_workspace(rows, summed, outputs, engine)))


def linear_forward(be, rng, shape, activation, dtype=np.float32, workspace=False, engine="fma"):
    """y rounded once (twice through tanh / sigmoid, whose slope is <= 1) from a float32 sum, on `engine`.
    Returns y."""
    m, k, n = shape
    (x, xv), (w, wv), (b, bv) = (stored(random(rng, *s), dtype) for s in ((m, k), (k, n), (n,)))
    y = be.poisoned((m, n), dtype=dtype)
    be.kernels.gemm.linear_forward(be.to_device(x), be.to_device(w), be.to_device(b), y, activation, engine,
                                   workspace=rows_workspace(be, m, k, n, workspace, engine))
    magnitude = np.abs(xv.astype(np.float64)) @ np.abs(wv) + np.abs(bv)
    got = be.to_host(y)
    ref.assert_within(to_float32(got), ref.linear_forward(xv, wv, bv, activation),
                      ref.product_tolerance(xv, wv, bv) + 2 * ref.rounding_tolerance(dtype, magnitude))
    return got


def linear_backward_input(be, rng, shape, activation, dtype=np.float32, workspace=False, engine="fma"):
    """On `engine`; returns dx."""
    m, k, n = shape
    (dy, dyv), (w, wv) = stored(random(rng, m, n), dtype), stored(random(rng, k, n), dtype)
    h, hv = stored(hidden_output(rng, (m, k), activation), dtype)
    dx = be.poisoned((m, k), dtype=dtype)
    be.kernels.gemm.linear_backward_input(be.to_device(dy), be.to_device(w), be.to_device(h), dx, activation,
                                          engine, workspace=rows_workspace(be, m, n, k, workspace, engine))
    expected = ref.linear_backward_input(dyv, wv, hv, activation)
    magnitude = np.abs(dyv.astype(np.float64)) @ np.abs(wv.T)
    got = be.to_host(dx)
    ref.assert_within(to_float32(got), expected,
                      ref.product_tolerance(dyv, wv.T) + 2 * ref.rounding_tolerance(dtype, magnitude))
    return got


def linear_backward_weight(be, rng, shape, beta, dtype=np.float32, workspace=False, engine="fma"):
    """dw is float32 in every precision: only the inputs are in the storage format. With `workspace`, the
    launch on `engine` gets the workspace it asks for (a long batch is then summed in chunks), poisoned."""
    m, k, n = shape
    (x, xv), (dy, dyv) = stored(random(rng, m, k), dtype), stored(random(rng, m, n), dtype)
    old = random(rng, k, n)
    # beta 0 must not read dw: NaN there would leak into the result
    dw = be.poisoned((k, n)) if beta == 0.0 else be.to_device(old)
    gemm = be.kernels.gemm
    space = be.poisoned(max(1, gemm.linear_backward_weight_workspace(m, k, n, engine=engine))) if workspace else None
    gemm.linear_backward_weight(be.to_device(x), be.to_device(dy), dw, beta, space, engine)
    expected = ref.linear_backward_weight(xv, dyv, old, beta)
    ref.assert_within(be.to_host(dw), expected, ref.product_tolerance(xv.T, dyv, extra=old))


def row_slices_of_a_larger_buffer(be, rng, activation):
    """Layers run on buf[:rows] views of buffers sized for the largest batch."""
    x, w, b = random(rng, 20, 5), random(rng, 5, 3), random(rng, 3)
    y_buf = be.poisoned((20, 3))
    be.kernels.gemm.linear_forward(be.to_device(x)[:6], be.to_device(w), be.to_device(b), y_buf[:6], activation)
    y = be.to_host(y_buf)
    ref.assert_within(y[:6], ref.linear_forward(x[:6], w, b, activation), ref.product_tolerance(x[:6], w, b))
    assert np.isnan(y[6:]).all()  # rows past the slice untouched


def layer_trials(be, rng, trials, shape, activation, beta, dtype=np.float32, engine="fma"):
    """One launch per pass of a layer's three GEMMs over a leading trial axis, summed by `engine`: each trial's
    outputs against the float64 references of its own operands; returns (inputs, outputs) as host arrays, per
    trial."""
    m, k, n = shape
    (x, xv), (w, wv), (b, bv), (dy, dyv) = (stored(random(rng, trials, *s), dtype)
                                            for s in ((m, k), (k, n), (n,), (m, n)))
    h, hv = stored(hidden_output(rng, (trials, m, k), activation), dtype)
    old = random(rng, trials, k, n)
    y, dx = be.poisoned((trials, m, n), dtype=dtype), be.poisoned((trials, m, k), dtype=dtype)
    dw = be.poisoned((trials, k, n)) if beta == 0.0 else be.to_device(old)
    gemm = be.kernels.gemm
    gemm.linear_forward(be.to_device(x), be.to_device(w), be.to_device(b), y, activation, engine)
    gemm.linear_backward_input(be.to_device(dy), be.to_device(w), be.to_device(h), dx, activation, engine)
    gemm.linear_backward_weight(be.to_device(x), be.to_device(dy), dw, beta, engine=engine)
    outputs = [to_float32(be.to_host(a)) for a in (y, dx)] + [be.to_host(dw)]
    for t in range(trials):
        rounding = 2 * ref.rounding_tolerance(dtype, np.abs(xv[t].astype(np.float64)) @ np.abs(wv[t]) + np.abs(bv[t]))
        ref.assert_within(outputs[0][t], ref.linear_forward(xv[t], wv[t], bv[t], activation),
                          ref.product_tolerance(xv[t], wv[t], bv[t]) + rounding)
        rounding = 2 * ref.rounding_tolerance(dtype, np.abs(dyv[t].astype(np.float64)) @ np.abs(wv[t].T))
        ref.assert_within(outputs[1][t], ref.linear_backward_input(dyv[t], wv[t], hv[t], activation),
                          ref.product_tolerance(dyv[t], wv[t].T) + rounding)
        ref.assert_within(outputs[2][t], ref.linear_backward_weight(xv[t], dyv[t], old[t], beta),
                          ref.product_tolerance(xv[t].T, dyv[t], extra=old[t]))
    return (x, w, b, dy, h, old), outputs


def check_layer(inputs, outputs, forward_activation, backward_activation, beta):
    """The three GEMMs of one layer, (y, dx, dw) from x, w, b, dy, h and the old dw."""
    x, w, b, dy, h, old = inputs
    y, dx, dw = outputs
    ref.assert_within(y, ref.linear_forward(x, w, b, forward_activation), ref.product_tolerance(x, w, b))
    ref.assert_within(dx, ref.linear_backward_input(dy, w, h, backward_activation), ref.product_tolerance(dy, w.T))
    ref.assert_within(dw, ref.linear_backward_weight(x, dy, old, beta), ref.product_tolerance(x.T, dy, extra=old))


# loss


def softmax_cross_entropy_run(be, logits, labels, grad_scale, offset=0, extra=3, loss_scale=1.0):
    """Launch on poisoned outputs (dlogits in logits' storage format); row_loss/row_correct have
    `extra` spare slots."""
    rows, classes = logits.shape
    dlogits = be.poisoned((rows, classes), dtype=logits.dtype)
    row_loss = be.poisoned(offset + rows + extra)
    row_correct = be.poisoned(offset + rows + extra, -7, np.int32)
    be.kernels.loss.softmax_cross_entropy(be.to_device(logits), be.to_device(labels), dlogits, row_loss, row_correct,
                                          offset, grad_scale, be.to_device(np.array([loss_scale])))
    return to_float32(be.to_host(dlogits)), be.to_host(row_loss), be.to_host(row_correct)


def softmax_cross_entropy_check(be, logits, labels, grad_scale, offset=0, loss_scale=1.0):
    """logits may be in any storage format; the reference starts from the values they hold."""
    rows = logits.shape[0]
    dlogits, row_loss, row_correct = softmax_cross_entropy_run(be, logits, labels, grad_scale, offset,
                                                               loss_scale=loss_scale)
    values = to_float32(logits)
    expected_loss, expected_correct, expected_grad = ref.softmax_cross_entropy(values, labels, grad_scale * loss_scale)
    spread = np.abs(values - values.max(axis=1, keepdims=True)).max(axis=1)
    ref.assert_within(row_loss[offset:offset + rows], expected_loss, 2e-6 * (1 + spread + np.log(logits.shape[1])))
    np.testing.assert_array_equal(row_correct[offset:offset + rows], expected_correct)
    scale = abs(grad_scale * loss_scale)
    ref.assert_within(dlogits, expected_grad, 1e-6 * scale + ref.rounding_tolerance(logits.dtype, np.abs(expected_grad)))
    assert np.isnan(row_loss[:offset]).all() and np.isnan(row_loss[offset + rows:]).all()
    assert (row_correct[:offset] == -7).all() and (row_correct[offset + rows:] == -7).all()


def softmax_cross_entropy(be, rng, rows, classes, dtype=np.float32, loss_scale=1.0):
    logits, _ = stored((3 * rng.standard_normal((rows, classes))).astype(np.float32), dtype)
    labels = rng.integers(0, classes, rows).astype(np.int32)
    softmax_cross_entropy_check(be, logits, labels, grad_scale=1.0 / (2 * rows), offset=4, loss_scale=loss_scale)


def argmax_ties_go_to_the_first_max(be):
    logits = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 5, 1, 5], [4, 4, 0, 0]], np.float32)
    labels = np.array([2, 0, 1, 1], np.int32)
    _, _, row_correct = softmax_cross_entropy_run(be, logits, labels, 1.0)
    np.testing.assert_array_equal(row_correct[:4], [-2, 1, 1, -1])  # a miss: -1 - the (first) argmax
    softmax_cross_entropy_check(be, logits, labels, 1.0)


def numerically_stable_for_large_logits(be, rng):
    logits = (1000 + rng.standard_normal((6, 10))).astype(np.float32)
    logits[1] -= 2000
    labels = rng.integers(0, 10, 6).astype(np.int32)
    softmax_cross_entropy_check(be, logits, labels, 0.25)


# reduce


def bias_backward(be, rng, rows, columns, beta, dtype=np.float32, workspace=False):
    """db is float32 in every precision; dy may be in a storage format. With `workspace`, the launcher
    gets a (poisoned) workspace of the size it asks for, so long gradients are summed in chunks."""
    dy, dyv = stored(rng.standard_normal((rows, columns)).astype(np.float32), dtype)
    old = rng.standard_normal(columns).astype(np.float32)
    # beta 0 must not read db: NaN there would leak into the result
    db = be.poisoned(columns) if beta == 0.0 else be.to_device(old)
    space = be.poisoned(max(1, be.kernels.reduce.bias_backward_workspace(rows, columns))) if workspace else None
    be.kernels.reduce.bias_backward(be.to_device(dy), db, beta, space)
    tolerance = 2e-6 * np.sqrt(rows) * (np.abs(dyv).sum(axis=0) + np.abs(old)) + 1e-7
    ref.assert_within(be.to_host(db), ref.bias_backward(dyv, old, beta), tolerance)


def sum_of_squares(be, rng, size):
    x = random(rng, size)
    partials = be.poisoned(be.kernels.reduce.PARTIALS)
    be.kernels.reduce.sum_of_squares(be.to_device(x), partials)
    expected = np.sum(x.astype(np.float64) ** 2)
    ref.assert_within(be.to_host(partials).astype(np.float64).sum(), expected, 2e-6 * np.sqrt(size) * expected + 1e-7)


# optim


def buffers(rng, size, count):
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def close(got, expected, lr=0.0):
    ref.assert_within(got, expected, 2e-6 * (np.abs(expected) + lr) + 1e-7)


MULTIPLIER = 0.5  # unscale x clip, applied to the summed gradient before anything else


def state_for(be, lr, step=1, betas=(0.9, 0.999), apply=True):
    """A step state as `finish_step` leaves it for an applied (or skipped) step."""
    state = np.zeros(step_state.SIZE)
    state[step_state.APPLY] = 1.0 if apply else 0.0
    state[step_state.LR], state[step_state.GRAD_MULTIPLIER] = lr, MULTIPLIER
    state[step_state.BIAS_CORRECTION1] = 1.0 - betas[0] ** step
    state[step_state.BIAS_CORRECTION2] = np.sqrt(1.0 - betas[1] ** step)
    return be.to_device(state)


def compute_copy(be, d_param, size, dtype):
    """fp32 computes from the parameters themselves; fp16 / bf16 from a copy the update rewrites."""
    return d_param if np.dtype(dtype) == np.float32 else be.poisoned(size, dtype=dtype)


def check_compute_copy(be, d_param, compute, dtype):
    if np.dtype(dtype) != np.float32:
        np.testing.assert_array_equal(be.to_host(compute), from_float32(be.to_host(d_param), dtype))


def sgd_update(be, rng, size, weight_decay, dtype=np.float32):
    param, grad = buffers(rng, size, 2)
    d_param = be.to_device(param)
    compute = compute_copy(be, d_param, size, dtype)
    be.kernels.optim.sgd_update(d_param, be.to_device(grad), compute, state_for(be, 0.1), weight_decay)
    close(be.to_host(d_param), ref.sgd_update(param, MULTIPLIER * grad, 0.1, weight_decay), lr=0.1)
    check_compute_copy(be, d_param, compute, dtype)


def momentum_update(be, rng, size, nesterov, dtype=np.float32):
    param, grad, velocity = buffers(rng, size, 3)
    d_param, d_velocity = be.to_device(param), be.to_device(velocity)
    compute = compute_copy(be, d_param, size, dtype)
    be.kernels.optim.momentum_update(d_param, be.to_device(grad), d_velocity, compute, state_for(be, 0.05), 0.9,
                                     1e-3, nesterov)
    expected_param, expected_velocity = ref.momentum_update(param, MULTIPLIER * grad, velocity, 0.05, 0.9, 1e-3,
                                                            nesterov)
    close(be.to_host(d_velocity), expected_velocity)
    close(be.to_host(d_param), expected_param, lr=0.05)
    check_compute_copy(be, d_param, compute, dtype)


def adam_run(be, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step, dtype=np.float32):
    """(param, m, v, compute copy) on the host after one `optim.adam_update` at this step."""
    d_param, d_m, d_v = be.to_device(param), be.to_device(m), be.to_device(v)
    compute = compute_copy(be, d_param, param.size, dtype)
    be.kernels.optim.adam_update(d_param, be.to_device(grad), d_m, d_v, compute,
                                 state_for(be, lr, step, (beta1, beta2)), beta1, beta2, eps, weight_decay, decoupled)
    check_compute_copy(be, d_param, compute, dtype)
    return be.to_host(d_param), be.to_host(d_m), be.to_host(d_v), be.to_host(compute)


def adam_update(be, rng, size, weight_decay, decoupled, step, dtype=np.float32):
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(buffers(rng, size, 1)[0])
    args = (1e-3, 0.9, 0.999, 1e-8, weight_decay, decoupled, step)
    got_param, got_m, got_v, _ = adam_run(be, param, grad, m, v, *args, dtype=dtype)
    expected_param, expected_m, expected_v = ref.adam_update(param, MULTIPLIER * grad, m, v, *args)
    close(got_m, expected_m)
    close(got_v, expected_v)
    close(got_param, expected_param, lr=1e-3)


def skipped_update_touches_nothing(be, rng, size, dtype):
    """APPLY = 0 (an fp16 window with an inf): every buffer keeps its exact bits."""
    param, grad, m = buffers(rng, size, 3)
    grad[0] = np.inf
    v = np.abs(m)
    d_param, d_m, d_v = be.to_device(param), be.to_device(m), be.to_device(v)
    compute = compute_copy(be, d_param, size, dtype)
    before = be.to_host(compute).copy()
    state = state_for(be, 1e-3, apply=False)
    be.kernels.optim.adam_update(d_param, be.to_device(grad), d_m, d_v, compute, state, 0.9, 0.999, 1e-8, 0.1, True)
    be.kernels.optim.sgd_update(d_param, be.to_device(grad), compute, state, 0.0)
    for got, want in ((d_param, param), (d_m, m), (d_v, v), (compute, before)):
        np.testing.assert_array_equal(be.to_host(got).view(np.uint8), np.asarray(want).view(np.uint8))


def adam_sums_the_gradient(be, rng, size, dtype=np.float32, apply=True):
    """adam_update given `partials`: the bits reduce.sum_of_squares writes for the gradient there, and the
    update's own bits in every buffer (a skipped window's untouched), its buffers aligned (quads) or one element
    into wider ones (an element an access) alike."""
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(m)
    count = be.kernels.reduce.PARTIALS
    want = be.poisoned(count)
    be.kernels.reduce.sum_of_squares(be.to_device(grad), want)
    state = state_for(be, 1e-3, 3, apply=apply)
    rules = (0.9, 0.999, 1e-8, 0.1, True)
    results = []
    for offset, partials in ((0, None), (0, be.poisoned(count)), (1, be.poisoned(count))):
        d = [be.to_device(np.concatenate([np.zeros(offset, np.float32), a]))[offset:] for a in (param, grad, m, v)]
        compute = compute_copy(be, d[0], size, dtype)
        be.kernels.optim.adam_update(*d, compute, state, *rules, partials=partials)
        if partials is not None:
            np.testing.assert_array_equal(be.to_host(partials).view(np.uint32), be.to_host(want).view(np.uint32))
        results.append([be.to_host(a).view(np.uint8) for a in (d[0], d[2], d[3], compute)])
    for plain, summed, shifted in zip(*results):
        np.testing.assert_array_equal(summed, plain)
        np.testing.assert_array_equal(shifted, plain)
    if not apply:
        np.testing.assert_array_equal(results[0][0], param.view(np.uint8))
    total = np.sum(grad.astype(np.float64) ** 2)
    ref.assert_within(be.to_host(want).astype(np.float64).sum(), total, 2e-6 * np.sqrt(size) * total + 1e-7)


def norm_later_is_finish_step(be, rng):
    """Under step_state.norm_later (no clipping, no loss scaling), prepare_step before the update and
    record_norm after it leave finish_step's state and grad-norm record, window after window; so does
    record_norm given `prepare` alone (the update having taken its rules from its own copy)."""
    table = np.linspace(1e-3, 1e-4, 3)  # held past its end at the fourth window
    host = np.zeros(step_state.SIZE)
    host[step_state.LOSS_SCALE], host[step_state.LR_FACTOR] = 1.0, 0.5
    states, norms = [be.to_device(host) for _ in range(3)], [be.to_device(np.zeros(3)) for _ in range(3)]
    rules = be.kernels.step_rules
    for window in range(4):  # the fourth window's norm finds no room in the record: counted, not written
        count = be.kernels.reduce.PARTIALS - window  # chains of partials, and a remainder after them
        partials = be.to_device(rng.uniform(0.0, 2.0, count).astype(np.float32))
        rules.finish_step(partials, states[0], be.to_device(table), norms[0], 0.0, 0.9, 0.99, False, 2.0, 0.5, 5)
        rules.prepare_step(states[1], be.to_device(table), 0.9, 0.99)
        rules.record_norm(partials, states[1], norms[1])
        rules.record_norm(partials, states[2], norms[2], prepare=(be.to_device(table), 0.9, 0.99))
    for a, b, c in (states, norms):
        np.testing.assert_array_equal(be.to_host(b).view(np.uint64), be.to_host(a).view(np.uint64))
        np.testing.assert_array_equal(be.to_host(c).view(np.uint64), be.to_host(a).view(np.uint64))
    assert be.to_host(states[1])[step_state.WINDOWS] == 4


def adam_prepares_its_own_rules(be, rng, size, dtype=np.float32):
    """adam_update given `prepare` beside its partials, then record_norm given the same `prepare`: the bits of
    prepare_step, the plain update and record_norm in every buffer, the partials, the state and the record, window
    after window; the update alone leaves the state as it found it."""
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(m)
    host = np.zeros(step_state.SIZE)
    host[step_state.LOSS_SCALE], host[step_state.LR_FACTOR], host[step_state.STEP] = 1.0, 0.5, 2.0
    table = be.to_device(np.linspace(1e-3, 1e-4, 3))
    update, rules = be.kernels.optim.adam_update, be.kernels.step_rules
    results = []
    for fold in (False, True):
        d = [be.to_device(a) for a in (param, grad, m, v)]
        compute = compute_copy(be, d[0], size, dtype)
        state, norms = be.to_device(host), be.to_device(np.zeros(3))
        partials = be.poisoned(be.kernels.reduce.PARTIALS)
        for _ in range(2):
            if fold:
                before = be.to_host(state).copy()
                update(*d, compute, state, 0.9, 0.999, 1e-8, 0.1, True, partials=partials, prepare=(table, 0.9, 0.999))
                np.testing.assert_array_equal(be.to_host(state).view(np.uint64), before.view(np.uint64))
                rules.record_norm(partials, state, norms, prepare=(table, 0.9, 0.999))
            else:
                rules.prepare_step(state, table, 0.9, 0.999)
                update(*d, compute, state, 0.9, 0.999, 1e-8, 0.1, True, partials=partials)
                rules.record_norm(partials, state, norms)
        results.append([be.to_host(a).view(np.uint8) for a in (*d, compute, partials, state, norms)])
    for plain, folded in zip(*results):
        np.testing.assert_array_equal(folded, plain)
    assert be.to_host(state)[step_state.STEP] == 4
    with pytest.raises(ValueError, match="prepare needs partials"):
        update(*d, compute, state, 0.9, 0.999, 1e-8, 0.1, True, prepare=(table, 0.9, 0.999))


# data


def gather_batch_check(be, images, labels, indices, start, n, dtype=np.float32):
    x = be.poisoned((n, images.shape[1]), dtype=dtype)
    y = be.poisoned(n, -7, np.int32)
    be.kernels.data.gather_batch(be.to_device(images), be.to_device(labels), be.to_device(indices), start, x, y,
                                 1 / 255, -0.5)
    expected_x, expected_y = ref.gather_batch(images, labels, indices, start, n, 1 / 255, -0.5)
    ref.assert_within(to_float32(be.to_host(x)), expected_x, 1e-6 + ref.rounding_tolerance(dtype, np.abs(expected_x)))
    np.testing.assert_array_equal(be.to_host(y), expected_y)


def gather_batch(be, rng, index_dtype, rows, width, start, n, dtype=np.float32):
    images = rng.integers(0, 256, (rows, width), dtype=np.uint8)
    labels = rng.integers(0, 10, rows, dtype=np.uint8)
    indices = rng.permutation(rows).astype(index_dtype)
    gather_batch_check(be, images, labels, indices, start, n, dtype)


# the device cursor (a replayed CUDA graph's position in the epoch)


def cursor_moves_every_windowed_launch(be, rng):
    """A cursor adds cursor[0] to the host offset of gather_batch and of both losses, bit for bit, and the
    step's rules (record_norm, finish_step) move it on the device after their own work; given no cursor,
    they move none and refuse an advance."""
    images = rng.integers(0, 256, (20, 6), dtype=np.uint8)
    labels = rng.integers(0, 4, 20, dtype=np.uint8)
    d_images, d_labels, d_indices = be.to_device(images), be.to_device(labels), be.to_device(rng.permutation(20))
    cursor = be.to_device(np.array([5], np.int64))
    rules, host = be.kernels.step_rules, np.zeros(step_state.SIZE)
    host[step_state.LOSS_SCALE] = host[step_state.LR_FACTOR] = 1.0
    state, norms, table = be.to_device(host), be.to_device(np.zeros(4)), be.to_device(np.ones(2))
    partials = be.to_device(np.full(be.kernels.reduce.PARTIALS, 0.25, np.float32))
    rules.record_norm(partials, state, norms, cursor, 3)
    rules.finish_step(partials, state, table, norms, 0.0, 0.9, 0.99, False, 2.0, 0.5, 5, cursor, 1)
    rules.record_norm(partials, state, norms)
    assert be.to_host(cursor).tolist() == [9]
    assert be.to_host(state)[step_state.WINDOWS] == 3  # each did its own work too
    with pytest.raises(ValueError, match="advance needs a cursor"):
        rules.record_norm(partials, state, norms, None, 2)
    outputs = []
    for start, given in ((11, None), (2, cursor)):
        x, y = be.poisoned((6, 6)), be.poisoned(6, -7, np.int32)
        be.kernels.data.gather_batch(d_images, d_labels, d_indices, start, x, y, 1 / 255, -0.5, given)
        row_loss, row_correct, mse_loss = be.poisoned(20), be.poisoned(20, -7, np.int32), be.poisoned(20)
        logits, target = be.to_device(be.to_host(x)[:, :4].copy()), be.to_device(np.zeros((6, 6), np.float32))
        be.kernels.loss.softmax_cross_entropy(logits, y, be.poisoned((6, 4)), row_loss,
                                              row_correct, start - 2, 0.5, be.to_device(np.ones(1)), given)
        be.kernels.loss.mse(x, target, be.poisoned((6, 6)), mse_loss, start - 2, 0.5, be.to_device(np.ones(1)), given)
        outputs.append([be.to_host(a) for a in (x, y, row_loss, row_correct, mse_loss)])
    for got, want in zip(outputs[1], outputs[0]):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert not np.isnan(outputs[0][2][9:15]).any() and np.isnan(outputs[0][2][:9]).all()
