"""CUDA batch gathering against a float64 reference."""

import numpy as np
import pytest
from numba import cuda

from mlptrain.numba_kernels import data
from tests import reference as ref

pytestmark = pytest.mark.gpu


def run(images, labels, indices, start, n):
    x = cuda.to_device(np.full((n, images.shape[1]), np.nan, np.float32))
    y = cuda.to_device(np.full(n, -7, np.int32))
    data.gather_batch(cuda.to_device(images), cuda.to_device(labels), cuda.to_device(indices), start, x, y,
                      1 / 255, -0.5)
    return x.copy_to_host(), y.copy_to_host()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rows, width, start, n", [(1, 1, 0, 1), (11, 13, 3, 5), (9, 300, 0, 9)])
def test_gather_batch(rng, index_dtype, rows, width, start, n):
    images = rng.integers(0, 256, (rows, width), dtype=np.uint8)
    labels = rng.integers(0, 10, rows, dtype=np.uint8)
    indices = rng.permutation(rows).astype(index_dtype)
    x, y = run(images, labels, indices, start, n)
    expected_x, expected_y = ref.gather_batch(images, labels, indices, start, n, 1 / 255, -0.5)
    ref.assert_within(x, expected_x, 1e-6)
    np.testing.assert_array_equal(y, expected_y)


def test_more_rows_than_grid_rows(rng, monkeypatch):
    """Batches beyond the grid's y limit loop over rows."""
    monkeypatch.setattr(data, "MAX_ROW_BLOCKS", 2)
    images = rng.integers(0, 256, (7, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, 7, dtype=np.uint8)
    indices = rng.permutation(7).astype(np.int32)
    x, y = run(images, labels, indices, 1, 5)
    expected_x, expected_y = ref.gather_batch(images, labels, indices, 1, 5, 1 / 255, -0.5)
    ref.assert_within(x, expected_x, 1e-6)
    np.testing.assert_array_equal(y, expected_y)


def test_launcher_rejects_bad_arguments(rng):
    images = cuda.to_device(np.zeros((4, 3), np.uint8))
    labels = cuda.to_device(np.zeros(4, np.uint8))
    x, y = cuda.to_device(np.zeros((2, 3), np.float32)), cuda.to_device(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="out of range"):
        data.gather_batch(images, labels, cuda.to_device(np.arange(4)), 3, x, y, 1.0, 0.0)
    with pytest.raises(ValueError, match="indices must be int32 or int64"):
        data.gather_batch(images, labels, cuda.to_device(np.arange(4.0)), 0, x, y, 1.0, 0.0)
    with pytest.raises(ValueError, match="x has shape"):
        data.gather_batch(images, labels, cuda.to_device(np.arange(4)), 0, cuda.to_device(np.zeros((2, 4), np.float32)),
                          y, 1.0, 0.0)


@pytest.mark.real_gpu
def test_mnist_sized_gather_on_the_gpu(rng):
    images = rng.integers(0, 256, (60000, 784), dtype=np.uint8)
    labels = rng.integers(0, 10, 60000, dtype=np.uint8)
    indices = rng.permutation(60000)
    x, y = run(images, labels, indices, 1280, 128)
    expected_x, expected_y = ref.gather_batch(images, labels, indices, 1280, 128, 1 / 255, -0.5)
    ref.assert_within(x, expected_x, 1e-6)
    np.testing.assert_array_equal(y, expected_y)
