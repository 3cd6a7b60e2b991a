"""NumPy bias gradient twin against the same float64 reference."""

import numpy as np
import pytest

from mlptrain.numpy_kernels import reduce
from tests import reference as ref


@pytest.mark.parametrize("rows, columns", [(1, 1), (1, 40), (17, 33), (130, 5), (4096, 512)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_backward(rng, rows, columns, beta):
    dy = rng.standard_normal((rows, columns)).astype(np.float32)
    old = rng.standard_normal(columns).astype(np.float32)
    db = np.full(columns, np.nan, np.float32) if beta == 0.0 else old.copy()  # beta 0 must not read db
    reduce.bias_backward(dy, db, beta)
    tolerance = 2e-6 * np.sqrt(rows) * (np.abs(dy).sum(axis=0) + np.abs(old)) + 1e-7
    ref.assert_within(db, ref.bias_backward(dy, old, beta), tolerance)
