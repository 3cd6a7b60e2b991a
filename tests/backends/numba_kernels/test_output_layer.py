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
