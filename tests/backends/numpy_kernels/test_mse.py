"""NumPy fused MSE twin against the float64 reference of `tests.reference_pool`,
plus a finite-difference check of its gradient."""

import numpy as np
import pytest

from mlptrain.backends.numpy_kernels import loss
from tests import kernel_cases
from tests import reference_pool as ref

BACKEND = kernel_cases.numpy_backend()
FORMATS = pytest.mark.parametrize("dtype", ref.STORAGE, ids=ref.STORAGE_IDS)


@FORMATS
@pytest.mark.parametrize("rows, width", [(1, 1), (1, 7), (3, 33), (5, 300), (4, 3072)])
def test_mse(rng, rows, width, dtype):
    ref.mse_case(BACKEND, rng, rows, width, dtype, grad_scale=1.0 / (2 * rows))


@FORMATS
def test_loss_scale_and_grad_scale_multiply_the_gradient(rng, dtype):
    """fp16's dynamic loss scale times 1 / samples in the window; the loss itself is unscaled."""
    ref.mse_case(BACKEND, rng, 3, 10, dtype, grad_scale=0.125, loss_scale=2.0**16)


def test_zero_grad_scale_evaluates_only(rng):
    doutput = ref.mse_case(BACKEND, rng, 3, 10, np.float32, grad_scale=0.0, loss_scale=2.0**16)
    assert (doutput == 0).all()


def test_rows_that_do_not_fit_are_rejected(rng):
    ref.mse_rejects_rows_that_do_not_fit(BACKEND, rng)


def test_gradient_matches_finite_differences(rng):
    """L = grad_scale * sum of row losses; doutput is dL/doutput. L is quadratic, so the
    central difference over the float32 step actually taken is exact up to rounding."""
    rows, width, grad_scale = 3, 7, 1.0 / 3
    output, target = rng.standard_normal((2, rows, width)).astype(np.float32)
    doutput, row_loss, scale = np.empty_like(output), np.empty(rows, np.float32), np.ones(1)

    def total(out):
        loss.mse(out, target, np.empty_like(out), row_loss, 0, grad_scale, scale)
        return grad_scale * row_loss.astype(np.float64).sum()

    loss.mse(output, target, doutput, row_loss, 0, grad_scale, scale)
    numeric = np.empty((rows, width))
    for index in np.ndindex(output.shape):
        plus, minus = output.copy(), output.copy()
        plus[index] += np.float32(1e-2)
        minus[index] -= np.float32(1e-2)
        numeric[index] = (total(plus) - total(minus)) / (float(plus[index]) - float(minus[index]))
    ref.assert_within(doutput, numeric, 1e-4 * (1 + np.abs(numeric)))
