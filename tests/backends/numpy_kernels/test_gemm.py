"""NumPy GEMM twins against the same float64 references as the CUDA kernels
(the shared cases live in `tests.kernel_cases`)."""

import numpy as np
import pytest

from mlptrain.activation import RELU, SIGMOID, TANH
from mlptrain.backends.numpy_kernels import gemm
from tests import kernel_cases as cases
from tests import reference as ref
from tests.kernel_cases import random

BACKEND = cases.numpy_backend()
SHAPES = [(1, 1, 1), (7, 33, 65), (130, 70, 7), (5, 9, 140), (128, 784, 512)]


def poisoned(shape):
    return BACKEND.poisoned(shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
def test_linear_forward(rng, shape, activation):
    cases.linear_forward(BACKEND, rng, shape, activation)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
def test_linear_backward_input(rng, shape, activation):
    cases.linear_backward_input(BACKEND, rng, shape, activation)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_backward_weight(rng, shape, beta):
    cases.linear_backward_weight(BACKEND, rng, shape, beta)


def test_row_slices_of_a_larger_buffer(rng):
    cases.row_slices_of_a_larger_buffer(BACKEND, rng, TANH)


def test_unknown_activation_is_refused(rng):
    with pytest.raises(ValueError, match="activation"):
        gemm.linear_forward(random(rng, 2, 2), random(rng, 2, 2), random(rng, 2), poisoned((2, 2)), 9)


def test_relu_grad_is_zero_where_the_unit_was_off():
    h = np.array([[0.0, 2.0]], np.float32)
    dx = poisoned((1, 2))
    gemm.linear_backward_input(np.ones((1, 1), np.float32), np.ones((2, 1), np.float32), h, dx, RELU)
    np.testing.assert_array_equal(dx, [[0.0, 1.0]])
    gemm.linear_backward_input(np.ones((1, 1), np.float32), np.ones((2, 1), np.float32), h * 0 + 0.5, dx, SIGMOID)
    np.testing.assert_allclose(dx, [[0.25, 0.25]])


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
@pytest.mark.parametrize("shape", SHAPES[:-1])
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
def test_low_precision_products(rng, dtype, shape, activation):
    cases.linear_forward(BACKEND, rng, shape, activation, dtype)
    cases.linear_backward_input(BACKEND, rng, shape, activation, dtype)
    cases.linear_backward_weight(BACKEND, rng, shape, 1.0, dtype)


def test_backward_weight_takes_a_workspace_it_does_not_need(rng):
    assert BACKEND.kernels.gemm.linear_backward_weight_workspace(4096, 128, 128) == 0
    cases.linear_backward_weight(BACKEND, rng, (50, 7, 5), 1.0, workspace=True)


@pytest.mark.parametrize("trials, shape", [(1, (1, 1, 1)), (3, (7, 33, 65)), (2, (130, 70, 7))])
@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_trial_axis(rng, trials, shape, dtype, beta):
    cases.layer_trials(BACKEND, rng, trials, shape, SIGMOID, beta, dtype)


def test_lane_views_give_each_lane_the_bits_of_its_layer_alone(rng):
    """Weights, biases and weight gradients as lane views of wider rows (packed trials' flat parameters): each
    lane's outputs are bitwise those of the same layer on that lane's own 2-D operands (lanes on the CPU train
    as their runs alone do)."""
    from mlptrain.backends.lanes import lane_view

    lanes, m, k, n = 3, 33, 20, 7
    x, dy, h = random(rng, lanes, m, k), random(rng, lanes, m, n), np.tanh(random(rng, lanes, m, k))
    params, grads = random(rng, lanes, 5 + k * n + n), random(rng, lanes, k * n + 3)
    w, b, dw = lane_view(params, 5, (k, n)), lane_view(params, 5 + k * n, (n,)), lane_view(grads, 0, (k, n))
    old = np.array(dw)
    y, dx = poisoned((lanes, m, n)), poisoned((lanes, m, k))
    gemm.linear_forward(x, w, b, y, TANH)
    gemm.linear_backward_input(dy, w, h, dx, TANH)
    gemm.linear_backward_weight(x, dy, dw, 1.0)
    for lane in range(lanes):
        y1, dx1, dw1 = poisoned((m, n)), poisoned((m, k)), old[lane].copy()
        gemm.linear_forward(x[lane], np.array(w[lane]), np.array(b[lane]), y1, TANH)
        gemm.linear_backward_input(dy[lane], np.array(w[lane]), h[lane], dx1, TANH)
        gemm.linear_backward_weight(x[lane], dy[lane], dw1, 1.0)
        for alone, together in ((y1, y[lane]), (dx1, dx[lane]), (dw1, dw[lane])):
            np.testing.assert_array_equal(alone.view(np.uint32), together.view(np.uint32))


def test_trials_left_out_by_the_mask_are_not_touched(rng):
    """`active` as the CUDA launchers take it: a trial whose entry is 0 keeps its outputs, the others get the
    bits of the launch without a mask (and of launches of their own)."""
    (x, w, b, dy, h, old), packed = cases.layer_trials(BACKEND, rng, 3, (5, 12, 7), SIGMOID, 1.0)
    active = np.array([0, 1, 1], np.int32)
    y, dx, dw = np.full(packed[0].shape, 7.0, np.float32), np.full(packed[1].shape, 7.0, np.float32), old.copy()
    gemm.linear_forward(x, w, b, y, SIGMOID, active=active)
    gemm.linear_backward_input(dy, w, h, dx, SIGMOID, active=active)
    gemm.linear_backward_weight(x, dy, dw, 1.0, active=active)
    for got, together, untouched in zip((y, dx, dw), packed, (7.0, 7.0, old[0])):
        np.testing.assert_array_equal(got[0], np.broadcast_to(untouched, got[0].shape))
        np.testing.assert_array_equal(got[1:], together[1:])
