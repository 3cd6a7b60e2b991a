"""CUDA optimizer updates against float64 references (the cases both backends
run live in `tests.kernel_cases`)."""

import numpy as np
import pytest
from numba import cuda

from mlptrain.numba_kernels import optim
from tests import kernel_cases as cases
from tests import reference as ref
from tests.kernel_cases import buffers, close

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()
SIZES = [1, 300]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_sgd_update(rng, size, weight_decay):
    cases.sgd_update(BACKEND, rng, size, weight_decay)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_update(rng, size, nesterov):
    cases.momentum_update(BACKEND, rng, size, nesterov)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
@pytest.mark.parametrize("step", [1, 7])
def test_adam_update(rng, size, weight_decay, decoupled, step):
    cases.adam_update(BACKEND, rng, size, weight_decay, decoupled, step)


def test_bitwise_deterministic(rng):
    param, grad, m = buffers(rng, 77, 3)
    v = np.abs(m)
    results = []
    for _ in range(2):
        updated = cases.adam_run(BACKEND, param, grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 3)
        results.append([a.view(np.uint32) for a in updated])
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
    got_param, _, _ = cases.adam_run(BACKEND, param, grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 5)
    expected_param, _, _ = ref.adam_update(param, grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 5)
    close(got_param, expected_param, lr=1e-3)
