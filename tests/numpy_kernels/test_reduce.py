"""NumPy bias gradient twin against the same float64 reference (the shared
case lives in `tests.kernel_cases`)."""

import pytest

from tests import kernel_cases as cases

BACKEND = cases.numpy_backend()


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 40), (17, 33), (130, 5), (4096, 512)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_backward(rng, rows, columns, beta):
    cases.bias_backward(BACKEND, rng, rows, columns, beta)
