"""NumPy convolution twins against the same float64 references as the CUDA
kernels (cases in `tests.reference_conv`), over awkward shapes (N, H, W, Cin,
Cout), kernel sizes 1, 3 and 5 and every storage format; plus an exact
finite-difference check that the backward passes are the forward pass's
gradient."""

import numpy as np
import pytest

from mlptrain.activation import NONE, RELU
from mlptrain.backends.numpy_kernels import conv, im2col, reduce
from tests import kernel_cases
from tests import reference as ref
from tests import reference_conv as cases

BACKEND = kernel_cases.numpy_backend()
SHAPES = [(1, 5, 7, 3, 5), (2, 3, 4, 6, 9), (3, 1, 1, 2, 1), (1, 4, 5, 17, 33), (2, 6, 3, 1, 4)]
SIZES = [1, 3, 5]


@pytest.mark.parametrize("dtype", cases.STORAGE)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shape", SHAPES)
def test_conv2d_forward(rng, shape, size, activation, dtype):
    cases.forward_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("dtype", cases.STORAGE)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shape", SHAPES)
def test_conv2d_backward_input(rng, shape, size, activation, dtype):
    cases.backward_input_case(BACKEND, rng, shape, size, activation, dtype)


@pytest.mark.parametrize("dtype", cases.STORAGE)
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shape", SHAPES)
def test_conv2d_backward_weight(rng, shape, size, beta, dtype):
    cases.backward_weight_case(BACKEND, rng, shape, size, beta, dtype)


@pytest.mark.parametrize("column_bytes", [1, 1200])
def test_batches_in_chunks_of_images(rng, monkeypatch, column_bytes):
    """im2col columns of one image at a time, or of two (an image's are
    2 x 4 pixels x 9 taps x 2 channels x 4 bytes = 576 bytes): every chunk
    lands where it belongs."""
    monkeypatch.setattr(im2col, "COLUMN_BYTES", column_bytes)
    assert len(im2col.image_chunks(np.zeros((3, 2, 4, 2), np.float32), 3)) == (3 if column_bytes == 1 else 2)
    cases.forward_case(BACKEND, rng, (3, 2, 4, 2, 3), 3, RELU, np.float32)
    cases.backward_input_case(BACKEND, rng, (3, 2, 4, 2, 3), 3, RELU, np.uint16)
    for beta in (0.0, 1.0):
        cases.backward_weight_case(BACKEND, rng, (3, 2, 4, 2, 3), 3, beta, np.float32)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_gradient_is_reduce_bias_backward(rng, beta):
    cases.bias_gradient_case(BACKEND, rng, (2, 5, 7, 6), beta)


def test_an_empty_batch_still_applies_beta():
    dw = np.full((3, 3, 2, 4), np.nan, np.float32)
    conv.conv2d_backward_weight(np.zeros((0, 5, 5, 2), np.float32), np.zeros((0, 5, 5, 4), np.float32), dw, 0.0, None)
    np.testing.assert_array_equal(dw, 0.0)
    assert conv.conv2d_backward_weight_workspace((256, 32, 32, 3), (3, 3, 3, 256), np.float32) == 0


def test_outputs_must_be_contiguous(rng):
    y = np.zeros((1, 4, 4, 10), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        conv.conv2d_forward(np.zeros((1, 4, 4, 3), np.float32), np.zeros((3, 3, 3, 5), np.float32),
                            np.zeros(5, np.float32), y, RELU)


# --- the backward passes are the gradient of the forward pass, exactly ---------------

STEP = 2.0**-8


def two_layers(x, w1, b1, w2, b2):
    """(h1, y): h1 = relu(conv(x, w1) + b1), y = conv(h1, w2) + b2, float32."""
    h1 = np.empty(x.shape[:3] + (w1.shape[3],), np.float32)
    y = np.empty(x.shape[:3] + (w2.shape[3],), np.float32)
    conv.conv2d_forward(x, w1, b1, h1, RELU)
    conv.conv2d_forward(h1, w2, b2, y, NONE)
    return h1, y


def gradients(x, w1, b1, w2, b2, r):
    """d(sum r * y) / d(x, w1, b1, w2, b2) through the backward kernels."""
    h1, _ = two_layers(x, w1, b1, w2, b2)
    dz1, dx = np.empty_like(h1), np.empty_like(x)
    dw1, db1, dw2, db2 = (np.empty_like(p) for p in (w1, b1, w2, b2))
    conv.conv2d_backward_weight(h1, r, dw2, 0.0, None)
    reduce.bias_backward(r.reshape(-1, r.shape[3]), db2, 0.0)
    conv.conv2d_backward_input(r, w2, h1, dz1, RELU)
    conv.conv2d_backward_weight(x, dz1, dw1, 0.0, None)
    reduce.bias_backward(dz1.reshape(-1, dz1.shape[3]), db1, 0.0)
    conv.conv2d_backward_input(dz1, w1, x, dx, NONE)
    return dx, dw1, db1, dw2, db2


def test_gradients_match_central_differences_exactly(rng):
    """Integer inputs, half-integer b1 and steps of 2**-8 keep every float32
    product and sum exact (at most 21 significant bits here), and keep z1 at
    least 0.5 from ReLU's kink while a step moves it by at most 0.15: the
    loss is linear over each central difference, which is therefore exact, as
    are the gradients. Exact equality checks every index of every pass."""
    n, h, w, c0, c1, c2 = 2, 4, 5, 2, 3, 2
    integers = lambda *shape: rng.integers(-2, 3, shape).astype(np.float32)  # noqa: E731
    params = [integers(n, h, w, c0), integers(3, 3, c0, c1), integers(c1) + 0.5, integers(3, 3, c1, c2), integers(c2)]
    r = integers(n, h, w, c2)
    loss = lambda ps: float((r.astype(np.float64) * two_layers(*ps)[1]).sum())  # noqa: E731
    for index, grad in enumerate(gradients(*params, r)):
        direction = rng.integers(-1, 2, params[index].shape).astype(np.float32)
        moved = [[p + sign * STEP * direction if i == index else p for i, p in enumerate(params)] for sign in (1, -1)]
        difference = (loss(moved[0]) - loss(moved[1])) / (2 * STEP)
        assert difference == float((grad.astype(np.float64) * direction).sum()), f"parameter {index}"
