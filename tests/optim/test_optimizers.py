"""Each optimizer, driven as the training loop drives it (`OptimizerStep` on the CPU backend: norm,
`finish_step`, fused update), against its formula written out in float64 in `tests.reference`."""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.schema import OptimConfig
from mlptrain.errors import UserError
from mlptrain.nn.params import FlatBuffer, Layout
from mlptrain.optim import OptimizerStep, make_optimizer
from mlptrain.optim.optimizers import SGD, Adam, Momentum, Optimizer
from tests import reference as ref

LAYOUT = Layout(("a", "b"), ((3, 5), (7,)))


def setup(rng, hparams, lrs):
    """(params, optimizer, step, the initial parameters in float64); `lrs` is the lr of each step."""
    backend = CpuBackend()
    params = FlatBuffer(backend, LAYOUT)
    params.flat[...] = rng.standard_normal(LAYOUT.size).astype(np.float32)
    optimizer = Optimizer(hparams, backend, params)
    step = OptimizerStep(optimizer, backend, np.asarray(lrs, np.float64), len(lrs))
    return params, optimizer, step, params.flat.astype(np.float64)


def grads(rng):
    return rng.standard_normal(LAYOUT.size).astype(np.float32)


def apply(step, params, g):
    """One window whose summed gradient is g; fp32, so the compute copy is the parameters themselves."""
    step(params.flat, g.copy(), params.flat)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_sgd(rng, wd):
    params, _, step, p = setup(rng, SGD(weight_decay=wd), [0.05, 0.02])
    for lr in (0.05, 0.02):
        g = grads(rng)
        apply(step, params, g)
        p = ref.sgd_update(p, g, lr, wd)
        np.testing.assert_allclose(params.flat, p, rtol=1e-6, atol=1e-6)
    assert step.read()["steps"] == 2


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_velocity_over_two_steps(rng, nesterov):
    params, optimizer, step, p = setup(rng, Momentum(momentum=0.9, nesterov=nesterov, weight_decay=0.01), [0.1, 0.1])
    v = np.zeros_like(p)
    for _ in range(2):
        g = grads(rng)
        apply(step, params, g)
        p, v = ref.momentum_update(p, g, v, 0.1, 0.9, 0.01, nesterov)
        np.testing.assert_allclose(optimizer.state["velocity"], v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(params.flat, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_bias_correction_and_weight_decay(rng, decoupled):
    """Three steps with a different lr each: the bias corrections follow the step count t = 1, 2, 3."""
    lrs, b1, b2, eps, wd = [1e-2, 5e-3, 2e-3], 0.9, 0.99, 1e-8, 0.1
    params, optimizer, step, p = setup(rng, Adam(betas=(b1, b2), eps=eps, weight_decay=wd, decoupled=decoupled), lrs)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, lr in enumerate(lrs, start=1):
        g = grads(rng)
        apply(step, params, g)
        p, m, v = ref.adam_update(p, g, m, v, lr, b1, b2, eps, wd, decoupled, t)
        np.testing.assert_allclose(optimizer.state["m"], m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(optimizer.state["v"], v, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(params.flat, p, rtol=2e-5, atol=2e-6)
    state = step.read()
    assert state["steps"] == 3 and state["lr"] == lrs[-1]


def test_first_adam_step_moves_each_weight_by_lr(rng):
    """With bias correction, step 1 is lr * sign(g) (up to eps): the classic sanity check."""
    params, _, step, p = setup(rng, Adam(), [1e-3])
    g = grads(rng)
    apply(step, params, g)
    np.testing.assert_allclose(p - params.flat, 1e-3 * np.sign(g), rtol=1e-4)


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.9, 0.9999)])
def test_adam_moments_follow_the_formula_from_zero(rng, betas):
    """From m = v = 0 the first step leaves m = (1 - b1) g and v = (1 - b2) g^2, which float32 holds to
    a few ulps: a float32 1 - b2 computed from b2 rounded to float32 would be off by 1.3e-5 (0.999) or
    1.7e-4 (0.9999) relative."""
    params, optimizer, step, p = setup(rng, Adam(betas=betas), [1e-3])
    g = grads(rng)
    apply(step, params, g)
    expected, m, v = ref.adam_update(p, g, np.zeros_like(p), np.zeros_like(p), 1e-3, *betas, 1e-8, 0.0, False, 1)
    np.testing.assert_allclose(optimizer.state["m"], m, rtol=1e-6)
    np.testing.assert_allclose(optimizer.state["v"], v, rtol=1e-6)
    np.testing.assert_allclose(params.flat, expected, rtol=1e-6, atol=1e-7)


def test_adamw_decays_decoupled_and_adam_adds_l2_to_the_gradient():
    """With a zero gradient, AdamW shrinks p by exactly (1 - lr wd) and keeps m = v = 0, while Adam's
    L2 term becomes the gradient, so its first step moves p by lr * sign(p)."""
    lr, wd = 1e-2, 0.5
    results = {}
    for decoupled in (False, True):
        params, optimizer, step, p = setup(np.random.default_rng(0), Adam(weight_decay=wd, decoupled=decoupled), [lr])
        apply(step, params, np.zeros(LAYOUT.size, np.float32))
        results[decoupled] = params.flat.copy(), optimizer.state["m"].copy()
    adamw, adamw_m = results[True]
    adam, adam_m = results[False]
    np.testing.assert_allclose(adamw, p * (1 - lr * wd), rtol=1e-6)
    assert not adamw_m.any()
    np.testing.assert_allclose(adam, p - lr * np.sign(p), rtol=1e-4)
    np.testing.assert_allclose(adam_m, (1 - 0.9) * wd * p, rtol=1e-5)


def test_adamw_differs_from_adam_with_l2(rng):
    results = []
    for decoupled in (False, True):
        params, _, step, _ = setup(np.random.default_rng(0), Adam(weight_decay=0.5, decoupled=decoupled), [1e-2])
        apply(step, params, grads(np.random.default_rng(1)))
        results.append(params.flat.copy())
    assert not np.allclose(results[0], results[1])


@pytest.mark.parametrize("name, state_names", [("sgd", ()), ("momentum", ("velocity",)), ("adam", ("m", "v")),
                                               ("adamw", ("m", "v"))])
def test_make_optimizer_from_config(name, state_names):
    backend = CpuBackend()
    params = FlatBuffer(backend, LAYOUT)
    optimizer = make_optimizer(OptimConfig(name=name, weight_decay=0.01), backend, params)
    assert tuple(optimizer.state) == state_names
    assert all(buf.shape == (LAYOUT.size,) and buf.dtype == np.float32 for buf in optimizer.state.values())
    if name.startswith("adam"):
        assert optimizer.hparams.decoupled == (name == "adamw")
        assert optimizer.bias_betas == (0.9, 0.999)
    else:
        assert optimizer.bias_betas == (0.0, 0.0)


@pytest.mark.parametrize("hparams", [Momentum(nesterov=True), Adam(weight_decay=0.1, decoupled=True)],
                         ids=["momentum", "adamw"])
def test_state_dict_round_trip_continues_exactly(rng, hparams):
    """Saving after two steps and loading into a fresh optimizer gives the same third step, bit for bit."""
    lrs = [1e-2, 5e-3, 2e-3]
    params, optimizer, step, _ = setup(rng, hparams, lrs)
    for _ in range(2):
        apply(step, params, grads(rng))
    saved, saved_params = step.state_dict(), params.flat.copy()

    other_params, other_optimizer, other_step, _ = setup(np.random.default_rng(99), hparams, lrs)
    other_params.flat[...] = saved_params
    other_step.load_state_dict(saved)
    assert other_step.read() == step.read()
    for name in optimizer.state:
        np.testing.assert_array_equal(other_optimizer.state[name], optimizer.state[name])
    g = grads(rng)
    apply(step, params, g)
    apply(other_step, other_params, g)
    np.testing.assert_array_equal(other_params.flat, params.flat)
    assert other_step.read()["steps"] == 3


def test_load_state_dict_rejects_a_missing_or_misshapen_buffer(rng):
    params, optimizer, step, _ = setup(rng, Adam(), [1e-3])
    saved = step.state_dict()
    for key in ("optim/m", "step/state"):
        broken = {k: v for k, v in saved.items() if k != key}
        with pytest.raises(UserError, match=key):
            step.load_state_dict(broken)
    with pytest.raises(UserError, match="optim/v"):
        optimizer.load_state_dict({**saved, "optim/v": np.zeros(3, np.float32)})
