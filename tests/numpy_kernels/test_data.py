"""NumPy batch gathering twin against the same float64 reference."""

import numpy as np
import pytest

from mlptrain.numpy_kernels import data
from tests import reference as ref


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rows, width, start, n", [(1, 1, 0, 1), (11, 13, 3, 5), (9, 300, 0, 9)])
def test_gather_batch(rng, index_dtype, rows, width, start, n):
    images = rng.integers(0, 256, (rows, width), dtype=np.uint8)
    labels = rng.integers(0, 10, rows, dtype=np.uint8)
    indices = rng.permutation(rows).astype(index_dtype)
    x, y = np.full((n, width), np.nan, np.float32), np.full(n, -7, np.int32)
    data.gather_batch(images, labels, indices, start, x, y, 1 / 255, -0.5)
    expected_x, expected_y = ref.gather_batch(images, labels, indices, start, n, 1 / 255, -0.5)
    ref.assert_within(x, expected_x, 1e-6)
    np.testing.assert_array_equal(y, expected_y)
