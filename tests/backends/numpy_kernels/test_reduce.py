"""NumPy bias gradient twin against the same float64 reference (the shared
case lives in `tests.kernel_cases`)."""

import pytest

from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

BACKEND = cases.numpy_backend()


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 40), (17, 33), (130, 5), (4096, 512)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_backward(rng, rows, columns, beta):
    cases.bias_backward(BACKEND, rng, rows, columns, beta)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_bias_backward_of_low_precision_gradients(rng, dtype):
    cases.bias_backward(BACKEND, rng, 17, 33, 1.0, dtype)


@pytest.mark.parametrize("size", [1, 300, 70001])
def test_sum_of_squares(rng, size):
    cases.sum_of_squares(BACKEND, rng, size)


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("rows, columns, beta", [(5, 7, 0.0), (5, 7, 1.0), (9, 40, 1.0)])
def test_bias_backward_lanes_is_bias_backward_lane_by_lane(rng, rows, columns, beta):
    lane_cases.bias_backward_lanes(BACKEND, rng, rows, columns, beta)


@LOW_PRECISION
def test_bias_backward_lanes_of_low_precision_gradients(rng, dtype):
    lane_cases.bias_backward_lanes(BACKEND, rng, 5, 7, 1.0, dtype)


@pytest.mark.parametrize("size", [37, 300])
def test_sum_of_squares_lanes_is_sum_of_squares_lane_by_lane(rng, size):
    lane_cases.sum_of_squares_lanes(BACKEND, rng, size)
