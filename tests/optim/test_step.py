"""`OptimizerStep` and the rules of `step_state.finish_step`: fp16 dynamic loss scaling (skip on
inf/NaN, back off, grow), exact unscaling, clipping, the grad-norm record and the schedule's lr.

Mostly on the CPU backend; the CUDA backend (simulator in CI) runs the same rules on tiny buffers.
"""

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.config.schema import LossScaleConfig
from mlptrain.dtypes import from_float32
from mlptrain.nn.params import FlatBuffer, Layout
from mlptrain.optim import LossScaling, OptimizerStep
from mlptrain.optim import step_state as slots
from mlptrain.optim.optimizers import SGD, Adam, Momentum, Optimizer
from tests import reference as ref

LAYOUT = Layout(("w", "b"), ((4, 3), (3,)))
OPTIMIZERS = {"sgd": SGD(weight_decay=0.01), "momentum": Momentum(nesterov=True, weight_decay=0.01),
              "adam": Adam(betas=(0.9, 0.99), weight_decay=0.01, decoupled=True)}


class Rig:
    """Parameters, their compute copy, an optimizer and its step on one backend."""

    def __init__(self, hparams, lrs, *, backend=None, scaling=None, clip=None, compute=np.float32, params=None):
        self.backend = backend or CpuBackend()
        self.params = FlatBuffer(self.backend, LAYOUT)
        host = np.random.default_rng(7).standard_normal(LAYOUT.size).astype(np.float32) if params is None else params
        self.backend.copy_from_host(self.params.flat, host)
        self.compute = self.params
        if np.dtype(compute) != np.float32:
            self.compute = FlatBuffer(self.backend, LAYOUT, compute)
            self.backend.copy_from_host(self.compute.flat, from_float32(host, compute))
        self.optimizer = Optimizer(hparams, self.backend, self.params)
        self.step = OptimizerStep(self.optimizer, self.backend, np.asarray(lrs, np.float64), 32, clip, scaling)

    def window(self, summed_grad):
        """One optimizer step from a window's summed gradient (host float32)."""
        grads = self.backend.to_device(np.asarray(summed_grad, np.float32))
        self.step(self.params.flat, grads, self.compute.flat)

    def scaled_window(self, g):
        """The window of gradient g as fp16 training hands it over: multiplied by the current loss scale."""
        self.window(np.float32(self.read()["loss_scale"]) * np.asarray(g, np.float32))

    def read(self):
        return self.step.read()

    def raw_state(self):
        return self.backend.to_host(self.step.state)

    def buffers(self):
        """Every buffer an update may write, as raw bytes (so NaNs compare too)."""
        arrays = {"params": self.params.flat, "compute": self.compute.flat, **self.optimizer.state}
        return {name: self.backend.to_host(a).view(np.uint8).copy() for name, a in arrays.items()}


def gradient(seed, norm=None):
    g = np.random.default_rng(seed).standard_normal(LAYOUT.size)
    return (g if norm is None else g * norm / np.linalg.norm(g)).astype(np.float32)


def with_bad_element(g, scale, value):
    bad = np.float32(scale) * g
    bad[5] = value
    return bad


def assert_same_buffers(before, after):
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


@pytest.mark.parametrize("count", [1, 7, 8, 9, 17, 255, 256])
def test_the_norm_adds_its_partials_in_eight_chains_then_pairwise(count):
    """record_norm's order, which every kernel follows on eight threads: partial b into running sum b % 8 while
    whole eights remain, the rest into sum 0 in turn, all in float64, then the eight pairwise. A float64 sum in
    any other order differs in its last bits for most of these."""
    partials = np.random.default_rng(count).uniform(0.0, 2.0, count).astype(np.float32)
    sums = [0.0] * 8
    whole = count - count % 8
    for b in range(whole):
        sums[b % 8] += float(partials[b])
    for b in range(whole, count):
        sums[0] += float(partials[b])
    expected = np.sqrt(((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7])))
    state, norms = np.zeros(slots.SIZE), np.zeros(2)
    state[slots.LOSS_SCALE] = 1.0
    assert slots.record_norm(partials, state, norms) == expected
    assert norms[0] == state[slots.GRAD_NORM] == expected and state[slots.WINDOWS] == 1


