"""The output layer fused with its loss (`gemm.linear_forward_cross_entropy`), shared by both backends' GEMM
tests: the two launches' bits (`linear_forward` on the narrow engine, then `loss.softmax_cross_entropy`), which
their own cases check against the float64 references."""

import numpy as np
import pytest

from mlptrain.activation import NONE
from mlptrain.dtypes import to_float32
from tests.kernel_cases import random, stored


def fused_is_forward_then_loss(be, rng, shape, dtype, grad_scale=0.25, loss_scale=8.0, offset=3, at=2,
                               activation=None):
    """x (M, K) @ w (K, N) + b to logits and their loss, hit and gradient at rows offset + cursor[0] (`at`),
    on poisoned outputs: bit for bit the two launches', every row written, nothing outside them. With an
    `activation`, the layer's input gradient too (input_gradient: h (M, K) random), bit for bit a
    linear_backward_input on the narrow engine after them, every element written."""
    m, k, n = shape
    (x, _), (w, _), (b, _), (h, _) = (stored(random(rng, *s), dtype) for s in ((m, k), (k, n), (n,), (m, k)))
    labels = rng.integers(0, n, m).astype(np.int32)
    d = [be.to_device(a) for a in (x, w, b, labels, h)]
    scale, cursor, spare = be.to_device(np.array([loss_scale])), be.to_device(np.array([at], np.int64)), 4
    results = []
    for fused in (True, False):
        logits, dlogits = be.poisoned((m, n), dtype=dtype), be.poisoned((m, n), dtype=dtype)
        row_loss = be.poisoned(offset + at + m + spare)
        row_correct = be.poisoned(offset + at + m + spare, -100, np.int32)  # a miss writes -1 - its class
        dx = be.poisoned((m, k), dtype=dtype)
        if fused:
            be.kernels.gemm.linear_forward_cross_entropy(
                *d[:3], logits, d[3], dlogits, row_loss, row_correct, offset, grad_scale, scale, cursor,
                None if activation is None else (d[4], dx, activation))
        else:
            be.kernels.gemm.linear_forward(*d[:3], logits, NONE, "narrow")
            be.kernels.loss.softmax_cross_entropy(logits, d[3], dlogits, row_loss, row_correct, offset, grad_scale,
                                                  scale, cursor)
            if activation is not None:
                be.kernels.gemm.linear_backward_input(dlogits, d[1], d[4], dx, activation, "narrow")
        results.append([be.to_host(a) for a in (logits, dlogits, row_loss, row_correct, dx)])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    logits, dlogits, row_loss, row_correct, dx = results[0]
    assert (activation is None) == np.isnan(to_float32(dx)).all()  # poisoned where no input gradient was asked
    rows = slice(offset + at, offset + at + m)
    assert not np.isnan(to_float32(logits)).any() and not np.isnan(to_float32(dlogits)).any()
    assert not np.isnan(row_loss[rows]).any() and (row_correct[rows] != -100).all()
    assert np.isnan(row_loss[:rows.start]).all() and np.isnan(row_loss[rows.stop:]).all()


def refuses_a_wide_layer(be, rng):
    """More classes than the narrow engine takes: refused before any launch, as linear_forward refuses them."""
    n = be.kernels.gemm.NARROW_MOST + 1
    x, w, b = (be.to_device(random(rng, *s)) for s in ((3, 5), (5, n), (n,)))
    with pytest.raises(ValueError, match="narrow engine"):
        be.kernels.gemm.linear_forward_cross_entropy(
            x, w, b, be.poisoned((3, n)), be.to_device(np.zeros(3, np.int32)), be.poisoned((3, n)), be.poisoned(3),
            be.poisoned(3, -7, np.int32), 0, 1.0, be.to_device(np.ones(1)))
