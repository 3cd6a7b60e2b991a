"""NumPy optimizer twins against the same float64 references."""

import numpy as np
import pytest

from mlptrain.numpy_kernels import optim
from tests import reference as ref

SIZES = [1, 300]


def buffers(rng, size, count):
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def close(got, expected, lr=0.0):
    ref.assert_within(got, expected, 2e-6 * (np.abs(expected) + lr) + 1e-7)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_sgd_update(rng, size, weight_decay):
    param, grad = buffers(rng, size, 2)
    expected = ref.sgd_update(param, grad, 0.1, weight_decay)
    optim.sgd_update(param, grad, 0.1, weight_decay)
    close(param, expected, lr=0.1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_update(rng, size, nesterov):
    param, grad, velocity = buffers(rng, size, 3)
    expected_param, expected_velocity = ref.momentum_update(param, grad, velocity, 0.05, 0.9, 1e-3, nesterov)
    optim.momentum_update(param, grad, velocity, 0.05, 0.9, 1e-3, nesterov)
    close(velocity, expected_velocity)
    close(param, expected_param, lr=0.05)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
@pytest.mark.parametrize("step", [1, 7])
def test_adam_update(rng, size, weight_decay, decoupled, step):
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(buffers(rng, size, 1)[0])
    args = (1e-3, 0.9, 0.999, 1e-8, weight_decay, decoupled, step)
    expected_param, expected_m, expected_v = ref.adam_update(param, grad, m, v, *args)
    optim.adam_update(param, grad, m, v, *args)
    close(m, expected_m)
    close(v, expected_v)
    close(param, expected_param, lr=1e-3)