# dynamic loss scaling


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_non_finite_gradient_skips_the_window(name, bad):
    """Nothing moves (bitwise), the scale halves, the growth tracker resets, the step count and so the
    schedule stay put: the next applied window uses the lr the skipped one would have had."""
    lrs = [0.1, 0.05, 0.02]
    rig = Rig(OPTIMIZERS[name], lrs, scaling=LossScaling(init=2.0**10, growth_interval=100), compute=np.float16)
    rig.scaled_window(gradient(1))
    rig.scaled_window(gradient(2))
    before, state_before = rig.buffers(), rig.read()
    assert rig.raw_state()[slots.GOOD_STEPS] == 2

    rig.window(with_bad_element(gradient(3), 2.0**10, bad))

    assert_same_buffers(before, rig.buffers())
    state = rig.read()
    assert state["loss_scale"] == 2.0**9
    assert state["steps"] == state_before["steps"] == 2 and state["lr"] == state_before["lr"] == lrs[1]
    assert state["skipped"] == 1 and state["windows"] == 3
    raw = rig.raw_state()
    assert raw[slots.GOOD_STEPS] == 0 and raw[slots.APPLY] == 0

    rig.scaled_window(gradient(4))
    assert rig.read()["steps"] == 3 and rig.read()["lr"] == lrs[2]
    # the skipped window left no trace: a run that never saw it ends bit for bit in the same place
    clean = Rig(OPTIMIZERS[name], lrs, scaling=LossScaling(init=2.0**10, growth_interval=100), compute=np.float16)
    for seed in (1, 2, 4):
        clean.scaled_window(gradient(seed))
    assert_same_buffers(clean.buffers(), rig.buffers())
    np.testing.assert_array_equal(rig.raw_state()[slots.BIAS_CORRECTION1], clean.raw_state()[slots.BIAS_CORRECTION1])


def test_skipped_windows_repeat_until_the_scale_fits():
    rig = Rig(SGD(), [0.1], scaling=LossScaling(init=2.0**16))
    before = rig.buffers()
    for k in range(1, 4):
        rig.window(with_bad_element(gradient(k), 1.0, np.inf))
        assert rig.read()["loss_scale"] == 2.0 ** (16 - k) and rig.read()["skipped"] == k
    assert rig.read()["steps"] == 0
    assert_same_buffers(before, rig.buffers())


def test_the_scale_grows_after_growth_interval_finite_windows():
    rig = Rig(Momentum(), [0.01], scaling=LossScaling(init=2.0**10, growth_interval=4))
    scales = []
    for k in range(9):
        rig.scaled_window(gradient(k))
        scales.append(rig.read()["loss_scale"])
    assert scales == [2.0**10] * 3 + [2.0**11] * 4 + [2.0**12] * 2
    assert rig.read()["steps"] == 9 and rig.read()["skipped"] == 0


def test_an_overflow_resets_the_growth_tracker():
    """interval 3: two finite windows, an inf (scale x0.5, tracker 0), then the count starts again."""
    rig = Rig(SGD(), [0.01], scaling=LossScaling(init=2.0**10, growth_interval=3))
    scales = []
    for window in ["ok", "ok", "inf", "ok", "ok", "ok", "ok", "ok", "ok"]:
        if window == "inf":
            rig.window(with_bad_element(gradient(0), rig.read()["loss_scale"], np.inf))
        else:
            rig.scaled_window(gradient(len(scales)))
        scales.append(rig.read()["loss_scale"])
    assert scales == [2.0**10, 2.0**10, 2.0**9, 2.0**9, 2.0**9, 2.0**10, 2.0**10, 2.0**10, 2.0**11]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_scaled_gradients_are_unscaled_exactly(name):
    """The scale is a power of two, so unscaling is exact: training on gradients times the scale (which
    grows twice here, each time still unscaled by the scale they were made with) ends bit for bit where
    training on the plain gradients without loss scaling does."""
    lrs = np.linspace(0.05, 0.01, 8)
    scaled = Rig(OPTIMIZERS[name], lrs, scaling=LossScaling(init=2.0**14, growth_interval=3))
    plain = Rig(OPTIMIZERS[name], lrs)
    for k in range(8):
        scaled.scaled_window(gradient(k))
        plain.window(gradient(k))
    assert scaled.read()["loss_scale"] == 2.0**16
    assert_same_buffers(plain.buffers(), scaled.buffers())


def test_loss_scaling_defaults_are_gradscalers():
    """PyTorch's GradScaler: init 2^16, x2 after 2000 clean steps, x0.5 on inf/NaN."""
    assert LossScaling() == LossScaling(init=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)
    assert LossScaling(**vars(LossScaleConfig())) == LossScaling()


