"""NumPy max pool 2x2 and nearest x2 upsample twins against the float64
references of `tests.reference_pool` (cases shared with the CUDA tests live there),
plus a finite-difference check of the pool -> upsample pair's gradient."""

import numpy as np
import pytest

from mlptrain.backends.numpy_kernels import pool
from tests import kernel_cases
from tests import reference_pool as ref

BACKEND = kernel_cases.numpy_backend()
FORMATS = pytest.mark.parametrize("dtype", ref.STORAGE, ids=ref.STORAGE_IDS)
# odd H / W, a height of 1 (nothing to pool, all of dx zero), C of 1, 3, 33
SHAPES = pytest.mark.parametrize("shape", [(1, 2, 2, 1), (1, 5, 7, 3), (2, 4, 6, 33), (3, 5, 7, 1), (2, 1, 3, 3),
                                           (2, 9, 8, 5)])


@FORMATS
@SHAPES
def test_max_pool2x2_forward(rng, shape, dtype):
    ref.pool_forward_random(BACKEND, rng, shape, dtype)


@FORMATS
@SHAPES
def test_max_pool2x2_forward_ties(rng, shape, dtype):
    ref.pool_forward_random(BACKEND, rng, shape, dtype, ties=True)


@FORMATS
def test_max_pool2x2_ties_signed_zeros_infinities_and_nan(dtype):
    ref.pool_special_values(BACKEND, dtype)


@FORMATS
@SHAPES
def test_max_pool2x2_backward(rng, shape, dtype):
    ref.pool_backward(BACKEND, rng, shape, dtype)


@FORMATS
@SHAPES
def test_upsample2x_forward(rng, shape, dtype):
    ref.upsample_forward(BACKEND, rng, shape, dtype)


@FORMATS
@SHAPES
def test_upsample2x_backward(rng, shape, dtype):
    ref.upsample_backward(BACKEND, rng, shape, dtype)


def pool_then_upsample(x, weights):
    """L = sum(weights * upsample(maxpool(x))) in float64, and the argmax of the pool."""
    N, H, W, C = x.shape
    y, argmax = np.empty((N, H // 2, W // 2, C), np.float32), np.empty((N, H // 2, W // 2, C), np.uint8)
    pool.max_pool2x2_forward(x, y, argmax)
    up = np.empty((N, 2 * (H // 2), 2 * (W // 2), C), np.float32)
    pool.upsample2x_forward(y, up)
    return float(np.sum(weights.astype(np.float64) * up)), argmax


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (1, 4, 4, 2)])
def test_pool_upsample_gradient_matches_finite_differences(rng, shape):
    """Distinct values 0.25 apart and a step of 1/16: no window changes its winner, x +- h
    is exact in float32, and L is piecewise linear, so central differences are exact."""
    N, H, W, C = shape
    x = (rng.permutation(np.prod(shape)) * 0.25).reshape(shape).astype(np.float32)
    weights = rng.standard_normal((N, 2 * (H // 2), 2 * (W // 2), C)).astype(np.float32)
    _, argmax = pool_then_upsample(x, weights)
    dpooled = np.empty((N, H // 2, W // 2, C), np.float32)
    pool.upsample2x_backward(weights, dpooled)
    dx = np.full(shape, np.nan, np.float32)
    pool.max_pool2x2_backward(dpooled, argmax, dx)
    step = 1 / 16
    numeric = np.empty(shape)
    for index in np.ndindex(shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        numeric[index] = (pool_then_upsample(plus, weights)[0] - pool_then_upsample(minus, weights)[0]) / (2 * step)
    ref.assert_within(dx, numeric, 1e-6 * (1 + np.abs(numeric)))
    assert (dx[:, 2 * (H // 2):] == 0).all() and (dx[:, :, 2 * (W // 2):] == 0).all()
