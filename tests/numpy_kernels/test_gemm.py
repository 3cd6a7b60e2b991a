"""NumPy GEMM twins against the same float64 references as the CUDA kernels."""

import numpy as np
import pytest

from mlptrain.activation import RELU, SIGMOID, TANH
from mlptrain.numpy_kernels import gemm
from tests import reference as ref

SHAPES = [(1, 1, 1), (7, 33, 65), (130, 70, 7), (5, 9, 140), (128, 784, 512)]


def random(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def poisoned(shape):
    return np.full(shape, np.nan, np.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
def test_linear_forward(rng, shape, activation):
    m, k, n = shape
    x, w, b = random(rng, m, k), random(rng, k, n), random(rng, n)
    y = poisoned((m, n))
    gemm.linear_forward(x, w, b, y, activation)
    ref.assert_within(y, ref.linear_forward(x, w, b, activation), ref.product_tolerance(x, w, b))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
def test_linear_backward_input(rng, shape, activation):
    m, k, n = shape
    dy, w = random(rng, m, n), random(rng, k, n)
    h = ref.activate(random(rng, m, k), activation).astype(np.float32)
    dx = poisoned((m, k))
    gemm.linear_backward_input(dy, w, h, dx, activation)
    ref.assert_within(dx, ref.linear_backward_input(dy, w, h, activation), ref.product_tolerance(dy, w.T))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_backward_weight(rng, shape, beta):
    m, k, n = shape
    x, dy, old = random(rng, m, k), random(rng, m, n), random(rng, k, n)
    dw = poisoned((k, n)) if beta == 0.0 else old.copy()  # beta 0 must not read dw
    gemm.linear_backward_weight(x, dy, dw, beta)
    ref.assert_within(dw, ref.linear_backward_weight(x, dy, old, beta), ref.product_tolerance(x.T, dy, extra=old))


def test_row_slices_of_a_larger_buffer(rng):
    x, w, b, y_buf = random(rng, 20, 5), random(rng, 5, 3), random(rng, 3), poisoned((20, 3))
    gemm.linear_forward(x[:6], w, b, y_buf[:6], TANH)
    ref.assert_within(y_buf[:6], ref.linear_forward(x[:6], w, b, TANH), ref.product_tolerance(x[:6], w, b))
    assert np.isnan(y_buf[6:]).all()


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
