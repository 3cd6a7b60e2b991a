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