def test_without_loss_scaling_the_scale_is_one_and_nothing_is_skipped():
    rig = Rig(SGD(), [0.1])
    for k in range(3):
        rig.window(gradient(k))
    state = rig.read()
    assert state["loss_scale"] == 1.0 and state["skipped"] == 0 and state["steps"] == state["windows"] == 3


# clipping


@pytest.mark.parametrize("scale", [None, 2.0**12])
@pytest.mark.parametrize("max_norm", [0.5, 1.0, 3.0])
def test_clipping_leaves_the_norm_at_max_norm(scale, max_norm):
    """SGD with lr 1 from p = 0 makes -p the gradient the update used: g * max_norm / ||g||."""
    scaling = LossScaling(init=scale) if scale else None
    rig = Rig(SGD(), [1.0], scaling=scaling, clip=max_norm, params=np.zeros(LAYOUT.size, np.float32))
    g = gradient(3, norm=10.0)
    rig.scaled_window(g)
    used = -rig.backend.to_host(rig.params.flat).astype(np.float64)
    assert np.linalg.norm(used) == pytest.approx(max_norm, rel=1e-6)
    np.testing.assert_allclose(used, g.astype(np.float64) * max_norm / np.linalg.norm(g.astype(np.float64)),
                               rtol=1e-6, atol=1e-9)
    assert rig.read()["grad_norm"] == pytest.approx(10.0, rel=1e-6)  # recorded before clipping


@pytest.mark.parametrize("scale", [None, 2.0**12])
def test_no_clipping_below_max_norm(scale):
    scaling = LossScaling(init=scale) if scale else None
    rig = Rig(SGD(), [1.0], scaling=scaling, clip=1.0, params=np.zeros(LAYOUT.size, np.float32))
    g = gradient(4, norm=0.9)
    rig.scaled_window(g)
    np.testing.assert_array_equal(-rig.backend.to_host(rig.params.flat), g)
    assert rig.raw_state()[slots.GRAD_MULTIPLIER] == 1.0 / (scale or 1.0)


def test_clipping_then_adam():
    """The clipped gradient is what Adam's moments see (betas exact in float32, so that only clipping
    is under test here)."""
    g, max_norm, betas = gradient(5, norm=8.0), 2.0, (0.5, 0.75)
    rig = Rig(Adam(betas=betas), [1e-3], clip=max_norm)
    p = rig.backend.to_host(rig.params.flat)
    rig.window(g)
    clipped = g.astype(np.float64) * max_norm / np.linalg.norm(g.astype(np.float64))
    expected, m, v = ref.adam_update(p, clipped, np.zeros(LAYOUT.size), np.zeros(LAYOUT.size), 1e-3, *betas,
                                     1e-8, 0.0, False, 1)
    np.testing.assert_allclose(rig.optimizer.state["m"], m, rtol=1e-5)
    np.testing.assert_allclose(rig.optimizer.state["v"], v, rtol=1e-5)
    np.testing.assert_allclose(rig.params.flat, expected, rtol=1e-6, atol=1e-7)


# the grad-norm record


def test_grad_norm_history_records_pre_clip_unscaled_norms_of_applied_windows():
    rig = Rig(Momentum(), [0.01], scaling=LossScaling(init=2.0**8, growth_interval=1000), clip=1.0)
    windows = [(0.5, None), (3.0, None), (2.0, np.inf), (10.0, None), (1.0, np.nan), (0.1, None)]
    expected = []
    for seed, (norm, bad) in enumerate(windows):
        g = gradient(seed, norm)
        if bad is None:
            rig.scaled_window(g)
            expected.append(np.linalg.norm(g.astype(np.float64)))
        else:
            rig.window(with_bad_element(g, rig.read()["loss_scale"], bad))
    state = rig.read()
    assert state["windows"] == 6 and state["steps"] == 4 and state["skipped"] == 2
    history = rig.step.grad_norm_history(0, state["windows"])
    assert len(history) == state["steps"]
    np.testing.assert_allclose(history, expected, rtol=1e-6)
    np.testing.assert_allclose(rig.step.grad_norm_history(3, 6), expected[2:], rtol=1e-6)


