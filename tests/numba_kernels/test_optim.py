"""CUDA optimizer updates against float64 references."""

import numpy as np
import pytest
from numba import cuda

from mlptrain.numba_kernels import optim
from tests import reference as ref

pytestmark = pytest.mark.gpu

SIZES = [1, 300]


def buffers(rng, size, count):
    return [rng.standard_normal(size).astype(np.float32) for _ in range(count)]


def close(got, expected, lr=0.0):
    ref.assert_within(got, expected, 2e-6 * (np.abs(expected) + lr) + 1e-7)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_sgd_update(rng, size, weight_decay):
    param, grad = buffers(rng, size, 2)
    d_param = cuda.to_device(param)
    optim.sgd_update(d_param, cuda.to_device(grad), 0.1, weight_decay)
    close(d_param.copy_to_host(), ref.sgd_update(param, grad, 0.1, weight_decay), lr=0.1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_update(rng, size, nesterov):
    param, grad, velocity = buffers(rng, size, 3)
    d_param, d_velocity = cuda.to_device(param), cuda.to_device(velocity)
    optim.momentum_update(d_param, cuda.to_device(grad), d_velocity, 0.05, 0.9, 1e-3, nesterov)
    expected_param, expected_velocity = ref.momentum_update(param, grad, velocity, 0.05, 0.9, 1e-3, nesterov)
    close(d_velocity.copy_to_host(), expected_velocity)
    close(d_param.copy_to_host(), expected_param, lr=0.05)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
@pytest.mark.parametrize("step", [1, 7])
def test_adam_update(rng, size, weight_decay, decoupled, step):
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(buffers(rng, size, 1)[0])
    d_param, d_m, d_v = cuda.to_device(param), cuda.to_device(m), cuda.to_device(v)
    args = (1e-3, 0.9, 0.999, 1e-8, weight_decay, decoupled, step)
    optim.adam_update(d_param, cuda.to_device(grad), d_m, d_v, *args)
    expected_param, expected_m, expected_v = ref.adam_update(param, grad, m, v, *args)
    close(d_m.copy_to_host(), expected_m)
    close(d_v.copy_to_host(), expected_v)
    close(d_param.copy_to_host(), expected_param, lr=1e-3)


def test_bitwise_deterministic(rng):
    param, grad, m = buffers(rng, 77, 3)
    v = np.abs(m)
    results = []
    for _ in range(2):
        d_param, d_m, d_v = cuda.to_device(param), cuda.to_device(m), cuda.to_device(v)
        optim.adam_update(d_param, cuda.to_device(grad), d_m, d_v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 3)
        results.append([a.copy_to_host().view(np.uint32) for a in (d_param, d_m, d_v)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_launchers_reject_bad_arguments():
    param = cuda.to_device(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="grad has shape"):
        optim.sgd_update(param, cuda.to_device(np.zeros(4, np.float32)), 0.1, 0.0)
    with pytest.raises(ValueError, match="velocity must be float32"):
        optim.momentum_update(param, param, cuda.to_device(np.zeros(5)), 0.1, 0.9, 0.0, False)
    with pytest.raises(ValueError, match="1-based"):
        optim.adam_update(param, param, param, param, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, 0)


@pytest.mark.real_gpu
def test_whole_mlp_buffer_on_the_gpu(rng):
    """A 784-512-512-10 MLP's 670k parameters: more than one grid-stride pass."""
    size = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(m)
    d_param, d_m, d_v = cuda.to_device(param), cuda.to_device(m), cuda.to_device(v)
    optim.adam_update(d_param, cuda.to_device(grad), d_m, d_v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 5)
    expected_param, _, _ = ref.adam_update(param, grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 5)
    close(d_param.copy_to_host(), expected_param, lr=1e-3)
