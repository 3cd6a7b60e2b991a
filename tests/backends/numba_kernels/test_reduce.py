"""CUDA bias gradient (column sums) against a float64 reference (the case both
backends run lives in `tests.kernel_cases`)."""

import numpy as np
import pytest

from mlptrain.backends.numba_kernels import current, reduce
from mlptrain.backends.numba_kernels.chunks import column_width
from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases
from tests import reference as ref

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 40), (17, 33), (130, 5)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_backward(rng, rows, columns, beta):
    cases.bias_backward(BACKEND, rng, rows, columns, beta)


@pytest.mark.parametrize("rows, columns", [(37, 3), (40, 40), (9, 1)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_backward_in_chunks(rng, monkeypatch, rows, columns, beta):
    """Chunks of 8 rows: several pass-1 blocks per column block, the last chunk ragged (37, 9 rows)."""
    monkeypatch.setattr(reduce, "CHUNK_ROWS", 8)
    assert reduce.bias_backward_workspace(rows, columns) == -(-rows // 8) * columns
    cases.bias_backward(BACKEND, rng, rows, columns, beta, workspace=True)


def test_chunked_bias_gradient_is_bitwise_deterministic(rng, monkeypatch):
    monkeypatch.setattr(reduce, "CHUNK_ROWS", 8)
    dy = current.to_device(rng.standard_normal((30, 5)).astype(np.float32))
    results = []
    for _ in range(2):
        db = current.to_device(np.full(5, np.nan, np.float32))
        reduce.bias_backward(dy, db, 0.0, current.to_device(np.full(20, np.nan, np.float32)))
        results.append(db.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(*results)


def test_column_width_shrinks_for_narrow_gradients():
    assert [column_width(c) for c in (1, 3, 5, 32, 40, 256)] == [1, 4, 8, 32, 32, 32]


def test_row_slice_of_a_larger_buffer(rng):
    dy = rng.standard_normal((30, 7)).astype(np.float32)
    db = current.to_device(np.full(7, np.nan, np.float32))
    reduce.bias_backward(current.to_device(dy)[:9], db, 0.0)
    ref.assert_within(db.copy_to_host(), ref.bias_backward(dy[:9], None, 0.0), 1e-5)


def test_bitwise_deterministic(rng):
    dy = current.to_device(rng.standard_normal((67, 35)).astype(np.float32))
    results = []
    for _ in range(2):
        db = current.to_device(np.full(35, np.nan, np.float32))
        reduce.bias_backward(dy, db, 0.0)
        results.append(db.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(*results)


def test_launcher_rejects_bad_arguments():
    dy = current.to_device(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="db has shape"):
        reduce.bias_backward(dy, current.to_device(np.zeros(4, np.float32)), 0.0)
    with pytest.raises(ValueError, match="beta"):
        reduce.bias_backward(dy, current.to_device(np.zeros(3, np.float32)), 2.0)
    long = current.to_device(np.zeros((reduce.CHUNK_ROWS + 1, 3), np.float32))
    with pytest.raises(ValueError, match="workspace has 5 elements, needs 6"):
        reduce.bias_backward(long, current.to_device(np.zeros(3, np.float32)), 0.0,
                             current.to_device(np.zeros(5, np.float32)))


@pytest.mark.real_gpu
def test_large_batch_on_the_gpu(rng):
    dy = rng.standard_normal((4096, 512)).astype(np.float32)
    d_dy, results = current.to_device(dy), []
    for _ in range(2):
        db = current.to_device(np.full(512, np.nan, np.float32))
        workspace = current.to_device(np.empty(reduce.bias_backward_workspace(*dy.shape), np.float32))
        reduce.bias_backward(d_dy, db, 0.0, workspace)
        results.append(db.copy_to_host())
    ref.assert_within(results[0], ref.bias_backward(dy, None, 0.0), 2e-6 * 64 * np.abs(dy).sum(axis=0))
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_bias_backward_of_low_precision_gradients(rng, dtype):
    cases.bias_backward(BACKEND, rng, 17, 33, 1.0, dtype)


@pytest.mark.parametrize("size", [1, 300, 70001])
def test_sum_of_squares(rng, size):
    cases.sum_of_squares(BACKEND, rng, size)


def test_sum_of_squares_is_bitwise_deterministic_and_sees_inf(rng):
    x = current.to_device(rng.standard_normal(5000).astype(np.float32))
    runs = []
    for _ in range(2):
        partials = current.to_device(np.full(reduce.PARTIALS, np.nan, np.float32))
        reduce.sum_of_squares(x, partials)
        runs.append(partials.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(*runs)
    x[17:18].copy_to_device(np.array([np.inf], np.float32))
    reduce.sum_of_squares(x, partials)
    assert np.isinf(partials.copy_to_host().astype(np.float64).sum())


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("rows, columns, beta", [(5, 7, 0.0), (5, 7, 1.0), (9, 40, 1.0)])
def test_bias_backward_lanes_is_bias_backward_lane_by_lane(rng, rows, columns, beta):
    lane_cases.bias_backward_lanes(BACKEND, rng, rows, columns, beta)


@LOW_PRECISION
def test_bias_backward_lanes_of_low_precision_gradients(rng, dtype):
    lane_cases.bias_backward_lanes(BACKEND, rng, 5, 7, 1.0, dtype)


def test_sum_of_squares_lanes_is_sum_of_squares_lane_by_lane(rng, monkeypatch):
    """300 elements: whole grid strides and a ragged tail. Half the simulator's blocks (it runs every thread
    in Python): PARTIALS sizes only the launch and the check."""
    monkeypatch.setattr(reduce, "PARTIALS", reduce.PARTIALS // 2)
    lane_cases.sum_of_squares_lanes(BACKEND, rng, 300)


def test_lane_launchers_reject_bad_arguments():
    dy = current.to_device(np.zeros((2, 4, 3), np.float32))
    with pytest.raises(ValueError, match="db has shape"):
        reduce.bias_backward_lanes(dy, current.to_device(np.zeros((2, 4), np.float32)), 0.0)
    with pytest.raises(ValueError, match="beta"):
        reduce.bias_backward_lanes(dy, current.to_device(np.zeros((2, 3), np.float32)), 0.5)
    with pytest.raises(ValueError, match="partials has shape"):
        reduce.sum_of_squares_lanes(dy[0], current.to_device(np.zeros((2, reduce.PARTIALS + 1), np.float32)))
