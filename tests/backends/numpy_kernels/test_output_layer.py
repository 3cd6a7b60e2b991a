"""The output layer fused with its loss (`gemm.linear_forward_cross_entropy`, NumPy): the two calls' bits, as
on the CUDA backend (shared cases: `tests.kernel_output_layer_cases`)."""

import numpy as np
import pytest

from mlptrain.activation import RELU
from tests import kernel_cases as cases
from tests import kernel_output_layer_cases as output_layer

BACKEND = cases.numpy_backend()


@pytest.mark.parametrize("shape, dtype", [((9, 70, 10), np.float32), ((5, 33, 3), np.uint16),
                                          ((3, 5, 1), np.float16)])
def test_fused_is_forward_then_loss(rng, shape, dtype):
    output_layer.fused_is_forward_then_loss(BACKEND, rng, shape, dtype)


def test_the_input_gradient_with_it_is_the_narrow_pass(rng):
    output_layer.fused_is_forward_then_loss(BACKEND, rng, (9, 70, 10), np.float32, activation=RELU)


def test_refuses_a_wide_layer(rng):
    output_layer.refuses_a_wide_layer(BACKEND, rng)
