"""NumPy batch gathering twin against the same float64 reference (the shared
case lives in `tests.kernel_cases`)."""

import numpy as np
import pytest

from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

BACKEND = cases.numpy_backend()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rows, width, start, n", [(1, 1, 0, 1), (11, 13, 3, 5), (9, 300, 0, 9)])
def test_gather_batch(rng, index_dtype, rows, width, start, n):
    cases.gather_batch(BACKEND, rng, index_dtype, rows, width, start, n)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_gather_into_low_precision(rng, dtype):
    cases.gather_batch(BACKEND, rng, np.int32, 11, 13, 3, 5, dtype)


def test_cursor_moves_every_windowed_launch(rng):
    cases.cursor_moves_every_windowed_launch(BACKEND, rng)


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_gather_lanes_is_gather_batch_lane_by_lane(rng, dtype):
    lane_cases.gather_lanes(BACKEND, rng, dtype)
