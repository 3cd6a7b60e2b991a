"""NumPy optimizer twins against the same float64 references (the shared cases
live in `tests.kernel_cases`)."""

import pytest

from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

BACKEND = cases.numpy_backend()
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


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_updates_refresh_the_compute_copy(rng, dtype):
    cases.sgd_update(BACKEND, rng, 300, 0.01, dtype)
    cases.momentum_update(BACKEND, rng, 300, True, dtype)
    cases.adam_update(BACKEND, rng, 300, 0.1, True, 3, dtype)


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_skipped_update_touches_nothing(rng, dtype):
    cases.skipped_update_touches_nothing(BACKEND, rng, 300, dtype)


@pytest.mark.parametrize("size, apply", [(1, True), (300, True), (1030, False)])
@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_sums_the_gradient_as_sum_of_squares(rng, size, apply, dtype):
    cases.adam_sums_the_gradient(BACKEND, rng, size, dtype, apply)


def test_prepare_then_record_is_finish_step(rng):
    cases.norm_later_is_finish_step(BACKEND, rng)


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_adam_prepares_its_own_rules(rng, dtype):
    cases.adam_prepares_its_own_rules(BACKEND, rng, 37, dtype)


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
