"""NumPy softmax cross-entropy twin against the same float64 reference (the
shared cases live in `tests.kernel_cases`)."""

import pytest

from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

BACKEND = cases.numpy_backend()


@pytest.mark.parametrize("rows, classes", [(1, 1), (1, 10), (5, 3), (130, 10), (1000, 10)])
def test_softmax_cross_entropy(rng, rows, classes):
    cases.softmax_cross_entropy(BACKEND, rng, rows, classes)


def test_argmax_ties_go_to_the_first_max():
    cases.argmax_ties_go_to_the_first_max(BACKEND)


def test_numerically_stable_for_large_logits(rng):
    cases.numerically_stable_for_large_logits(BACKEND, rng)


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
@pytest.mark.parametrize("rows, classes", [(1, 10), (130, 10)])
def test_low_precision_and_a_loss_scale(rng, dtype, rows, classes):
    cases.softmax_cross_entropy(BACKEND, rng, rows, classes, dtype, loss_scale=2.0**16)


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_softmax_cross_entropy_lanes_is_the_solo_loss_lane_by_lane(rng, dtype):
    lane_cases.softmax_cross_entropy_lanes(BACKEND, rng, dtype)
