"""NumPy softmax cross-entropy twin against the same float64 reference."""

import numpy as np
import pytest

from mlptrain.numpy_kernels import loss
from tests import reference as ref


def run(logits, labels, grad_scale, offset=0, extra=3):
    rows, classes = logits.shape
    dlogits = np.full((rows, classes), np.nan, np.float32)
    row_loss = np.full(offset + rows + extra, np.nan, np.float32)
    row_correct = np.full(offset + rows + extra, -7, np.int32)
    loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, grad_scale)
    return dlogits, row_loss, row_correct


def check(logits, labels, grad_scale, offset=0):
    rows = logits.shape[0]
    dlogits, row_loss, row_correct = run(logits, labels, grad_scale, offset)
    expected_loss, expected_correct, expected_grad = ref.softmax_cross_entropy(logits, labels, grad_scale)
    spread = np.abs(logits - logits.max(axis=1, keepdims=True)).max(axis=1)
    ref.assert_within(row_loss[offset:offset + rows], expected_loss, 2e-6 * (1 + spread + np.log(logits.shape[1])))
    np.testing.assert_array_equal(row_correct[offset:offset + rows], expected_correct)
    ref.assert_within(dlogits, expected_grad, 1e-6 * abs(grad_scale))
    assert np.isnan(row_loss[:offset]).all() and np.isnan(row_loss[offset + rows:]).all()
    assert (row_correct[:offset] == -7).all() and (row_correct[offset + rows:] == -7).all()


@pytest.mark.parametrize("rows, classes", [(1, 1), (1, 10), (5, 3), (130, 10), (1000, 10)])
def test_softmax_cross_entropy(rng, rows, classes):
    logits = (3 * rng.standard_normal((rows, classes))).astype(np.float32)
    labels = rng.integers(0, classes, rows).astype(np.int32)
    check(logits, labels, grad_scale=1.0 / (2 * rows), offset=4)


def test_argmax_ties_go_to_the_first_max():
    logits = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 5, 1, 5], [4, 4, 0, 0]], np.float32)
    labels = np.array([2, 0, 1, 1], np.int32)
    _, _, row_correct = run(logits, labels, 1.0)
    np.testing.assert_array_equal(row_correct[:4], [0, 1, 1, 0])
    check(logits, labels, 1.0)


def test_numerically_stable_for_large_logits(rng):
    logits = (1000 + rng.standard_normal((6, 10))).astype(np.float32)
    logits[1] -= 2000
    labels = rng.integers(0, 10, 6).astype(np.int32)
    check(logits, labels, 0.25)
