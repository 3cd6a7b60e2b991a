"""CUDA softmax cross-entropy against a float64 reference (the cases both
backends run live in `tests.kernel_cases`)."""

import numpy as np
import pytest

from mlptrain.backends.numba_kernels import current, loss
from tests import kernel_cases as cases
from tests import kernel_lane_cases as lane_cases

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


def run(logits, labels, grad_scale, offset=0, extra=3):
    return cases.softmax_cross_entropy_run(BACKEND, logits, labels, grad_scale, offset, extra)


@pytest.mark.parametrize("rows, classes", [(1, 1), (1, 10), (5, 3), (130, 10)])
def test_softmax_cross_entropy(rng, rows, classes):
    cases.softmax_cross_entropy(BACKEND, rng, rows, classes)


def test_argmax_ties_go_to_the_first_max():
    cases.argmax_ties_go_to_the_first_max(BACKEND)


def test_numerically_stable_for_large_logits(rng):
    cases.numerically_stable_for_large_logits(BACKEND, rng)


def test_bad_label_gives_nan_loss():
    logits = np.zeros((2, 3), np.float32)
    _, row_loss, _ = run(logits, np.array([1, 3], np.int32), 1.0)
    assert np.isfinite(row_loss[0]) and np.isnan(row_loss[1])


def test_bitwise_deterministic(rng):
    logits = (3 * rng.standard_normal((37, 10))).astype(np.float32)
    labels = rng.integers(0, 10, 37).astype(np.int32)
    first, second = run(logits, labels, 0.1), run(logits, labels, 0.1)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_launcher_rejects_bad_arguments():
    logits, dlogits = current.to_device(np.zeros((4, 3), np.float32)), current.to_device(np.zeros((4, 3), np.float32))
    row_loss, row_correct = current.to_device(np.zeros(4, np.float32)), current.to_device(np.zeros(4, np.int32))
    int64_labels, labels = current.to_device(np.zeros(4, np.int64)), current.to_device(np.zeros(4, np.int32))
    scale = current.to_device(np.ones(1))
    with pytest.raises(ValueError, match="labels must be int32"):
        loss.softmax_cross_entropy(logits, int64_labels, dlogits, row_loss, row_correct, 0, 1.0, scale)
    with pytest.raises(ValueError, match="do not fit"):
        loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, 1, 1.0, scale)
    with pytest.raises(ValueError, match="loss_scale must be float64"):
        loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, 0, 1.0, row_loss[:1])


@pytest.mark.real_gpu
def test_eval_sized_batch_on_the_gpu(rng):
    logits = (3 * rng.standard_normal((1000, 10))).astype(np.float32)
    labels = rng.integers(0, 10, 1000).astype(np.int32)
    cases.softmax_cross_entropy_check(BACKEND, logits, labels, 1.0 / 1000, offset=2000)
    first, second = run(logits, labels, 1e-3), run(logits, labels, 1e-3)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


LOW_PRECISION = pytest.mark.parametrize("dtype", cases.FORMATS[1:], ids=cases.FORMAT_IDS[1:])


@LOW_PRECISION
def test_low_precision_and_a_loss_scale(rng, dtype):
    """logits and dlogits in fp16 / bf16, the loss in float32; fp16's loss scale multiplies the gradient."""
    cases.softmax_cross_entropy(BACKEND, rng, 9, 10, dtype, loss_scale=2.0**16)


# lanes: packed trials, one launch for K lanes


@pytest.mark.parametrize("dtype", cases.FORMATS, ids=cases.FORMAT_IDS)
def test_softmax_cross_entropy_lanes_is_the_solo_loss_lane_by_lane(rng, dtype):
    lane_cases.softmax_cross_entropy_lanes(BACKEND, rng, dtype)


def test_lane_launcher_rejects_bad_arguments():
    logits = current.to_device(np.zeros((2, 4, 3), np.float32))
    labels, active = current.to_device(np.zeros((2, 4), np.int32)), current.to_device(np.ones(2, np.int32))
    rows, correct = current.to_device(np.zeros((2, 4), np.float32)), current.to_device(np.zeros((2, 4), np.int32))
    scale, cursor = current.to_device(np.ones((2, 1))), current.to_device(np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match="do not fit"):
        loss.softmax_cross_entropy_lanes(logits, labels, logits, rows, correct, 1, 1.0, scale, cursor, active)
    with pytest.raises(ValueError, match="loss_scale must be float64"):
        loss.softmax_cross_entropy_lanes(logits, labels, logits, rows, correct, 0, 1.0,
                                         current.to_device(np.ones((2, 1), np.float32)), cursor, active)
    with pytest.raises(ValueError, match="logits must be float32 or float16 or uint16"):
        loss.softmax_cross_entropy_lanes(current.to_device(np.zeros((2, 4, 3))), labels, logits, rows, correct, 0,
                                         1.0, scale, cursor, active)
    with pytest.raises(ValueError, match="labels has shape"):
        loss.softmax_cross_entropy_lanes(logits, current.to_device(np.zeros((2, 5), np.int32)), logits, rows, correct,
                                         0, 1.0, scale, cursor, active)
