"""CUDA optimizer updates against float64 references (the cases both backends
run live in `tests.kernel_cases`)."""

import numpy as np
import pytest

from mlptrain.backends import numpy_kernels
from mlptrain.backends.numba_kernels import current, optim, reduce, step_rules, wide
from mlptrain.optim.step_state import LOSS_SCALE, LR_FACTOR, SIZE
from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases
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
    param = current.to_device(np.zeros(5, np.float32))
    state = cases.state_for(BACKEND, 0.1)
    with pytest.raises(ValueError, match="grad has shape"):
        optim.sgd_update(param, current.to_device(np.zeros(4, np.float32)), param, state, 0.0)
    with pytest.raises(ValueError, match="velocity must be float32"):
        optim.momentum_update(param, param, current.to_device(np.zeros(5)), param, state, 0.9, 0.0, False)
    with pytest.raises(ValueError, match="state has shape"):
        optim.adam_update(param, param, param, param, param, state[:3], 0.9, 0.999, 1e-8, 0.0, False)
    with pytest.raises(ValueError, match="compute must be"):
        optim.sgd_update(param, param, current.to_device(np.zeros(5, np.int32)), state, 0.0)


@pytest.mark.real_gpu
def test_whole_mlp_buffer_on_the_gpu(rng):
    """A 784-512-512-10 MLP's 670k parameters: more than one grid-stride pass."""
    size = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(m)
    got_param, _, _, _ = cases.adam_run(BACKEND, param, grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01, True, 5)
    expected_param, _, _ = ref.adam_update(param, cases.MULTIPLIER * grad, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                           True, 5)
    close(got_param, expected_param, lr=1e-3)


@pytest.mark.parametrize("size", [37, pytest.param(669_706, marks=pytest.mark.real_gpu)])
@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_a_quad_at_a_time_rounds_as_an_element_at_a_time(rng, size, dtype):
    """Buffers whose first element is 16-byte aligned are updated four elements an access (the last size % 4 one
    at a time); the same values one element 4 bytes into wider buffers, one at a time: the same bits, the
    parameters, the moments and the compute copy alike."""
    param, grad, m = buffers(rng, size, 3)
    v = np.abs(m)
    results = []
    for offset in (0, 1):
        d = [BACKEND.to_device(np.concatenate([np.zeros(offset, np.float32), a]))[offset:] for a in (param, grad, m, v)]
        assert wide.aligned_quads(d[0]) == (offset == 0)
        compute = cases.compute_copy(BACKEND, d[0], size, dtype)
        optim.adam_update(*d, compute, cases.state_for(BACKEND, 1e-3, 3), 0.9, 0.999, 1e-8, 0.1, True)
        results.append([BACKEND.to_host(a).view(np.uint8) for a in (d[0], d[2], d[3], compute)])
    for quads, elements in zip(*results):
        np.testing.assert_array_equal(quads, elements)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_updates_refresh_the_compute_copy(rng, dtype):
    cases.sgd_update(BACKEND, rng, 300, 0.01, dtype)
    cases.momentum_update(BACKEND, rng, 300, True, dtype)
    cases.adam_update(BACKEND, rng, 300, 0.1, True, 3, dtype)


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_skipped_update_touches_nothing(rng, dtype):
    cases.skipped_update_touches_nothing(BACKEND, rng, 300, dtype)


# 1030: 257 quads on the simulator's 128 threads of reduce's grid, so threads with a second quad and one a third
@pytest.mark.parametrize("size, apply", [(1, True), (300, True), (1030, False), (1030, True),
                                         pytest.param(669_706, True, marks=pytest.mark.real_gpu)])
@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_sums_the_gradient_as_sum_of_squares(rng, size, apply, dtype):
    cases.adam_sums_the_gradient(BACKEND, rng, size, dtype, apply)


def test_prepare_then_record_is_finish_step(rng):
    cases.norm_later_is_finish_step(BACKEND, rng)


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_prepares_its_own_rules(rng, dtype):
    cases.adam_prepares_its_own_rules(BACKEND, rng, 37, dtype)


def test_finish_step_kernel_follows_the_shared_rules(rng):
    """The one-thread kernel and the NumPy backend run `step_state.finish_step`: same state after a
    finite window, a clipped one and an inf one."""
    table = np.linspace(1e-3, 1e-4, 5)
    host = {"state": np.zeros(SIZE), "norms": np.zeros(4)}
    host["state"][LOSS_SCALE], host["state"][LR_FACTOR] = 1024.0, 1.0
    device = {k: current.to_device(v) for k, v in host.items()}
    for partial_sum in (4.0 * 1024**2, 900.0 * 1024**2, np.inf):
        partials = np.zeros(reduce.PARTIALS, np.float32)
        partials[3] = partial_sum
        rules = (2.0, 0.9, 0.999, True, 2.0, 0.5, 2)  # max_norm, betas, fp16 scaling: growth, backoff, interval
        numpy_kernels.step_rules.finish_step(partials, host["state"], table, host["norms"], *rules)
        step_rules.finish_step(current.to_device(partials), device["state"], current.to_device(table), device["norms"],
                          *rules)
        np.testing.assert_array_equal(device["state"].copy_to_host(), host["state"])
    np.testing.assert_array_equal(device["norms"].copy_to_host(), host["norms"])
    np.testing.assert_allclose(host["norms"][:2], [2.0, 30.0])


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("rule", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_lane_updates_are_the_solo_updates_lane_by_lane(rng, rule, dtype):
    lane_cases.update_lanes(BACKEND, rng, rule, dtype)


def test_finish_step_lanes_is_finish_step_lane_by_lane(rng):
    lane_cases.finish_step_lanes(BACKEND, rng)


def test_norm_later_lanes_follow_each_lanes_own_path(rng):
    lane_cases.norm_later_lanes(BACKEND, rng)


def test_an_adam_lane_steps_rules_and_cursors_follow_each_lanes_own_path(rng):
    lane_cases.adam_step_lanes(BACKEND, rng)


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_lanes_sum_the_gradient_as_the_solo_update(rng, dtype):
    lane_cases.update_lanes(BACKEND, rng, "adam", dtype, sums=True)


def test_lane_launchers_reject_bad_arguments():
    param, active = current.to_device(np.zeros((2, 5), np.float32)), current.to_device(np.ones(2, np.int32))
    state = current.to_device(np.zeros((2, SIZE)))
    with pytest.raises(ValueError, match="hypers has shape"):
        optim.sgd_update_lanes(param, param, param, state, current.to_device(np.zeros((2, 2), np.float32)), active)
    with pytest.raises(ValueError, match="hypers must be float32"):
        optim.momentum_update_lanes(param, param, param, param, state, current.to_device(np.zeros((2, 3))), active)
    with pytest.raises(ValueError, match="state has shape"):
        optim.adam_update_lanes(param, param, param, param, param, state[:1],
                                current.to_device(np.zeros((2, 7), np.float32)), active)
    with pytest.raises(ValueError, match="hypers has shape"):
        step_rules.finish_step_lanes(param, state, state, state, current.to_device(np.zeros((2, 6))), active)
