"""CUDA softmax cross-entropy against a float64 reference."""

import numpy as np
import pytest
from numba import cuda

from mlptrain.numba_kernels import loss
from tests import reference as ref

pytestmark = pytest.mark.gpu


def run(logits, labels, grad_scale, offset=0, extra=3):
    """Launch on poisoned outputs; row_loss/row_correct have `extra` spare slots."""
    rows, classes = logits.shape
    dlogits = cuda.to_device(np.full((rows, classes), np.nan, np.float32))
    row_loss = cuda.to_device(np.full(offset + rows + extra, np.nan, np.float32))
    row_correct = cuda.to_device(np.full(offset + rows + extra, -7, np.int32))
    loss.softmax_cross_entropy(cuda.to_device(logits), cuda.to_device(labels), dlogits, row_loss, row_correct,
                               offset, grad_scale)
    return dlogits.copy_to_host(), row_loss.copy_to_host(), row_correct.copy_to_host()


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


@pytest.mark.parametrize("rows, classes", [(1, 1), (1, 10), (5, 3), (130, 10)])
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
    logits, dlogits = cuda.to_device(np.zeros((4, 3), np.float32)), cuda.to_device(np.zeros((4, 3), np.float32))
    row_loss, row_correct = cuda.to_device(np.zeros(4, np.float32)), cuda.to_device(np.zeros(4, np.int32))
    int64_labels, labels = cuda.to_device(np.zeros(4, np.int64)), cuda.to_device(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="labels must be int32"):
        loss.softmax_cross_entropy(logits, int64_labels, dlogits, row_loss, row_correct, 0, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        loss.softmax_cross_entropy(logits, labels, dlogits, row_loss, row_correct, 1, 1.0)


@pytest.mark.real_gpu
def test_eval_sized_batch_on_the_gpu(rng):
    logits = (3 * rng.standard_normal((1000, 10))).astype(np.float32)
    labels = rng.integers(0, 10, 1000).astype(np.int32)
    check(logits, labels, 1.0 / 1000, offset=2000)
    first, second = run(logits, labels, 1e-3), run(logits, labels, 1e-3)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
