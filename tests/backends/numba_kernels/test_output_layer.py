"""The output layer fused with its loss (`gemm.linear_forward_cross_entropy`, CUDA): the bits of the narrow
forward and the loss kernel launched apart (shared cases: `tests.kernel_output_layer_cases`)."""

import numpy as np
import pytest

from mlptrain.activation import RELU, TANH
from mlptrain.backends.numba_kernels import gemm_narrow
from tests import kernel_cases as cases
from tests import kernel_output_layer_cases as output_layer

pytestmark = pytest.mark.gpu

BACKEND = cases.numba_backend()


@pytest.mark.parametrize("shape, dtype", [
    ((9, 70, 10), np.float32),  # two blocks of rows, the second partly empty; K past two warps' worth
    ((5, 33, 3), np.uint16), ((3, 5, 1), np.float16),
    ((3, 520, 10), np.float32)])  # a row's K split over four warps
def test_fused_is_forward_then_loss(rng, shape, dtype):
    output_layer.fused_is_forward_then_loss(BACKEND, rng, shape, dtype)


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("shape, dtype, activation", [((9, 70, 10), np.float32, RELU), ((5, 33, 3), np.uint16, TANH),
                                                      ((3, 140, 16), np.float16, RELU)])
def test_the_input_gradient_in_the_launch_is_the_narrow_passes(monkeypatch, rng, fuse, shape, dtype, activation):
    """The layer's input gradient in the forward and loss's launch (FUSE_INPUT_GRADIENT) or in one of its own
    after it: the bits of linear_backward_input's narrow pass."""
    monkeypatch.setattr(gemm_narrow, "FUSE_INPUT_GRADIENT", fuse)
    output_layer.fused_is_forward_then_loss(BACKEND, rng, shape, dtype, activation=activation)


def test_refuses_a_wide_layer(rng):
    output_layer.refuses_a_wide_layer(BACKEND, rng)


@pytest.mark.real_gpu
@pytest.mark.parametrize("shape, dtype", [((128, 512, 10), np.float32), ((130, 784, 16), np.uint16),
                                          ((2048, 128, 10), np.float16)])
def test_fused_is_forward_then_loss_production_sizes(monkeypatch, rng, shape, dtype):
    output_layer.fused_is_forward_then_loss(BACKEND, rng, shape, dtype)
    monkeypatch.setattr(gemm_narrow, "FUSE_INPUT_GRADIENT", True)
    output_layer.fused_is_forward_then_loss(BACKEND, rng, shape, dtype, activation=RELU)


@pytest.mark.parametrize("shape, dtype, activation", [((5, 40, 10), np.float32, RELU), ((3, 140, 16), np.uint16, TANH)])
def test_packed_lanes_fused_output_layer_is_the_three_lane_launches(rng, shape, dtype, activation):
    """Packed lanes' output layer, loss and input gradient in one launch (`linear_forward_cross_entropy_lanes`): bit
    for bit the narrow forward, `softmax_cross_entropy_lanes` and the narrow input gradient launched apart, each lane
    with its own cursor and loss scale; an inactive lane's outputs untouched."""
    from mlptrain.activation import NONE
    from mlptrain.dtypes import to_float32

    lanes, (m, k, n), offset = 3, shape, 2
    be, gemm = BACKEND, BACKEND.kernels.gemm
    x, w, b, h = (cases.stored(cases.random(rng, lanes, *s), dtype)[0] for s in ((m, k), (k, n), (n,), (m, k)))
    labels = rng.integers(0, n, (lanes, m)).astype(np.int32)
    d = [be.to_device(a) for a in (x, w, b, labels, h)]
    scale = be.to_device(np.array([[8.0], [2.0], [0.5]]))
    cursor, active = be.to_device(np.array([[0], [3], [1]], np.int64)), be.to_device(np.array([1, 0, 1], np.int32))
    results = []
    for fused in (True, False):
        logits, dlogits, dx = (be.poisoned(s, dtype=dtype) for s in ((lanes, m, n), (lanes, m, n), (lanes, m, k)))
        row_loss, row_correct = be.poisoned((lanes, offset + m + 4)), be.poisoned((lanes, offset + m + 4), -100, np.int32)
        if fused:
            gemm.linear_forward_cross_entropy_lanes(*d[:3], logits, d[3], dlogits, row_loss, row_correct, offset, 0.25,
                                                    scale, cursor, active, (d[4], dx, activation))
        else:
            gemm.linear_forward(*d[:3], logits, NONE, "narrow", active=active)
            be.kernels.loss.softmax_cross_entropy_lanes(logits, d[3], dlogits, row_loss, row_correct, offset, 0.25,
                                                        scale, cursor, active)
            gemm.linear_backward_input(dlogits, d[1], d[4], dx, activation, "narrow", active=active)
        results.append([be.to_host(a) for a in (logits, dlogits, row_loss, row_correct, dx)])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    logits, dlogits, row_loss, row_correct, dx = results[0]
    assert np.isnan(to_float32(dx[1])).all() and not np.isnan(to_float32(dx[[0, 2]])).any()
    assert not np.isnan(to_float32(dlogits[[0, 2]])).any() and (row_correct[1] == -100).all()
    for lane, at in ((0, 0), (2, 1)):
        rows = slice(offset + at, offset + at + m)
        assert not np.isnan(row_loss[lane, rows]).any() and np.isnan(np.delete(row_loss[lane], np.r_[rows])).all()
