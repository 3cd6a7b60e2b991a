"""CUDA batch gathering against a float64 reference (the case both backends
run lives in `tests.kernel_cases`)."""

import numpy as np
import pytest

from mlptrain.backends.numba_kernels import current, data
from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("rows, width, start, n", [(1, 1, 0, 1), (11, 13, 3, 5), (9, 300, 0, 9)])
def test_gather_batch(rng, index_dtype, rows, width, start, n):
    cases.gather_batch(BACKEND, rng, index_dtype, rows, width, start, n)


def test_more_rows_than_grid_rows(rng, monkeypatch):
    """Batches beyond the grid's y limit loop over rows."""
    monkeypatch.setattr(data, "MAX_ROW_BLOCKS", 2)
    images = rng.integers(0, 256, (7, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, 7, dtype=np.uint8)
    indices = rng.permutation(7).astype(np.int32)
    cases.gather_batch_check(BACKEND, images, labels, indices, 1, 5)


def test_launcher_rejects_bad_arguments(rng):
    images = current.to_device(np.zeros((4, 3), np.uint8))
    labels = current.to_device(np.zeros(4, np.uint8))
    x, y = current.to_device(np.zeros((2, 3), np.float32)), current.to_device(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="out of range"):
        data.gather_batch(images, labels, current.to_device(np.arange(4)), 3, x, y, 1.0, 0.0)
    with pytest.raises(ValueError, match="indices must be int32 or int64"):
        data.gather_batch(images, labels, current.to_device(np.arange(4.0)), 0, x, y, 1.0, 0.0)
    with pytest.raises(ValueError, match="x has shape"):
        data.gather_batch(images, labels, current.to_device(np.arange(4)), 0,
                          current.to_device(np.zeros((2, 4), np.float32)), y, 1.0, 0.0)


@pytest.mark.real_gpu
def test_mnist_sized_gather_on_the_gpu(rng):
    images = rng.integers(0, 256, (60000, 784), dtype=np.uint8)
    labels = rng.integers(0, 10, 60000, dtype=np.uint8)
    indices = rng.permutation(60000)
    cases.gather_batch_check(BACKEND, images, labels, indices, 1280, 128)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_gather_into_low_precision(rng, dtype):
    cases.gather_batch(BACKEND, rng, np.int32, 11, 13, 3, 5, dtype)


def test_cursor_moves_every_windowed_launch(rng):
    cases.cursor_moves_every_windowed_launch(BACKEND, rng)


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_gather_lanes_is_gather_batch_lane_by_lane(rng, monkeypatch, dtype):
    monkeypatch.setattr(data, "THREADS", 32)  # blocks of a warp: the simulator runs every thread in Python
    lane_cases.gather_lanes(BACKEND, rng, dtype)


def test_lane_launchers_reject_bad_arguments():
    images, labels = current.to_device(np.zeros((4, 3), np.uint8)), current.to_device(np.zeros(4, np.uint8))
    indices, cursor = current.to_device(np.zeros((2, 4), np.int32)), current.to_device(np.zeros((2, 1), np.int64))
    x, y = current.to_device(np.zeros((2, 2, 3), np.float32)), current.to_device(np.zeros((2, 2), np.int32))
    active = current.to_device(np.ones(2, np.int32))
    with pytest.raises(ValueError, match="out of range"):
        data.gather_lanes(images, labels, indices, 3, x, y, 1.0, 0.0, cursor, active)
    with pytest.raises(ValueError, match="cursor has shape"):
        data.gather_lanes(images, labels, indices, 0, x, y, 1.0, 0.0, cursor[:1], active)
    with pytest.raises(ValueError, match="active must be int32"):
        data.gather_lanes(images, labels, indices, 0, x, y, 1.0, 0.0, cursor, current.to_device(np.ones(2, np.int64)))