def test_grad_norm_history_without_loss_scaling_has_every_window():
    rig = Rig(SGD(), [0.01], clip=0.5)
    norms = [0.1, 4.0, 0.25]
    for seed, norm in enumerate(norms):
        rig.window(gradient(seed, norm))
    np.testing.assert_allclose(rig.step.grad_norm_history(0, 3), norms, rtol=1e-6)
    assert rig.read()["grad_norm"] == pytest.approx(norms[-1], rel=1e-6)


# the schedule's lr


def test_each_applied_step_reads_its_lr_and_the_last_one_is_held():
    rig = Rig(SGD(), [0.3, 0.2, 0.1], params=np.zeros(LAYOUT.size, np.float32))
    lrs = []
    for k in range(5):
        rig.window(gradient(k))
        lrs.append(rig.read()["lr"])
    assert lrs == [0.3, 0.2, 0.1, 0.1, 0.1]


def test_the_lr_factor_multiplies_the_schedule():
    """Reduce-on-plateau's multiplier, written between steps, applies from the next step on."""
    rig = Rig(SGD(), [0.3, 0.2, 0.1], params=np.zeros(LAYOUT.size, np.float32))
    rig.window(gradient(0))
    rig.step.set_lr_factor(0.5)
    p = rig.backend.to_host(rig.params.flat)
    g = gradient(1)
    rig.window(g)
    assert rig.read()["lr"] == pytest.approx(0.1, rel=1e-15)
    np.testing.assert_allclose(rig.params.flat, ref.sgd_update(p, g, 0.1, 0.0), rtol=1e-6, atol=1e-7)


# the same rules on the CUDA backend


@pytest.fixture
def cuda_backend():
    from mlptrain.backends.cuda import CudaBackend

    return CudaBackend()


@pytest.mark.gpu
def test_cuda_skips_a_non_finite_window_like_the_cpu(cuda_backend):
    lrs = [0.1, 0.05, 0.02]
    rigs = [Rig(OPTIMIZERS["adam"], lrs, backend=backend, scaling=LossScaling(init=2.0**10, growth_interval=2),
                compute=np.float16) for backend in (CpuBackend(), cuda_backend)]
    for rig in rigs:
        rig.scaled_window(gradient(1))
        before = rig.buffers()
        rig.window(with_bad_element(gradient(2), rig.read()["loss_scale"], np.nan))
        assert_same_buffers(before, rig.buffers())
        rig.scaled_window(gradient(3))
        rig.scaled_window(gradient(4))
    cpu, gpu = rigs
    # the norm's float32 partial sums on a GPU may differ from the CPU's in the last bits, and the device's
    # float64 pow (bias corrections) is not correctly rounded; the counters, scale and lr are exact
    approximate = [slots.GRAD_NORM, slots.BIAS_CORRECTION1, slots.BIAS_CORRECTION2]
    exact = ~np.isin(np.arange(slots.SIZE), approximate)
    np.testing.assert_array_equal(gpu.raw_state()[exact], cpu.raw_state()[exact])
    np.testing.assert_allclose(gpu.raw_state()[approximate[1:]], cpu.raw_state()[approximate[1:]], rtol=1e-14)
    assert gpu.read()["grad_norm"] == pytest.approx(cpu.read()["grad_norm"], rel=1e-6)
    np.testing.assert_allclose(gpu.step.grad_norm_history(0, 4), cpu.step.grad_norm_history(0, 4), rtol=1e-6)
    assert gpu.read()["loss_scale"] == 2.0**10 and gpu.read()["steps"] == 3 and gpu.read()["lr"] == lrs[2]
    for name in ("params", "m", "v"):
        source = {"params": gpu.params.flat, **gpu.optimizer.state}[name]
        expected = {"params": cpu.params.flat, **cpu.optimizer.state}[name]
        np.testing.assert_allclose(gpu.backend.to_host(source), expected, rtol=1e-5, atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(gpu.backend.to_host(gpu.compute.flat),
                                  from_float32(gpu.backend.to_host(gpu.params.flat), np.float16))


@pytest.mark.gpu
def test_cuda_clips_to_max_norm(cuda_backend):
    rig = Rig(SGD(), [1.0], backend=cuda_backend, scaling=LossScaling(init=2.0**12), clip=1.0,
              params=np.zeros(LAYOUT.size, np.float32))
    g = gradient(3, norm=10.0)
    rig.scaled_window(g)
    used = -rig.backend.to_host(rig.params.flat).astype(np.float64)
    assert np.linalg.norm(used) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(used, g / np.linalg.norm(g.astype(np.float64)), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(rig.step.grad_norm_history(0, 1), [10.0], rtol=1e-6)
