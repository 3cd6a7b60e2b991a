"""One step of each optimizer against its formula, written out in float64."""

import numpy as np
import pytest

from mlptrain.backend import CpuBackend
from mlptrain.nn.params import FlatBuffer, Layout
from mlptrain.optim.optimizers import SGD, Adam, Momentum, Optimizer
from tests import reference as ref

LAYOUT = Layout(("a", "b"), ((3, 5), (7,)))


def setup(rng, hparams):
    backend = CpuBackend()
    params = FlatBuffer(backend, LAYOUT)
    p0 = rng.standard_normal(LAYOUT.size).astype(np.float32)
    params.flat[...] = p0
    return backend, params, Optimizer(hparams, backend, params), p0.astype(np.float64)


def grads(rng):
    return rng.standard_normal(LAYOUT.size).astype(np.float32)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_sgd(rng, wd):
    backend, params, opt, p = setup(rng, SGD(weight_decay=wd))
    g = grads(rng)
    opt.step(params.flat, g, 0.05)
    np.testing.assert_allclose(params.flat, p - 0.05 * (g + wd * p), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_velocity_over_two_steps(rng, nesterov):
    backend, params, opt, p = setup(rng, Momentum(momentum=0.9, nesterov=nesterov, weight_decay=0.01))
    v = np.zeros_like(p)
    for _ in range(2):
        g = grads(rng)
        opt.step(params.flat, g, 0.1)
        p, v = ref.momentum_update(p, g, v, 0.1, 0.9, 0.01, nesterov)
        np.testing.assert_allclose(opt.state["velocity"], v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(params.flat, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_bias_correction_and_weight_decay(rng, decoupled):
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-8, 0.1
    backend, params, opt, p = setup(rng, Adam(betas=(b1, b2), eps=eps, weight_decay=wd, decoupled=decoupled))
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t in (1, 2, 3):
        g = grads(rng)
        opt.step(params.flat, g, lr)
        p, m, v = ref.adam_update(p, g, m, v, lr, b1, b2, eps, wd, decoupled, t)
        np.testing.assert_allclose(params.flat, p, rtol=2e-5, atol=2e-6)
    assert opt.step_count == 3


def test_first_adam_step_moves_each_weight_by_lr(rng):
    """With bias correction, step 1 is lr * sign(g) (up to eps): the classic sanity check."""
    backend, params, opt, p = setup(rng, Adam())
    g = grads(rng)
    opt.step(params.flat, g, 1e-3)
    np.testing.assert_allclose(p - params.flat, 1e-3 * np.sign(g), rtol=1e-4)


def test_adamw_differs_from_adam_with_l2(rng):
    results = []
    for decoupled in (False, True):
        backend, params, opt, p = setup(np.random.default_rng(0), Adam(weight_decay=0.5, decoupled=decoupled))
        opt.step(params.flat, grads(np.random.default_rng(1)), 1e-2)
        results.append(params.flat.copy())
    assert not np.allclose(results[0], results[1])


def test_state_dict_round_trip(rng):
    backend, params, opt, p = setup(rng, Adam())
    opt.step(params.flat, grads(rng), 1e-3)
    state = opt.state_dict()
    other = Optimizer(Adam(), backend, params)
    other.load_state_dict(state)
    assert other.step_count == 1
    np.testing.assert_array_equal(other.state["m"], opt.state["m"])
